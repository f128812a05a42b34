"""The permission requests a run's default policy rejected because it was given no policy.

With no policy (none given to the run, none named by its steps or agents) every permission
request, and every terminal command the policy vets, is answered by the ``default`` rule:
rejected. An agent that asked to edit then changes nothing, and its run still succeeds. A run
counts those rejections (:class:`DefaultRejections`, the result's ``defaultRejections``), so
that whoever reads the result is told why nothing happened.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from attrs import field, frozen

from ..policy import DEFAULT_RULE

__all__ = ["DefaultRejections", "count_default_rejections"]


@frozen
class DefaultRejections:
    """How many permission requests the ``default`` rule rejected because no policy was given.

    Requests rejected by the ``default`` rule of a policy that was given (a file whose rules
    match nothing) are not counted: that policy says what it means.
    """

    #: the requests rejected, in the whole run
    count: int = 0
    #: the same, by step key (``prompt``, ``compare[NAME]``, ``STEP`` or ``STEP[INSTANCE]``);
    #: keys with none are left out
    steps: Mapping[str, int] = field(factory=dict)

    @property
    def message(self) -> str | None:
        """One sentence saying what happened, for people; None when nothing was rejected."""
        if not self.count:
            return None
        what = "permission request was" if self.count == 1 else "permission requests were"
        return f"{self.count} {what} rejected by the default policy (no policy was given)"

    def to_json(self) -> dict[str, Any]:
        """The result's ``defaultRejections`` object."""
        return {"count": self.count, "steps": dict(self.steps)}

    @classmethod
    def from_json(cls, data: Any) -> DefaultRejections:
        """Read a result's ``defaultRejections`` (missing or malformed: none)."""
        if not isinstance(data, Mapping):
            return cls()
        steps = data.get("steps")
        counts = {
            str(k): v
            for k, v in (steps.items() if isinstance(steps, Mapping) else ())
            if isinstance(v, int) and not isinstance(v, bool) and v > 0
        }
        count = data.get("count")
        total = count if isinstance(count, int) and not isinstance(count, bool) else 0
        return cls(total, counts)


def count_default_rejections(
    records: Iterable[Mapping[str, Any]], options: Mapping[str, Any]
) -> DefaultRejections:
    """The rejections by the ``default`` rule among a run's audit ``records`` (as the run store
    keeps them, each with its ``stepKey``) that no policy was given for.

    ``options`` are the run's recorded options: ``policy`` is how the run's policy was given
    (None: not at all), ``graph`` names the policies its steps name and ``settings.agents``
    those its agents name. A request of a step or an agent that names a policy was answered by
    that policy, whichever rule decided.
    """
    if options.get("policy") is not None:
        return DefaultRejections()
    graph = options.get("graph") or {}
    steps = {n.get("name") for n in graph.get("nodes") or () if n.get("policy")}
    settings = options.get("settings") or {}
    agents = {k for k, spec in (settings.get("agents") or {}).items() if spec.get("policy")}
    counts: dict[str, int] = {}
    for r in records:
        if r.get("rule") != DEFAULT_RULE or r.get("verdict") != "reject":
            continue
        if r.get("step") in steps or r.get("agent") in agents:
            continue
        key = str(r.get("stepKey") or r.get("step") or "")
        counts[key] = counts.get(key, 0) + 1
    return DefaultRejections(sum(counts.values()), counts)
