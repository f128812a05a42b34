"""A budget several runs share (the runs of a batch): tokens, cost and seconds.

What counts is what agents report in ACP ``usage_update`` session updates: ``used`` (tokens)
and ``cost.amount``. A session's reports are cumulative, so a session counts once, with the
highest figures it reported (its latest, for an agent that reports as ACP says; an agent whose
``used`` shrinks, as a context window does when compacted, gives nothing back). The budget's
totals are the sums over every session of every run that shares it. The token counts of a
prompt response (``PromptResponse.usage``, unstable in ACP, per turn or per session depending
on the agent) are not counted: counted too, the same tokens would count twice.

A limit is spent when its total goes over it (``tokens > max_tokens``, ``cost > max_cost``),
or when ``max_seconds`` have passed since :meth:`RunBudget.start` (trio's clock). Once spent,
a budget stays spent. A run given a budget then starts no new step instance: one that gets its
slot after (or whose agent would get its first prompt after) is recorded ``skipped``, error
kind ``budget``, and its step fails; a resume runs it. No new round of a ``check=`` loop
starts either: the instance fails with kind ``budget``. Running turns finish
(``on_spent="finish"``: recorded as usual) or are cancelled the ACP way (``"cancel"``: the
instance fails, kind ``budget``, what the turn did so far kept), the turn whose own report
spent the budget included.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Literal

import trio
from attrs import define, field

from ..errors import UsageError

__all__ = [
    "ON_SPENT",
    "NotStarted",
    "RunBudget",
    "RunMeters",
    "UsageMeter",
    "over_limit",
    "spent_text",
]

#: what running turns do once a budget is spent
ON_SPENT = ("finish", "cancel")


class NotStarted(Exception):
    """An agent step's first turn was not sent: the run's budget is spent (``spent`` says how).

    Raised by the agent step to the instance that runs it, which records itself skipped; never
    seen outside the runner."""

    def __init__(self, spent: str) -> None:
        super().__init__(spent)
        self.spent = spent


@define(eq=False)
class UsageMeter:
    """Tokens and cost of sessions: the sum over sessions of the highest figures each reported.

    Cost is summed exactly (as fractions of the reported floats) and read rounded once. A
    session :meth:`settle` is given no longer takes room here: its figures join the totals.
    """

    #: the highest figures of each session not settled yet: tokens, cost
    _tokens: dict[object, int] = field(init=False, factory=dict)
    _costs: dict[object, Fraction] = field(init=False, factory=dict)
    #: the totals over every session (settled or not); None until one reported any
    _token_total: int | None = field(init=False, default=None)
    _cost_total: Fraction | None = field(init=False, default=None)

    def observe(self, session: object, used: int | None, cost: float | None) -> None:
        """``session`` reported ``used`` tokens and ``cost`` so far (None: not reported).

        A figure below what the session reported before changes nothing; a negative, or a cost
        that is not a finite number, is ignored (an agent's report is not trusted).
        """
        if isinstance(used, int) and not isinstance(used, bool) and used >= 0:
            before = self._tokens.get(session, 0)
            if used > before or session not in self._tokens:
                self._tokens[session] = used
                self._token_total = (self._token_total or 0) + used - before
        number = isinstance(cost, int | float) and not isinstance(cost, bool)
        if number and math.isfinite(cost) and cost >= 0:  # type: ignore[arg-type,operator]
            amount = Fraction(cost)  # type: ignore[arg-type]
            spent = self._costs.get(session, Fraction(0))
            if amount > spent or session not in self._costs:
                self._costs[session] = amount
                self._cost_total = (self._cost_total or Fraction(0)) + amount - spent

    def settle(self, session: object) -> None:
        """``session`` ended: its figures stay in the totals, and it is forgotten here."""
        self._tokens.pop(session, None)
        self._costs.pop(session, None)

    @property
    def tokens(self) -> int | None:
        """The tokens of every session; None when none reported any."""
        return self._token_total

    @property
    def cost(self) -> float | None:
        """The cost of every session; None when none reported any."""
        return None if self._cost_total is None else float(self._cost_total)

    def to_json(self) -> dict[str, Any]:
        """``{"tokens": int | None, "cost": float | None}``."""
        return {"tokens": self.tokens, "cost": self.cost}


@define(eq=False)
class RunMeters:
    """The usage of every session (:attr:`total`) and of each run's sessions apart."""

    total: UsageMeter = field(factory=UsageMeter)
    _runs: dict[str, UsageMeter] = field(factory=dict)

    def observe(
        self, session: object, used: int | None, cost: float | None, run: str | None
    ) -> None:
        """``session`` (of ``run``, if given) reported its cumulative usage."""
        self.total.observe(session, used, cost)
        if run is not None:
            meter = self._runs.get(run)
            if meter is None:
                meter = self._runs[run] = UsageMeter()
            meter.observe(session, used, cost)

    def settle(self, session: object, run: str | None) -> None:
        """``session`` ended: its figures stay counted; it takes no more room here."""
        self.total.settle(session)
        meter = self._runs.get(run) if run is not None else None
        if meter is not None:
            meter.settle(session)

    def usage(self, run: str) -> dict[str, Any]:
        """``{"tokens": int | None, "cost": float | None}`` of ``run``'s sessions (None:
        nothing reported)."""
        meter = self._runs.get(run)
        return meter.to_json() if meter is not None else {"tokens": None, "cost": None}


def over_limit(
    meter: UsageMeter,
    max_tokens: int | None,
    max_cost: float | None,
    max_seconds: float | None,
    elapsed: float | None,
) -> str | None:
    """The first limit ``meter``'s totals (or ``elapsed`` seconds) are over: ``tokens``,
    ``cost``, ``time``; None while within them all."""
    tokens, cost = meter.tokens, meter.cost
    if max_tokens is not None and tokens is not None and tokens > max_tokens:
        return "tokens"
    if max_cost is not None and cost is not None and cost > max_cost:
        return "cost"
    if max_seconds is not None and elapsed is not None and elapsed >= max_seconds:
        return "time"
    return None


def spent_text(
    cause: str,
    meter: UsageMeter,
    max_tokens: int | None,
    max_cost: float | None,
    max_seconds: float | None,
    elapsed: float | None,
) -> str:
    """How the limit ``cause`` (from :func:`over_limit`) was spent, with the figures now:
    ``tokens: 10234 used of 10000``, ``cost: 1.02 of 1.00``, ``time: 60 s of 60 s``."""
    if cause == "tokens":
        return f"tokens: {meter.tokens} used of {max_tokens}"
    if cause == "cost":
        assert meter.cost is not None and max_cost is not None
        return f"cost: {_amount(meter.cost)} of {_amount(max_cost)}"
    assert elapsed is not None and max_seconds is not None
    return f"time: {_seconds(elapsed)} s of {max_seconds:g} s"


def _amount(value: float) -> str:
    """A cost for people: two decimals, more when they would hide it (0.0034)."""
    text = f"{value:.2f}"
    return text if float(text) == value else f"{value:.6g}"


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}"


def _not_negative(name: str, value: float | None, *, whole: bool = False) -> None:
    if value is None:
        return
    kind = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "a whole number" if whole else "a number"
        raise UsageError(f"a budget's {name} must be {what}, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"a budget's {name} must be a finite number, 0 or more, not {value!r}")


@define(eq=False)
class RunBudget:
    """Limits on tokens, cost and seconds shared by runs (see the module docstring).

    Give the same budget to every run that shares it (``run_pipeline(..., _budget=)``); a
    budget without limits only counts (:meth:`usage` of each run, :meth:`statistics`). Use it
    within one trio run: its clock is trio's.
    """

    max_tokens: int | None = None
    max_cost: float | None = None
    max_seconds: float | None = None
    #: what running turns do once it is spent: ``finish``, or ``cancel`` (ACP session/cancel)
    on_spent: Literal["finish", "cancel"] = "finish"
    #: every session's figures, and each run's
    _meters: RunMeters = field(init=False, factory=RunMeters)
    #: trio's clock when the budget started, None before
    _started: float | None = field(init=False, default=None)
    #: the limit that was spent first (tokens, cost, time), None while within
    _cause: str | None = field(init=False, default=None)
    #: where :meth:`wait_spent` waits
    _waiting: trio.lowlevel.ParkingLot = field(init=False, factory=trio.lowlevel.ParkingLot)

    def __attrs_post_init__(self) -> None:
        _not_negative("max_tokens", self.max_tokens, whole=True)
        _not_negative("max_cost", self.max_cost)
        _not_negative("max_seconds", self.max_seconds)
        if self.on_spent not in ON_SPENT:
            raise UsageError(
                f"a budget's on_spent must be 'finish' or 'cancel', not {self.on_spent!r}"
            )

    def check_within(self) -> None:
        """Raise :class:`NotStarted` if the budget is spent."""
        spent = self.spent
        if spent is not None:
            raise NotStarted(spent)

    def start(self) -> None:
        """Start the clock of ``max_seconds`` (the first call does; later ones change nothing)."""
        if self._started is None:
            self._started = trio.current_time()
            self._waiting.unpark_all()  # their deadline is known now

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called."""
        return self._started is not None

    def _elapsed(self) -> float | None:
        return None if self._started is None else trio.current_time() - self._started

    def _over(self) -> str | None:
        """The first limit over now (tokens, cost, time), or None."""
        return over_limit(
            self._meters.total, self.max_tokens, self.max_cost, self.max_seconds, self._elapsed()
        )

    @property
    def spent(self) -> str | None:
        """None while within the limits; once one is spent (for good), one line that says
        which, with the figures now: ``tokens: 10234 used of 10000``, ``cost: 1.02 of 1.00``,
        ``time: 60 s of 60 s``. The limit named is the one spent first."""
        if self._cause is None:
            self._cause = self._over()
            if self._cause is None:
                return None
            self._waiting.unpark_all()
        return spent_text(
            self._cause,
            self._meters.total,
            self.max_tokens,
            self.max_cost,
            self.max_seconds,
            self._elapsed(),
        )

    def observe(
        self, session: object, used: int | None, cost: float | None, *, run: str | None = None
    ) -> None:
        """``session`` (any object that stands for one session, compared by identity or
        equality) reported its cumulative usage: ``used`` tokens, ``cost`` (``cost.amount``);
        None: not reported. It counts with the highest figures it reported, in the totals and
        in ``run``'s (a run id; see :meth:`usage`). Waiters of :meth:`wait_spent` wake when
        this spends the budget."""
        self._meters.observe(session, used, cost, run)
        if self._cause is None:
            self.spent  # noqa: B018 -- notes the cause and wakes the waiters

    def settle(self, session: object, *, run: str | None = None) -> None:
        """``session`` ended: its figures stay counted; it takes no more room here."""
        self._meters.settle(session, run)

    async def wait_spent(self) -> None:
        """Return once the budget is spent: a total went over its limit, or the time since
        :meth:`start` passed ``max_seconds`` (right away if it is spent already)."""
        while self.spent is None:
            deadline = math.inf
            if self._started is not None and self.max_seconds is not None:
                deadline = self._started + self.max_seconds
            with trio.move_on_at(deadline):
                await self._waiting.park()

    def usage(self, run: str) -> dict[str, Any]:
        """What the sessions of run ``run`` used, as they reported it through this budget:
        ``{"tokens": int | None, "cost": float | None}`` (None: nothing reported). Attempts of
        a run (a resume) given the same budget add up."""
        return self._meters.usage(run)

    def statistics(self) -> dict[str, Any]:
        """The limits, the totals so far and whether it is spent: ``maxTokens``, ``maxCost``,
        ``maxSeconds``, ``onSpent``, ``tokens``, ``cost``, ``seconds`` (since :meth:`start`,
        None before), ``spent`` (see :attr:`spent`)."""
        elapsed = self._elapsed()
        return {
            "maxTokens": self.max_tokens,
            "maxCost": self.max_cost,
            "maxSeconds": self.max_seconds,
            "onSpent": self.on_spent,
            "tokens": self._meters.total.tokens,
            "cost": self._meters.total.cost,
            "seconds": None if elapsed is None else round(elapsed, 3),
            "spent": self.spent,
        }
