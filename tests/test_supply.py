"""Tests for orchestrator.pipeline._supply: copy a tree afresh, or wait for a used directory."""

from __future__ import annotations

import pytest

from orchestrator.pipeline._supply import (
    BUSY,
    MARGIN,
    CpuUse,
    Decision,
    TreeUse,
    decide,
    fresh_copies,
)


def test_nothing_in_use_copies() -> None:
    """With no directory of the tree in use or being made, nothing would come back: copy."""
    assert decide([], 0, 10, None, None) == Decision(True)
    assert decide([], 0, 10, 0.1, 5.0).copy


def test_first_copy_under_way_is_waited_for() -> None:
    """While the tree's first copy is made, the others wait for it, without a deadline."""
    assert decide([], 1, 10, None, None) == Decision(False, None)


def test_unknown_hold_waits_as_long_as_a_copy_takes() -> None:
    """Before any directory came back, wait until the oldest use is as old as a copy takes."""
    assert decide([0.5], 0, 4, None, 2.0) == Decision(False, 1.5)
    assert decide([2.0], 0, 4, None, 2.0).copy
    assert decide([3.0, 0.1], 0, 4, None, 2.0).copy


def test_short_turns_keep_few_directories() -> None:
    """Turns much shorter than a copy: the queue is served by the directories there are."""
    # 15 branches of 0.2 s on one directory: 3 s of work, under MARGIN copies of 2.5 s
    assert decide([0.1], 0, 15, 0.2, 2.5) == Decision(False, 2.5)


def test_a_long_queue_gets_another_directory() -> None:
    """When the queued work exceeds MARGIN copies, another directory is copied."""
    assert decide([0.1], 0, 63, 0.2, 2.5).copy
    # once it is under way, the two directories share the queue
    assert not decide([0.1], 1, 40, 0.2, 2.5).copy


def test_long_turns_copy_for_every_waiter() -> None:
    """Turns longer than a copy (real agents): every waiting branch gets its own copy."""
    assert decide([5.0], 0, 1, 60.0, 2.5).copy
    assert decide([5.0, 1.0, 0.2], 0, 2, 60.0, 2.5).copy


def test_a_directory_held_longer_than_usual_counts_as_such() -> None:
    """The usual hold is raised to the shortest current one: a stuck queue gets a copy."""
    assert not decide([1.0], 0, 7, 0.2, 2.5).copy
    assert decide([9.0], 0, 7, 0.2, 2.5).copy


@pytest.mark.parametrize("demand", [0, 1])
def test_the_deciding_branch_counts_at_least_once(demand: int) -> None:
    """A branch deciding is demand itself, even when the count passed is lower."""
    hold, copy = 10.0, 1.0
    assert decide([0.0], 0, demand, hold, copy).copy == (hold > MARGIN * copy)


def test_tree_use_estimates_follow_what_it_saw() -> None:
    """Holds and copies are smoothed running figures; handing and returning track directories."""
    use = TreeUse()
    use.copied(2.0)
    assert use.copy == 2.0
    use.copied(4.0)
    assert use.copy is not None and 2.0 < use.copy < 4.0
    use.handed("/d1", 10.0)
    use.waiting = 3
    waiting = use.decide(10.5, 0)
    assert not waiting.copy and waiting.recheck == pytest.approx(use.copy - 0.5)
    use.returned("/d1", 10.5)
    assert use.hold is None and not use.held  # the first back started the agent
    use.handed("/d1", 10.5)
    use.returned("/d1", 10.7)
    assert use.hold == pytest.approx(0.2) and not use.held
    use.returned("/unknown", 11.0)  # never handed out: nothing to learn
    assert use.hold == pytest.approx(0.2)


def test_fresh_copies_is_at_least_one() -> None:
    """At least one fresh copy may run, whatever the machine."""
    assert fresh_copies() >= 1


def test_a_busy_process_copies_no_more() -> None:
    """While directories are in use and the run's process uses a CPU, no copy is made."""
    # the queue alone would copy (see above)
    assert decide([0.1], 0, 63, 0.2, 2.5).copy
    assert decide([0.1], 0, 63, 0.2, 2.5, busy=BUSY - 0.1).copy
    assert decide([0.1], 0, 63, 0.2, 2.5, busy=BUSY) == Decision(False, 2.5)
    # nothing in use or being made: a copy all the same (nothing would come back)
    assert decide([], 0, 63, 0.2, 2.5, busy=1.5).copy


def test_one_return_is_not_yet_a_usual_hold() -> None:
    """The first directory back (its turn started the agent) leaves the wait-a-copy rule on."""
    use = TreeUse()
    use.copied(2.0)
    use.waiting = 60
    use.handed("/d1", 10.0)
    use.returned("/d1", 10.4)
    use.handed("/d1", 10.4)
    # one return: the queue rule would copy (60 x 0.4 s > 3 copies) but waits as a copy takes
    waiting = use.decide(10.5, 0)
    assert not waiting.copy and waiting.recheck == pytest.approx(1.9)
    use.returned("/d1", 10.8)
    use.handed("/d1", 10.8)
    assert use.decide(10.9, 0).copy


def test_cpu_use_is_sampled_over_spans_without_copies() -> None:
    """The CPUs used are measured over spans of at least the window, restarted after a copy."""
    cpu = CpuUse(window=0.1)
    assert cpu.sample(0.0, 0.0) is None  # the first mark
    assert cpu.sample(0.05, 0.05) is None  # too short a span
    assert cpu.sample(0.2, 0.2) == pytest.approx(1.0)
    cpu.restart(5.0, 9.0)  # a copy took 8.8 s of CPU meanwhile: not a sample
    assert cpu.sample(6.0, 9.5) == pytest.approx(1.0 + 0.3 * (0.5 - 1.0))
