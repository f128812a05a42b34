"""The count of permission requests a run's default policy rejected, as a value.

A light module of its own: the reports read it from a result without importing the run
engine (:mod:`orchestrator.runs.default_policy` counts it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import field, frozen

__all__ = ["DefaultRejections"]


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
