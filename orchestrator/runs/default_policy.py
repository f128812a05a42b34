"""The permission requests a run's default policy rejected because it was given no policy.

With no policy (none given to the run, none named by its steps or agents) every permission
request, and every terminal command the policy vets, is answered by the ``default`` rule:
rejected. An agent that asked to edit then changes nothing, and its run still succeeds. A run
counts those rejections (:class:`DefaultRejections`, the result's ``defaultRejections``), so
that whoever reads the result is told why nothing happened.

A policy that was given and whose rules decide nothing rejects under a rule named after it
(``run/rules.toml: default``): that policy says what it means, and is not counted. A resumed
run reuses the instances an earlier attempt finished, with their recorded decisions: their
rejections are counted apart, as a policy given to the resume cannot change them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from attrs import field, frozen

from ..policy import DEFAULT_RULE

__all__ = ["DefaultRejections", "count_default_rejections"]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@frozen
class DefaultRejections:
    """How many permission requests the ``default`` rule rejected because no policy was given."""

    #: the requests rejected, in the whole run
    count: int = 0
    #: the same, by step key (``prompt``, ``compare[NAME]``, ``STEP`` or ``STEP[INSTANCE]``);
    #: keys with none are left out
    steps: Mapping[str, int] = field(factory=dict)
    #: of :attr:`count`, those in instances an earlier attempt of the run recorded and the
    #: latest attempt (a resume) reused: they keep their result whatever the resume's policy
    reused: int = 0
    #: some steps or agents of the run name a policy of their own: the rejected requests are
    #: those of the others, and of a run given none
    scoped: bool = False

    @property
    def fresh(self) -> int:
        """The rejections of the latest attempt itself (a policy given now would decide them)."""
        return self.count - self.reused

    @property
    def message(self) -> str | None:
        """One sentence saying what happened, for people; None when nothing was rejected."""
        if not self.count:
            return None
        what = "permission request was" if self.count == 1 else "permission requests were"
        said = f"{self.count} {what} rejected by the default policy"
        if not self.fresh:
            return (
                f"{said} in steps reused from an earlier attempt of the run, which was given no"
                " policy; they keep their recorded result (a new run asks again)"
            )
        said += f" ({self._why()})"
        if self.reused:
            said += f"; {self.reused} of them in steps reused from an earlier attempt of the run"
        return said

    def _why(self) -> str:
        if not self.scoped:
            return "no policy was given"
        # sorted: the order of the counts is the order the instances happened to finish in
        steps = sorted({k.partition("[")[0] for k in self.steps})
        if steps == ["compare"]:  # a comparison's one step: its agents are what differ
            names = sorted(k[len("compare[") : -1] for k in self.steps if k.startswith("compare["))
            kind = "agent" if len(names) == 1 else "agents"
        else:
            names, kind = steps, "step" if len(steps) == 1 else "steps"
        return f"no policy was given to the run, nor to {kind} {', '.join(names)}"

    def to_json(self) -> dict[str, Any]:
        """The result's ``defaultRejections`` object."""
        return {
            "count": self.count,
            "steps": dict(self.steps),
            "reused": self.reused,
            "scoped": self.scoped,
        }

    @classmethod
    def from_json(cls, data: Any) -> DefaultRejections:
        """Read a result's ``defaultRejections`` (missing or malformed: none)."""
        if not isinstance(data, Mapping):
            return cls()
        steps = data.get("steps")
        counts = {
            str(k): _count(v)
            for k, v in (steps.items() if isinstance(steps, Mapping) else ())
            if _count(v)
        }
        total = _count(data.get("count"))
        reused = min(_count(data.get("reused")), total)
        return cls(total, counts, reused, data.get("scoped") is True)


def count_default_rejections(
    records: Iterable[Mapping[str, Any]],
    options: Mapping[str, Any],
    started: Mapping[str, float] | None = None,
) -> DefaultRejections:
    """The rejections by the ``default`` rule among a run's audit ``records`` (as the run store
    keeps them, each with its ``stepKey``) that no policy was given for.

    ``options`` are the run's recorded options: ``policy`` is how the run's policy was given
    (None: not at all), ``attempt`` when its latest resume started and with which policy,
    ``graph`` names the policies its steps name and ``settings.agents`` those its agents name.
    ``started`` is when each instance (by step key) last started: an instance that started
    before the latest resume was reused by it, and the records of an instance older than its
    last start are of an attempt that was run again (not counted).
    """
    graph = options.get("graph") or {}
    steps = {n.get("name") for n in graph.get("nodes") or () if n.get("policy")}
    settings = options.get("settings") or {}
    agents = {k for k, spec in (settings.get("agents") or {}).items() if spec.get("policy")}
    attempt = options.get("attempt") or {}
    since = attempt.get("started")
    first_policy = options.get("policy")
    latest_policy = attempt.get("policy") if "started" in attempt else first_policy
    counts: dict[str, int] = {}
    reused = 0
    began = started or {}
    for r in records:
        if r.get("rule") != DEFAULT_RULE or r.get("verdict") != "reject":
            continue
        key = str(r.get("stepKey") or r.get("step") or "")
        when = float(r.get("time") or 0)
        last = began.get(key)
        if last is not None and when < last:
            continue
        # runs recorded before a given policy's own end had a name of its own said
        # ``default`` for it too: a request of a step, an agent or a run given a policy is
        # never counted
        if r.get("step") in steps or r.get("agent") in agents:
            continue
        earlier = isinstance(since, int | float) and when < since
        if (first_policy if earlier else latest_policy) is not None:
            continue
        counts[key] = counts.get(key, 0) + 1
        reused += earlier
    scoped = bool(counts) and bool(steps or agents)
    return DefaultRejections(sum(counts.values()), counts, reused, scoped)
