"""How the hot-time account's windows are cut into kept hours and stretches counted each pass
(``reconcilers.account_blocks``): pure arithmetic, no Prometheus (tests/test_reconcilers.py
counts the same windows both ways against a real one)."""

from __future__ import annotations

from array import array
from itertools import pairwise

import pytest

from reconcilers.account_blocks import LATE_SECONDS, SETTLE_SECONDS, Kept, plan_blocks

DAY = 86400.0


@pytest.mark.parametrize("step", [300, 60, 15, 2, 9, 7200])
# 1_800_000_450: an hour settles one step from now (at 300 s steps).
@pytest.mark.parametrize("at", [1_800_000_000.0, 1_800_000_149.9, 1_800_000_150.0, 1_800_000_450.0, 1_800_001_234.5,
                                1_799_999_999.0])
@pytest.mark.parametrize("windows", [[DAY, 7 * DAY], [7 * DAY, DAY]])  # in whatever order they come
def test_each_window_is_its_hours_and_stretches_exactly_each_edge_between_two_steps(step, at, windows):
    plan = plan_blocks(windows, at, step)
    assert plan is not None
    # Ends at the last moment between two steps before ``at``: no step after it is left out.
    assert at - step < plan.now <= at and plan.now % step == step // 2
    # A block is the whole number of steps nearest an hour, one step where a step is longer.
    assert plan.block % step == 0 and (abs(plan.block - 3600) <= step / 2 or plan.block == step)
    # Only settled hours are kept.
    assert plan.now - SETTLE_SECONDS - plan.block < plan.boundary(plan.last) <= plan.now - SETTLE_SECONDS
    for window, (first, stretches) in zip(windows, plan.windows, strict=True):
        pieces = sorted([(plan.boundary(i), plan.boundary(i + 1)) for i in range(first, plan.last)]
                        + [plan.stretches[i] for i in stretches])
        # Back to back, from a window back from now to now: each step in exactly one piece.
        assert pieces[0][0] == plan.now - window and pieces[-1][1] == plan.now
        assert all(a[1] == b[0] for a, b in pairwise(pieces))
        assert all(edge % step == step // 2 for piece in pieces for edge in piece)
        assert all(end - start < plan.block + SETTLE_SECONDS + step for start, end in pieces)
        # Counted on every pass: no more than the part of an hour at the window's start.
        assert all(end - start < plan.block for start, end in (plan.stretches[i] for i in stretches) if end != plan.now)
    assert plan.first == min(first for first, _ in plan.windows)
    assert len(set(plan.stretches)) == len(plan.stretches) and all(end > start for start, end in plan.stretches)


def test_windows_that_cannot_be_cut_between_steps_are_counted_whole():
    assert plan_blocks([DAY], 1_800_000_000.0, 1) is None, "no second between two steps"
    assert plan_blocks([DAY], 1_800_000_000.0, 2.5) is None
    assert plan_blocks([DAY + 100], 1_800_000_000.0, 300) is None, "not a whole number of steps"
    # A window with no settled hour in it: nothing to keep.
    assert plan_blocks([1800], 1_800_000_000.0, 300) is None
    short = plan_blocks([1800, DAY], 1_800_000_000.0, 300)
    assert short is not None and short.windows[0] == (short.last, (0,))
    assert short.stretches[0] == (short.now - 1800, short.now)
    # Half an hour that spans an hour's edge but holds no settled hour is one stretch still.
    spanning = plan_blocks([1800, DAY], 1_800_000_900.0, 300)
    assert spanning is not None and spanning.windows[0] == (spanning.last, (0,))
    assert spanning.stretches[0] == (spanning.now - 1800, spanning.now)


def test_kept_hours_serve_while_they_are_counted_against_the_same_real_allocatable():
    plan = plan_blocks([DAY, 7 * DAY], 1_800_000_000.0, 300)
    assert plan is not None
    kept = Kept(4e9, plan.first - 2, array("d", range(plan.last - plan.first + 1)))
    # Its counts reach the hour before the newest: that one alone is missing.
    assert kept.missing_from(4e9, plan) == plan.last - 1
    assert kept.missing_from(8e9, plan) == plan.first, "another real allocatable: counted whole"
    assert Kept(4e9, plan.first + 1, array("d", [1.0])).missing_from(4e9, plan) == plan.first, "starts too late"
    assert Kept(4e9, plan.first, array("d", [1.0])).missing_from(4e9, plan) == plan.first + 1, "starts in time"
    newer = kept.extended(plan, plan.last - 1, [1000.0])
    # The two hours no window reaches any more are dropped; the rest followed by the new one.
    assert newer.first == plan.first and len(newer.counts) == plan.last - plan.first
    assert newer.counts[0] == 2.0 and newer.counts[-1] == 1000.0
    assert newer.total(plan.last - 1, plan.last) == 1000.0
    assert newer.total(plan.first, plan.last) == sum(range(2, plan.last - plan.first + 1)) + 1000.0
    assert newer.total(plan.first, plan.first + 2) == 5.0
    # Read again from the first block a window reaches, or from the first kept: all replaced.
    assert list(kept.extended(plan, plan.first, [7.0]).counts) == [7.0]
    assert list(newer.extended(plan, plan.first, [7.0, 8.0]).counts) == [7.0, 8.0]
    with pytest.raises(ValueError, match=f"counts from block {plan.first - 1} do not follow those kept from "
                                         f"{plan.first - 2}"):
        kept.extended(plan, plan.first - 1, [1.0])  # a block no window reaches any more


def test_a_recent_block_short_of_steps_with_a_sample_after_it_is_read_again_and_its_count_replaced():
    """A block short of steps may have been kept before its samples reached the store (a
    remote-write sender cut off from it): while it ended less than LATE_SECONDS ago and a sample
    came after it, it is read again, its count and every newer one replaced. An older one stays
    as kept, and so do short blocks with nothing after them (the node's end, until a sample comes)."""
    plan = plan_blocks([DAY, 7 * DAY], 1_800_000_000.0, 300)
    assert plan is not None
    # The blocks read again ended less than LATE_SECONDS ago; the one before them, earlier.
    assert plan.first < plan.late < plan.last - 2
    assert plan.boundary(plan.late) <= plan.now - LATE_SECONDS < plan.boundary(plan.late + 1)
    full = 12

    def kept(**steps: float) -> Kept:
        """Blocks of ``full`` steps (a count is its steps here) but those named by their offset
        from plan.late (``late_1``: the next, ``before``: the one before it)."""
        offsets = {"before": -1} | {f"late_{i}": i for i in range(plan.last - plan.late)}
        counts = array("d", [float(full)] * (plan.last - plan.first))
        for name, count in steps.items():
            counts[plan.late + offsets[name] - plan.first] = count
        return Kept(4e9, plan.first, counts)

    def first_short(blocks: Kept, sampled_since: bool = False) -> int | None:
        return blocks.first_short(plan, int, full, sampled_since)

    assert first_short(kept()) is None
    assert first_short(kept(before=5), sampled_since=True) is None, "ended more than LATE_SECONDS ago"
    assert first_short(kept(late_1=0)) == plan.late + 1, "full blocks after it"
    assert first_short(kept(late_1=0, late_2=7)) == plan.late + 1
    # Short up to the last block: read again only once the node has a sample since.
    trailing = kept(**{f"late_{i}": 0 for i in range(1, plan.last - plan.late)})
    assert first_short(trailing) is None and first_short(trailing, sampled_since=True) == plan.late + 1
    # A node that joined in the last hours: its blocks before its first sample (and the one it
    # joined in, short) are not read again; a gap after them is.
    joined = Kept(4e9, plan.first, array("d", [0.0] * (plan.last - plan.first - 2) + [5.0, full]))
    assert first_short(joined, sampled_since=True) is None
    joined.counts[-1] = 3.0
    assert first_short(joined, sampled_since=True) == plan.last - 1
    # One step is a sample: after a gap, and before one.
    gap_then_one = kept(**{f"late_{i}": 0 for i in range(1, plan.last - plan.late - 1)}, **{
        f"late_{plan.last - plan.late - 1}": 1})
    assert first_short(gap_then_one) == plan.late + 1
    one_then_gap = Kept(4e9, plan.first, array("d", [0.0] * (plan.late - plan.first - 1) + [1.0]
                                                + [0.0] * (plan.last - plan.late - 1) + [full]))
    assert first_short(one_then_gap) == plan.late
    blocks = kept(late_1=0, late_2=7)
    again = blocks.extended(plan, plan.late + 1, [full, 30.0])
    assert again.counts[:plan.late + 1 - plan.first] == blocks.counts[:plan.late + 1 - plan.first]
    assert list(again.counts[plan.late + 1 - plan.first:]) == [full, 30.0]
    with pytest.raises(ValueError, match="do not follow"):
        blocks.extended(plan, plan.last + 1, [full])
