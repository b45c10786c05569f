"""A node's usage quantile over a sliding window, from the few samples it may still read.

Asked as ``quantile_over_time`` on every pass, a week's node quantile evaluates each node's usage
at all of the week's 2,016 steps, though all but the last few were evaluated the pass before:
after the account kept its hours, the two node quantiles were most of a full-size pass's
Prometheus time (docs/performance.md). A window's quantile reads only its highest samples: of
``n`` samples, the ``q`` quantile interpolates between the values ranked ``floor(q x (n - 1))``
and the next (Prometheus's ``quantile_over_time``, :func:`prometheus_quantile`), so it reads the
top ``n - floor(q x (n - 1))`` of them (22 of 2,017 for P99). A sample that has that many later
samples at least as high is read by no window that ends now or later, since each such window
holds those later samples too: it can be dropped for good (:class:`SampleKeeper`). What stays is
a few times the top count on usage that moves up and down (about 120 for P99 over a week), and
every sample where usage only falls, never more than the window's own samples.

The samples are evaluated by a range query at the window's steps (the same points its subquery
evaluates), once each after they have settled (:data:`~reconcilers.account_blocks.SETTLE_SECONDS`);
the ones not yet settled are read again on every pass and never kept. The count ``n`` comes
from runs of consecutive steps with a sample, kept whole (:class:`KeptSamples`): a node has one
run unless its exporter was down, or its samples reached the store late (a remote-write sender
cut off from it): those are read again and added while recent (:meth:`KeptSamples.with_late`).
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field


def top_needed(quantile: float, most: int) -> int:
    """How many of a window's highest samples its ``quantile`` reads, at most, where the window
    holds at most ``most`` samples (fewer samples never need more).

    >>> top_needed(0.99, 2017), top_needed(0.5, 2017), top_needed(1.0, 2017)
    (22, 1009, 1)
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {quantile!r}")
    return max(1, most - math.floor(quantile * (most - 1)))


def prometheus_quantile(quantile: float, highest: Sequence[float], samples: int) -> float:
    """The ``quantile`` of ``samples`` values as Prometheus's ``quantile_over_time`` gives it
    (rank ``q x (n - 1)``, linear between the two values around it), from ``highest``: at least
    the :func:`top_needed` highest of them, highest first.

    >>> prometheus_quantile(0.5, [4.0, 3.0, 2.0, 1.0], 4), prometheus_quantile(0.9, [10.0, 1.0], 2)
    (2.5, 9.1)
    """
    rank = quantile * (samples - 1)
    lower = max(0, math.floor(rank))
    upper = min(samples - 1, lower + 1)
    if samples - lower > len(highest):
        raise ValueError(f"the {quantile} quantile of {samples} samples reads the highest {samples - lower}, "
                         f"not {len(highest)}")
    weight = rank - math.floor(rank)
    return highest[samples - 1 - lower] * (1 - weight) + highest[samples - 1 - upper] * weight


@dataclass
class KeptSamples:
    """One series' settled samples that a window ending now or later may still read: their
    steps (step numbers since the epoch, ascending) and values, and ``runs``, the first and last
    step of each run of consecutive steps with a sample (flat pairs, ascending), which count the
    samples of any window, dropped ones included."""

    steps: array[int] = field(default_factory=lambda: array("q"))
    values: array[float] = field(default_factory=lambda: array("d"))
    runs: array[int] = field(default_factory=lambda: array("q"))

    def count(self, first: int, last: int) -> int:
        """The samples at steps ``first`` to ``last``."""
        return sum(max(0, min(self.runs[i + 1], last) - max(self.runs[i], first) + 1)
                   for i in range(0, len(self.runs), 2))

    def from_step(self, first: int) -> KeptSamples:
        """The samples at ``first`` and after (the window's start moved on)."""
        if not self.runs or self.runs[0] >= first:
            return self
        at = next((i for i, step in enumerate(self.steps) if step >= first), len(self.steps))
        runs = array("q")
        for i in range(0, len(self.runs), 2):
            if self.runs[i + 1] >= first:
                runs.extend((max(self.runs[i], first), self.runs[i + 1]))
        return KeptSamples(self.steps[at:], self.values[at:], runs)

    def first_missing(self, first: int, last: int) -> int | None:
        """The first step from ``first`` to ``last`` with no sample; None where each has one.

        >>> KeptSamples(runs=array("q", [3, 5, 8, 9])).first_missing(4, 9), KeptSamples().first_missing(1, 0)
        (6, None)
        """
        at = first
        for i in range(0, len(self.runs), 2):
            if self.runs[i] > at:
                break
            at = max(at, self.runs[i + 1] + 1)
        return at if at <= last else None

    def with_late(self, steps: Sequence[int], values: Sequence[float], needed: int) -> KeptSamples:
        """These samples and ``steps``' (ascending) at the steps that had none, each kept while
        fewer than ``needed`` later samples are at least as high (as :class:`SampleKeeper`
        keeps them), its runs joined. Every later sample at least as high as a late one is kept
        (one that was dropped had ``needed`` later samples as high, and so has the late one),
        so counting the kept ones decides it; a kept sample a late one now outranks stays kept,
        which costs memory, not exactness."""
        late = [(step, value) for step, value in zip(steps, values, strict=True) if not self.count(step, step)]
        if not late:
            return self
        held = dict(zip(self.steps, self.values, strict=True))
        for step, value in reversed(late):  # newest first: each counts as later for the older ones
            if sum(1 for at, other in held.items() if at > step and other >= value) < needed:
                held[step] = value
        spans = sorted([(self.runs[i], self.runs[i + 1]) for i in range(0, len(self.runs), 2)]
                       + [(step, step) for step, _ in late])
        runs: list[int] = []
        for start, end in spans:
            if runs and start <= runs[-1] + 1:
                runs[-1] = max(runs[-1], end)
            else:
                runs += [start, end]
        ordered = sorted(held.items())
        return KeptSamples(array("q", [at for at, _ in ordered]), array("d", [value for _, value in ordered]),
                           array("q", runs))

    def quantile(self, quantile: float, first: int, last: int, fresh: Sequence[tuple[int, float]] = ()) -> float | None:
        """The ``quantile`` of the samples at steps ``first`` to ``last``: those kept, and
        ``fresh`` (step, value) pairs after the last kept step (not settled, never kept). None
        where there is none."""
        settled_last = self.runs[-1] if self.runs else first - 1
        newer = [value for step, value in fresh if max(first, settled_last + 1) <= step <= last]
        samples = self.count(first, min(last, settled_last)) + len(newer)
        if samples == 0:
            return None
        read = [value for step, value in zip(self.steps, self.values, strict=True) if first <= step <= last]
        highest = heapq.nlargest(top_needed(quantile, samples), read + newer)
        return prometheus_quantile(quantile, highest, samples)


class SampleKeeper:
    """Builds one series' :class:`KeptSamples` from its samples fed newest first: a sample is
    kept while fewer than ``needed`` later samples are at least as high (the top ``needed``
    later values are held in a heap), so the work is one comparison for most samples."""

    def __init__(self, needed: int) -> None:
        self.needed = needed
        self._higher: list[float] = []
        self._steps: list[int] = []
        self._values: list[float] = []
        self._runs: list[int] = []
        """Reversed: last, first of the newest run, then the next older one's."""

    def feed_newest_first(self, steps: Sequence[int], values: Sequence[float]) -> None:
        """Samples older than every one fed so far, ascending (read from the last, the newest, back)."""
        for index in range(len(steps) - 1, -1, -1):
            step, value = steps[index], values[index]
            if self._runs and step >= self._runs[-1]:
                raise ValueError(f"step {step} is not older than the samples already fed")
            if self._runs and self._runs[-1] == step + 1:
                self._runs[-1] = step
            else:
                self._runs += [step, step]
            if self._read_later(value):
                self._steps.append(step)
                self._values.append(value)

    def _read_later(self, value: float) -> bool:
        """Whether a sample older than all those fed so far may be read by a later window (fewer
        than ``needed`` of them at least as high), counting it among the highest if so."""
        if len(self._higher) < self.needed:
            heapq.heappush(self._higher, value)
        elif value > self._higher[0]:
            heapq.heapreplace(self._higher, value)
        else:
            return False
        return True

    def then(self, older: KeptSamples) -> KeptSamples:
        """The samples fed, followed (back in time) by ``older``'s, all older than them: ``older``'s
        samples pruned against the newer ones, its runs joined to theirs."""
        steps, values = list(self._steps), list(self._values)
        for index in range(len(older.steps) - 1, -1, -1):
            if self._read_later(older.values[index]):
                steps.append(older.steps[index])
                values.append(older.values[index])
        runs = list(older.runs)
        newer = [self._runs[i] for pair in range(len(self._runs) - 2, -1, -2) for i in (pair + 1, pair)]
        if runs and newer:
            if newer[0] <= runs[-1]:
                raise ValueError(f"samples from step {newer[0]} are not newer than those kept (to {runs[-1]})")
            if newer[0] == runs[-1] + 1:
                runs[-1] = newer[1]
                newer = newer[2:]
        return KeptSamples(array("q", reversed(steps)), array("d", reversed(values)), array("q", runs + newer))

    def kept(self) -> KeptSamples:
        return self.then(KeptSamples())
