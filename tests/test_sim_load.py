"""ct200twin/host/load.py: the longest gap a streaming load saw (bench/rolling.py's figure)."""

import pytest

from ct200twin.host.load import LoadResult, longest_gap, windows_over


def test_the_longest_gap_counts_the_window_edges_and_says_where_it_starts():
    assert longest_gap([1.0, 1.5, 4.0], 0.0, 5.0) == (2.5, 1.5)
    assert longest_gap([1.0, 1.5, 4.0], 1.2, 3.0) == (1.5, 1.5)      # only what falls inside, edges included
    assert longest_gap([], 2.0, 3.0) == (1.0, 2.0)                    # nothing at all: the whole window


def test_a_load_result_measures_completions_and_tokens_over_its_run_or_a_window():
    r = LoadResult(completions=[1.0, 1.5, 4.0], tokens_at=[0.5, 4.9], started=0.0, ended=5.0)
    assert r.max_gap_s() == 2.5 and r.max_token_gap_s() == 4.4
    assert r.max_gap_s(1.2, 3.0) == 1.5


def test_windows_over_a_steady_run_count_those_whose_longest_gap_breaks_the_bound():
    times = [0.5 * i for i in range(21)] + [13.0 + 0.5 * i for i in range(7)]   # every 0.5 s, but 10 -> 13
    # windows of 4 s starting at 0, 1, ..., 12: a window sees only its part of the 3 s gap, so
    # only those starting at 9 and 10 see more than 2 s of it (8 and 11 see exactly 2.0)
    windows, over, median = windows_over(times, 0.0, 16.0, window_s=4.0, bound_s=2.0)
    assert (windows, over, median) == (13, 2, 0.5)
    with pytest.raises(ValueError, match="no window of 20 s"):
        windows_over(times, 0.0, 16.0, window_s=20.0, bound_s=2.0)
