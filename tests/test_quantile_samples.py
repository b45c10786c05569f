"""A sliding window's quantile from the samples kept between passes
(``reconcilers.quantile_samples``): pure, no Prometheus. The reference is the standard library's
``statistics.quantiles`` (its ``inclusive`` method interpolates as Prometheus's
``quantile_over_time`` does); tests/test_reconcilers.py compares with a real Prometheus."""

from __future__ import annotations

import math
import random
import statistics
from array import array

import pytest

from reconcilers.quantile_samples import KeptSamples, SampleKeeper, prometheus_quantile, top_needed


def reference(percent: int, values: list[float]) -> float:
    """The ``percent``th percentile as Prometheus gives it, by another implementation."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def shapes(steps: int, seed: int) -> dict[str, list[float | None]]:
    """Usage over ``steps`` steps (None: no sample at that step), in shapes that keep few
    samples and many."""
    draw = random.Random(seed)
    daily = [2.0 + math.sin(i / 288 * 2 * math.pi) + draw.random() for i in range(steps)]
    return {
        "noisy daily": daily,
        "falling": [1000.0 - i for i in range(steps)],
        "rising": [float(i) for i in range(steps)],
        "ties": [float(draw.choice((1, 2, 3))) for _ in range(steps)],
        "flat": [0.25] * steps,  # an idle node's usage, or one a recording rule rounds
        "gaps": [None if 300 <= i % 700 < 400 or draw.random() < 0.05 else value for i, value in enumerate(daily)],
    }


def passes(window: int, total: int, every: int, unsettled: int) -> list[tuple[int, int, int]]:
    """Each pass's (first step of its window, last step, last settled step)."""
    return [(max(0, last - window + 1), last, last - unsettled) for last in range(every, total, every)]


@pytest.mark.parametrize("percent", [99, 96, 90, 50])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_quantile_of_each_pass_equals_the_whole_windows_from_the_kept_samples(percent, seed):
    window, total = 2016, 3000
    for name, series in shapes(total, seed).items():
        kept: KeptSamples | None = None
        needed = top_needed(percent / 100, window)
        settled_to = -1
        for first, last, settled in passes(window, total, every=37, unsettled=2):
            keeper = SampleKeeper(needed)
            new = [(step, value) for step in range(settled_to + 1, settled + 1)
                   if (value := series[step]) is not None]
            keeper.feed_newest_first([s for s, _ in new], [v for _, v in new])
            kept = keeper.then(kept.from_step(first)) if kept is not None else keeper.kept()
            settled_to = settled
            fresh = [(step, value) for step in range(settled + 1, last + 1) if (value := series[step]) is not None]
            whole = [value for value in series[first:last + 1] if value is not None]
            assert kept.quantile(percent / 100, first, last, fresh) == pytest.approx(reference(percent, whole),
                                                                                    rel=1e-12), (name, last)
            # Never more than the window's own samples are kept.
            assert len(kept.steps) <= len(whole), name


def test_usage_that_moves_keeps_a_few_times_the_top_and_falling_usage_keeps_everything():
    window = 2016
    needed = top_needed(0.99, window + 1)
    sizes = {}
    for name, series in shapes(window, seed=3).items():
        keeper = SampleKeeper(needed)
        present = [(step, value) for step, value in enumerate(series) if value is not None]
        keeper.feed_newest_first([s for s, _ in present], [v for _, v in present])
        sizes[name] = len(keeper.kept().steps)
    assert needed == 22
    assert sizes["rising"] == needed, "each sample has the higher ones after it"
    assert sizes["falling"] == window, "each sample may be a later window's highest"
    # A later sample as high as an older one counts against it: alike samples keep the top alone.
    assert sizes["flat"] == needed and sizes["ties"] < 3 * needed, sizes
    assert needed < sizes["noisy daily"] < 10 * needed, sizes


def test_kept_samples_count_every_sample_of_a_window_including_those_dropped():
    keeper = SampleKeeper(2)
    keeper.feed_newest_first([10, 11, 12, 20, 21], [5.0, 1.0, 2.0, 4.0, 3.0])
    kept = keeper.kept()
    assert list(kept.runs) == [10, 12, 20, 21]
    assert list(kept.steps) == [10, 20, 21], "1.0 and 2.0 have two higher samples after them"
    assert kept.count(0, 100) == 5 and kept.count(11, 20) == 3 and kept.count(13, 19) == 0
    later = kept.from_step(12)
    assert list(later.runs) == [12, 12, 20, 21] and list(later.steps) == [20, 21]
    assert later.count(0, 100) == 3
    # The quantile of steps 12-21 (2.0, 4.0, 3.0) reads 4.0 and 3.0 kept, knowing there are 3.
    assert later.quantile(0.5, 12, 21) == 3.0
    assert later.quantile(0.5, 30, 40) is None
    # Newer samples join the last run where they follow it.
    newer = SampleKeeper(2)
    newer.feed_newest_first([22, 23], [0.5, 0.25])
    joined = newer.then(later)
    assert list(joined.runs) == [12, 12, 20, 23] and joined.count(0, 100) == 5
    assert list(joined.steps) == [20, 21, 22, 23]


def test_samples_out_of_order_and_too_few_kept_are_refused():
    keeper = SampleKeeper(3)
    keeper.feed_newest_first([5, 6], [1.0, 1.0])
    with pytest.raises(ValueError, match="not older"):
        keeper.feed_newest_first([6], [1.0])
    with pytest.raises(ValueError, match=r"^step 5 is not older than the samples already fed$"):
        keeper.feed_newest_first([5], [1.0])  # the oldest fed: not older either
    older = SampleKeeper(3)
    older.feed_newest_first([7], [1.0])
    with pytest.raises(ValueError, match="not newer"):
        keeper.then(older.kept())
    ending_at_5 = SampleKeeper(3)
    ending_at_5.feed_newest_first([4, 5], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"^samples from step 5 are not newer than those kept \(to 5\)$"):
        keeper.then(ending_at_5.kept())
    with pytest.raises(ValueError, match=r"^the 0.5 quantile of 4 samples reads the highest 3, not 2$"):
        prometheus_quantile(0.5, [4.0, 3.0], 4)
    with pytest.raises(ValueError, match=r"^a quantile is between 0 and 1, not 1.5$"):
        top_needed(1.5, 10)
    assert top_needed(0.0, 10) == 10, "the minimum reads every sample"


def test_the_first_missing_step_is_the_first_with_no_sample_from_where_it_is_asked():
    runs = KeptSamples(runs=array("q", [1, 2, 4, 5, 7, 8]))
    assert runs.first_missing(1, 8) == 3
    assert runs.first_missing(4, 8) == 6, "asked from a run's first step: after that run"
    assert runs.first_missing(6, 6) == 6, "the last step asked"
    assert runs.first_missing(7, 8) is None


def test_nothing_kept_yet_reads_the_fresh_samples_alone():
    nothing = KeptSamples()
    assert nothing.from_step(5) is nothing and nothing.first_missing(5, 9) == 5
    # Fresh samples before the window are not in it; those in it are all there is.
    assert nothing.quantile(0.5, 10, 20, fresh=[(9, 100.0), (10, 1.0), (12, 3.0), (21, 50.0)]) == 2.0


def test_late_samples_join_the_runs_and_are_kept_as_the_keeper_keeps_them():
    """Steps 3 and 4 had no sample when settled; theirs arrive. A late sample is kept while fewer
    than ``needed`` later samples are at least as high, as ``SampleKeeper`` keeps them."""
    kept = KeptSamples(array("q", [1, 2, 5, 6]), array("d", [1.0, 1.0, 10.0, 5.0]), array("q", [1, 2, 5, 6]))
    late = kept.with_late([3, 4], [8.0, 5.0], needed=2)
    assert list(late.runs) == [1, 6] and late.count(1, 6) == 6, "the gap filled joins the runs either side"
    # Step 4's 5.0 has 10.0 and an equal 5.0 after it: never read. Step 3's 8.0 has only 10.0.
    assert dict(zip(late.steps, late.values, strict=True)) == {1: 1.0, 2: 1.0, 3: 8.0, 5: 10.0, 6: 5.0}
    assert kept.with_late([5, 6], [99.0, 99.0], needed=2) is kept, "a sample already held is not taken twice"
    # Only step 3's arrives: step 4 is still a gap between two runs, and counts as none.
    part = kept.with_late([3], [8.0], needed=2)
    assert list(part.runs) == [1, 3, 5, 6] and part.count(1, 6) == 5 and part.first_missing(1, 6) == 4


@pytest.mark.parametrize("percent", [99, 90, 50])
def test_samples_that_arrive_late_fill_their_gap_and_each_pass_equals_the_whole_windows(percent):
    """A remote-write sender cut off from its store sends its buffer once it is back: the steps of
    the outage were settled with no sample, then their samples arrive. Added where the kept
    series had none (:meth:`KeptSamples.with_late`), every later window's quantile is the whole
    window's, as if they had come in time; a sample already held is not taken twice."""
    window, total, every = 2016, 3000, 37
    # Steps whose samples are late: each outage's arrive 3 passes after it began.
    outages = [(start, start + 2 * every) for start in range(400, total, 600)]
    needed = top_needed(percent / 100, window)
    for name, series in shapes(total, 2).items():
        kept: KeptSamples | None = None
        settled_to = -1
        for first, last, settled in passes(window, total, every, unsettled=2):
            def arrived(step: int, by: int = settled) -> bool:
                return not any(start <= step < end and by < start + 3 * every for start, end in outages)

            keeper = SampleKeeper(needed)
            new = [(step, value) for step in range(settled_to + 1, settled + 1)
                   if (value := series[step]) is not None and arrived(step)]
            keeper.feed_newest_first([s for s, _ in new], [v for _, v in new])
            if kept is not None:
                gap = kept.first_missing(max(first, settled - 6 * every), settled_to)
                if gap is not None:
                    late = [(step, value) for step in range(gap, settled_to + 1)
                            if (value := series[step]) is not None and arrived(step)]
                    kept = kept.with_late([s for s, _ in late], [v for _, v in late], needed)
            kept = keeper.then(kept.from_step(first)) if kept is not None else keeper.kept()
            settled_to = settled
            fresh = [(step, value) for step in range(settled + 1, last + 1)
                     if (value := series[step]) is not None and arrived(step)]
            whole = [value for step in range(first, last + 1)
                     if (value := series[step]) is not None and arrived(step)]
            assert kept.count(first, settled) + len(fresh) == len(whole), (name, last)
            assert kept.quantile(percent / 100, first, last, fresh) == pytest.approx(reference(percent, whole),
                                                                                    rel=1e-12), (name, last)
