"""The hot-time account's counts, kept between passes in whole hours.

Counted whole, a week's account evaluates each node's usage at all of the week's 2,016 steps on
every pass, though all but the last few were counted the pass before: it was half of a
full-size pass's Prometheus time (docs/performance.md). Each window is cut here into *blocks*,
whole hours that have settled, counted once and kept per node (:data:`KeptCounts`), and at
most two *stretches*, the part of an hour at the window's start and the unsettled time up to
now, counted on every pass (:func:`plan_blocks`). The windows are exactly what they were: the
same steps, each counted once, only not again.

A subquery's steps fall on multiples of its step since the epoch, and a step on a window's
start is counted in it by Prometheus 2 (2.42 here) and not by VictoriaMetrics, nor by Prometheus
3, whose ranges are left-open (its release notes). Every edge
here, blocks', stretches' and windows', lies half a step between two steps, so each step belongs
to one piece whichever store answers.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oversale.settings import Settings

BLOCK_SECONDS = 3600.0
"""A block's length (rounded to whole steps): a week is 168 of them, a pass adds one or none."""

SETTLE_SECONDS = 600.0
"""How long after its end a block is counted and kept. A step's value comes from samples at or
before it, and a sample is stored once its scrape ends (at most a scrape timeout later) or a
recording rule's evaluation runs; a remote-written store may lag a few minutes more. A sample
that arrives later than this for a block already kept is read only where the block is short
of steps (:data:`LATE_SECONDS`)."""

LATE_SECONDS = Settings.prometheus_late_seconds
"""How long a kept block short of steps is read again, on every pass, for samples that reach the
store late, by default (``OVERSALE_PROMETHEUS_LATE_SAMPLES``). A remote-write sender cut off
from its store (Prometheus in agent mode, or one forwarding to Thanos, Mimir or VictoriaMetrics)
buffers what it scrapes and sends it, in order, once it reaches the store again; Prometheus's
write-ahead log holds about 2 hours. Meanwhile the store has no sample for those steps, so the
blocks kept then are short of steps, not of hot ones: read again once the samples are in, a node
that ran hot through the outage is counted so. Only a block with samples on both sides is read
again (:meth:`Kept.first_short`): until one comes after them, a node's short blocks are its end
(its exporter down, or still cut off), and those before its first sample are before it joined,
neither worth a query each pass. One short for longer is kept as it is."""


@dataclass(frozen=True)
class BlockPlan:
    """Where one pass's windows, all ending at ``now``, are cut. Block ``i`` is the time from
    :meth:`boundary` ``(i)`` (excluded) to ``boundary(i + 1)``; the blocks ``first`` to
    ``last - 1`` are the ones some window covers whole and that have settled."""

    now: float
    step: float
    block: float
    offset: float
    first: int
    last: int
    late: int
    """The first block still read again where it is short of steps (:data:`LATE_SECONDS`)."""
    stretches: tuple[tuple[float, float], ...]
    """The times (start excluded, end included) counted on every pass."""
    windows: tuple[tuple[int, tuple[int, ...]], ...]
    """Each window: its first block (its blocks run to ``last``) and its stretches' indices."""

    def boundary(self, index: int) -> float:
        return index * self.block + self.offset


def plan_blocks(windows: Sequence[float], at: float, step: float, block: float = BLOCK_SECONDS,
                settle: float = SETTLE_SECONDS, late: float = LATE_SECONDS) -> BlockPlan | None:
    """The blocks and stretches of ``windows`` (seconds) ending at the last half-step before
    ``at``, at subquery steps of ``step`` seconds; None where they cannot be cut on half steps
    (a step that is not a whole number of seconds, at least 2, or a window not a whole number of
    steps) or no window covers a settled block (the caller counts each window whole).

    >>> plan = plan_blocks([86400, 7 * 86400], at=1_800_000_000.0, step=300)
    >>> plan.now, plan.last - plan.first  # the half step before, and 167 settled hours
    (1799999850.0, 167)
    >>> [(end - start) / 60 for start, end in plan.stretches]  # minutes
    [5.0, 55.0, 5.0]
    >>> plan.windows  # the day: its 23 hours, the stretch up to now and its first 5 minutes
    ((499976, (1, 0)), (499832, (1, 2)))
    >>> plan.last - plan.late  # the kept blocks that ended less than 3 hours ago
    3
    """
    if step < 2 or step != round(step) or any(window / step != round(window / step) for window in windows):
        return None
    size, offset = step * max(1, round(block / step)), float(step // 2)
    now = math.floor((at - offset) / step) * step + offset
    last = math.floor((now - settle - offset) / size)
    stretches: list[tuple[float, float]] = []

    def stretch(start: float, end: float) -> int:
        if (start, end) not in stretches:
            stretches.append((start, end))
        return stretches.index((start, end))

    per_window: list[tuple[int, tuple[int, ...]]] = []
    for window in windows:
        start = now - window
        first = math.ceil((start - offset) / size)
        if first >= last:
            per_window.append((last, (stretch(start, now),)))
            continue
        parts = [] if start == first * size + offset else [stretch(start, first * size + offset)]
        per_window.append((first, (stretch(last * size + offset, now), *parts)))
    covered = [first for first, _ in per_window if first < last]
    if not covered:
        return None
    first = min(covered)
    # Block i ends at boundary(i + 1): read again while that is less than ``late`` ago.
    recent = min(last, max(first, math.floor((now - late - offset) / size)))
    return BlockPlan(now, step, size, offset, first, last, recent, tuple(stretches), tuple(per_window))


@dataclass(frozen=True)
class Kept:
    """One node's counts of one resource per block from ``first``, against ``threshold``."""

    threshold: float
    first: int
    counts: array[float]

    def missing_from(self, threshold: float, plan: BlockPlan) -> int:
        """The first of the plan's blocks this does not hold (``plan.last``: none); all of them
        where it was counted against another real allocatable or starts too late."""
        if threshold != self.threshold or self.first > plan.first:
            return plan.first
        return max(plan.first, self.first + len(self.counts))

    def first_short(self, plan: BlockPlan, steps_of: Callable[[float], int], full: int,
                    sampled_since: bool) -> int | None:
        """The first block this holds from ``plan.late`` on with fewer than ``full`` steps
        (``steps_of`` a count) and samples on both sides: in an earlier block, and in a later
        block or, ``sampled_since``, since the last (:data:`LATE_SECONDS`); None where there is
        none. Short blocks before a node's first sample are before it joined, and those with no
        sample after them its end (its exporter down, or cut off from the store) until one comes:
        neither is read again meanwhile."""
        base = max(plan.late, self.first)
        steps = [steps_of(count) for count in self.counts[base - self.first:]]
        sampled = [base + index for index, n in enumerate(steps) if n > 0]
        # Most nodes' oldest block has samples: a look at one block.
        earlier = any(steps_of(count) > 0 for count in self.counts[:base - self.first])
        after = self.first + len(self.counts) if sampled_since else (sampled[-1] if sampled else base)
        before = base if earlier else (sampled[0] + 1 if sampled else after)
        return next((index for index in range(before, after) if steps[index - base] < full), None)

    def extended(self, plan: BlockPlan, first: int, counts: Sequence[float]) -> Kept:
        """These counts up to block ``first``, followed by ``counts`` (read from ``first``:
        :meth:`missing_from` or :meth:`first_short`), without the blocks before ``plan.first``
        (no window reaches them any more)."""
        if not self.first <= first <= self.first + len(self.counts) or first < plan.first:
            raise ValueError(f"counts from block {first} do not follow those kept from {self.first}")
        return Kept(self.threshold, plan.first,
                    self.counts[plan.first - self.first:first - self.first] + array("d", counts))

    def total(self, first: int, last: int) -> float:
        return math.fsum(self.counts[first - self.first:last - self.first])


KeptCounts = dict[tuple[str, str], Kept]
"""(resource, node) -> its kept counts."""
