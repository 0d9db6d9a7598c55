"""dsv4deploy/sim/load.py: the longest gap a streaming load saw (bench/rolling.py's figure)."""

from dsv4deploy.sim.load import LoadResult, longest_gap


def test_the_longest_gap_counts_the_window_edges_and_says_where_it_starts():
    assert longest_gap([1.0, 1.5, 4.0], 0.0, 5.0) == (2.5, 1.5)
    assert longest_gap([1.0, 1.5, 4.0], 1.2, 3.0) == (1.5, 1.5)      # only what falls inside, edges included
    assert longest_gap([], 2.0, 3.0) == (1.0, 2.0)                    # nothing at all: the whole window


def test_a_load_result_measures_completions_and_tokens_over_its_run_or_a_window():
    r = LoadResult(completions=[1.0, 1.5, 4.0], tokens_at=[0.5, 4.9], started=0.0, ended=5.0)
    assert r.max_gap_s() == 2.5 and r.max_token_gap_s() == 4.4
    assert r.max_gap_s(1.2, 3.0) == 1.5
