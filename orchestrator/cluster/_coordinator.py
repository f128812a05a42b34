"""The run's shared state on a cluster: one budget, one request rate per agent, one claim per key.

:class:`Coordinator` is plain Python with sync methods, picklable arguments and results, and
no trio: the cluster code makes it a Ray actor (``ray.remote(Coordinator)``), one per run, with
one call at a time (Ray's default for a sync actor), so it needs no locks. Every node asks it
before a prompt goes out; the figures it keeps are the same the one-machine budget keeps
(:class:`~orchestrator.pipeline._budget.UsageMeter`), and its texts are those of
:attr:`~orchestrator.pipeline._budget.RunBudget.spent`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from attrs import frozen

from ..errors import UsageError
from ..pipeline._budget import RunMeters, _not_negative, over_limit, spent_text

__all__ = ["Coordinator", "Rate", "parse_rate"]

#: a unit of a rate, in seconds
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: ``COUNT/[N]UNIT``: "5/s", "30/m", "2/10s", "1/1.5h"
_RATE = re.compile(r"(\d+)/(\d+(?:\.\d+)?)?([smh])")


#: the slowest rate taken: one request a day
MAX_INTERVAL = 86_400.0


@frozen
class Rate:
    """At most ``count`` requests every ``per`` seconds, evenly spaced."""

    #: how many requests
    count: int
    #: in how many seconds
    per: float

    def __attrs_post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise UsageError(
                f"a rate's count must be a whole number, 1 or more, not {self.count!r}"
            )
        per = self.per
        if isinstance(per, bool) or not isinstance(per, int | float) or not math.isfinite(per):
            raise UsageError(f"a rate's period must be a number of seconds, not {per!r}")
        if per <= 0:
            raise UsageError(f"a rate's period must be more than 0 seconds, not {per!r}")
        if per / self.count > MAX_INTERVAL:  # a typo, surely: the run would wait for days
            raise UsageError(f"a rate of {self} is slower than one request a day")

    @property
    def interval(self) -> float:
        """The seconds between two grants."""
        return self.per / self.count

    def __str__(self) -> str:
        return f"{self.count}/{self.per:g}s"


def parse_rate(text: str) -> Rate:
    """A rate written as ``COUNT/UNIT`` or ``COUNT/N UNIT`` without the space: ``5/s``, ``30/m``,
    ``100/h``, ``2/10s`` (units: s, m, h). Anything else: :class:`UsageError` naming it."""
    match = _RATE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise UsageError(
            f"not a rate: {text!r} (write COUNT/UNIT or COUNT/N UNIT: 5/s, 30/m, 100/h, 2/10s)"
        )
    count, number, unit = match.groups()
    per = (float(number) if number is not None else 1.0) * _UNITS[unit]
    if int(count) < 1 or per <= 0:
        raise UsageError(f"not a rate: {text!r} (the count and the period must be more than 0)")
    return Rate(int(count), per)


class Coordinator:
    """One run's budget (tokens, cost, seconds), request rates by agent and idempotency claims,
    shared by every node of a cluster (see the module docstring).

    ``clock`` gives seconds (monotonic); the actor keeps the default, tests pass a fake one.
    """

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        max_seconds: float | None = None,
        rates: Mapping[str, Rate] = {},  # never mutated: copied below
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _not_negative("max_tokens", max_tokens, whole=True)
        _not_negative("max_cost", max_cost)
        _not_negative("max_seconds", max_seconds)
        for agent, rate in rates.items():
            if not isinstance(rate, Rate):
                raise UsageError(f"the rate of {agent!r} is not a rate: {rate!r}")
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.max_seconds = max_seconds
        self._rates: dict[str, Rate] = dict(rates)
        self._clock = clock
        self._meters = RunMeters()
        self._started: float | None = None
        #: the limit spent first (tokens, cost, time), None while within: spent stays spent
        self._cause: str | None = None
        #: by agent: the clock's time before which no grant is given
        self._next: dict[str, float] = {}
        #: by agent: grants given, refusals answered
        self._granted: dict[str, int] = {}
        self._refused: dict[str, int] = {}
        #: idempotency key -> the owner that claimed it first
        self._claims: dict[str, str] = {}
        self._claims_refused = 0

    # -- budget

    def start(self) -> None:
        """Start the clock of ``max_seconds`` (the first call does; later ones change nothing)."""
        if self._started is None:
            self._started = self._clock()

    def _elapsed(self) -> float | None:
        return None if self._started is None else self._clock() - self._started

    def spent(self) -> str | None:
        """None while within the limits; once one is spent (for good), one line that says
        which, with the figures now (the texts of ``RunBudget.spent``): ``tokens: 10234 used
        of 10000``, ``cost: 1.02 of 1.00``, ``time: 60 s of 60 s``."""
        limits = (self.max_tokens, self.max_cost, self.max_seconds, self._elapsed())
        if self._cause is None:
            self._cause = over_limit(self._meters.total, *limits)
            if self._cause is None:
                return None
        return spent_text(self._cause, self._meters.total, *limits)

    def observe(
        self, session: str, used: int | None, cost: float | None, run: str | None = None
    ) -> str | None:
        """``session`` reported its cumulative usage (``used`` tokens, ``cost``; None: not
        reported), counted with the highest figures it reported, in the totals and in
        ``run``'s. Returns :meth:`spent` after it."""
        self._meters.observe(session, used, cost, run)
        return self.spent()

    def settle(self, session: str, run: str | None = None) -> None:
        """``session`` ended: its figures stay counted; it takes no more room here."""
        self._meters.settle(session, run)

    def usage(self, run: str) -> dict[str, Any]:
        """What the sessions of ``run`` used: ``{"tokens": int | None, "cost": float | None}``."""
        return self._meters.usage(run)

    # -- request rate

    def take(self, agent: str) -> float:
        """Ask to send one request to ``agent`` now: 0.0 when granted (and counted), else the
        seconds to wait before asking again (nothing is reserved by a refusal). Grants of an
        agent with a rate are evenly spaced, ``rate.per / rate.count`` seconds apart at least
        (no burst beyond one); an agent without a rate is always granted."""
        rate = self._rates.get(agent)
        if rate is None:
            self._granted[agent] = self._granted.get(agent, 0) + 1
            return 0.0
        now = self._clock()
        due = self._next.get(agent)
        if due is not None and now < due:
            self._refused[agent] = self._refused.get(agent, 0) + 1
            return due - now
        # a bucket of one token: the next grant is one interval after this one, however long
        # the agent was idle (no saved-up burst); grant k is never before first + k * interval
        self._next[agent] = now + rate.interval
        self._granted[agent] = self._granted.get(agent, 0) + 1
        return 0.0

    # -- idempotency

    def claim(self, key: str, owner: str) -> bool:
        """Whether ``owner`` holds ``key`` now: True for the first claim of it and for the same
        owner again; False when another owner claimed it first (the work is that owner's)."""
        holder = self._claims.setdefault(key, owner)
        if holder != owner:
            self._claims_refused += 1
            return False
        return True

    def holder(self, key: str) -> str | None:
        """Who claimed ``key``; None: nobody (the work it stands for was never begun)."""
        return self._claims.get(key)

    def statistics(self) -> dict[str, Any]:
        """The budget (``maxTokens``, ``maxCost``, ``maxSeconds``, ``tokens``, ``cost``,
        ``seconds`` since :meth:`start` or None, ``spent``), the rates (``rates``: by agent,
        ``rate``, ``granted``, ``refused``; agents without a rate show ``rate`` None) and the
        claims (``claims``: held, ``claimsRefused``)."""
        elapsed = self._elapsed()
        agents = sorted(set(self._rates) | set(self._granted) | set(self._refused))
        rates = {
            agent: {
                "rate": str(self._rates[agent]) if agent in self._rates else None,
                "granted": self._granted.get(agent, 0),
                "refused": self._refused.get(agent, 0),
            }
            for agent in agents
        }
        return {
            "maxTokens": self.max_tokens,
            "maxCost": self.max_cost,
            "maxSeconds": self.max_seconds,
            "tokens": self._meters.total.tokens,
            "cost": self._meters.total.cost,
            "seconds": None if elapsed is None else round(elapsed, 3),
            "spent": self.spent(),
            "rates": rates,
            "claims": len(self._claims),
            "claimsRefused": self._claims_refused,
        }
