"""Successive halving against a table-driven measure and a fake clock: the best candidate that
passes wins, one that breaks an SLO never does, the budget holds, an interrupted run resumes
without measuring again, and nothing better means keep the base."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4deploy.tune import knobs
from dsv4deploy.tune.candidates import build_candidates
from checkout import profiles_dir
from dsv4deploy.tune.command import prepare
from dsv4deploy.tune.objective import infeasible
from dsv4deploy.tune.scheduler import restart_order, successive_halving
from dsv4deploy.tune.state import Busy, TuneState

from tune_fakes import FakeClock, TableMeasure, key, measurement

CTX, MEM = "server.context_length", "server.mem_fraction_static"

# (output tok/s, p99 TTFT ms, p99 TPOT ms, failed); the gate below: floor 400, TPOT <= 150 ms
TABLE = {
    key(): (29.7, 900.0, 2100.0, 0),                         # the campaign's baseline: under the floor
    key(**{CTX: 8192}): (531.7, 300.0, 118.0, 0),            # the campaign's fix
    key(**{CTX: 8192, MEM: 0.75}): (600.0, 300.0, 160.0, 0),  # fastest, but over the TPOT ceiling
    key(**{CTX: 32768}): (450.0, 400.0, 140.0, 0),
    key(**{CTX: 32768, MEM: 0.75}): (700.0, 400.0, 100.0, 2),  # fastest of all, but failed requests
    key(**{CTX: 131072}): (200.0, 500.0, 300.0, 0),
    key(**{CTX: 131072, MEM: 0.75}): (210.0, 500.0, 300.0, 0),
}


@pytest.fixture
def prep(profile_dir):
    profile_dir.write("slo", """
        extends: fp8-ctx1m-baseline
        gate:
          levels:
            - {concurrency: 64, num_prompts: 128, input_len: 256, output_len: 256,
               min_output_throughput: 400, max_p99_tpot_ms: 150}
    """)
    return prepare("slo", [f"{CTX}=8192,32768,131072", f"{MEM}=0.70,0.75,0.85", "replicas.count=1"], directory=profiles_dir())


def run(prep, table=TABLE, *, budget_s=10_000, state=None, cost_s=60.0, interrupt_after=None):
    clock = FakeClock()
    measure = TableMeasure(table, clock, cost_s=cost_s, interrupt_after=interrupt_after)
    state = state or TuneState(None, prep.base.name, prep.method)
    result = successive_halving(prep.candidates, prep.method, measure, state, budget_s=budget_s, clock=clock)
    return result, measure


def test_the_best_candidate_that_passes_wins_measured_at_the_gates_own_level(prep):
    result, measure = run(prep)
    assert result.chosen.overrides == {CTX: 8192}
    assert result.best_trial.level.final and result.best_trial.level.num_prompts == 128
    assert result.best_trial.measurement.output_throughput == 531.7
    assert "531.7 tok/s" in result.verdict and not result.budget_exhausted


def test_refused_candidates_are_never_measured(prep):
    result, measure = run(prep)
    refused = {c.id for c in prep.candidates if c.refused}
    assert refused and not refused & {cid for cid, _ in measure.calls}


def test_the_base_is_measured_first_as_the_reference(prep):
    result, measure = run(prep)
    assert measure.calls[0] == ("base", 0)
    assert result.base_trial.measurement.output_throughput == 29.7


def test_faster_candidates_that_break_an_slo_or_fail_requests_are_out_at_once(prep):
    result, measure = run(prep)
    ids = {frozenset(c.overrides.items()): c.id for c in prep.candidates}
    over_tpot, failing = ids[key(**{CTX: 8192, MEM: 0.75})], ids[key(**{CTX: 32768, MEM: 0.75})]
    assert "p99 TPOT 160.0 ms > ceiling 150 ms" in result.eliminated[over_tpot]
    assert "2 failed request(s)" in result.eliminated[failing]
    assert (over_tpot, 1) not in measure.calls and (failing, 1) not in measure.calls


def test_halving_sends_only_the_best_third_to_the_next_level(prep):
    table = {k: (500.0 + 10 * i, 100.0, 100.0, 0) for i, k in enumerate(TABLE)}   # all pass, the last fastest
    result, measure = run(prep, table)
    level0 = [c for c, lv in measure.calls if lv == 0]
    level1 = [c for c, lv in measure.calls if lv == 1]
    assert len(level0) == len(prep.ready) == 7
    by_speed = sorted(prep.ready, key=lambda c: -table[frozenset(c.overrides.items())][0])
    assert level1 == [c.id for c in by_speed[:3]]   # ceil(7 / 3), best first
    assert "not in the best 3 of 7" in result.eliminated[by_speed[3].id]


def test_a_promoted_candidate_that_fails_the_next_level_is_replaced_by_the_next_best(prep):
    table = {k: (500.0 + 10 * i, 100.0, 100.0, 0) for i, k in enumerate(TABLE)}
    fastest = list(TABLE)[-1]

    class Flaky(TableMeasure):
        def __call__(self, candidate, level):
            m = super().__call__(candidate, level)
            if level.index == 1 and frozenset(candidate.overrides.items()) == fastest:
                return measurement((m.output_throughput, 100.0, 100.0, 3), level.num_prompts)
            return m

    clock = FakeClock()
    measure = Flaky(table, clock)
    result = successive_halving(prep.candidates, prep.method, measure, TuneState(None, "slo", prep.method),
                                budget_s=10_000, clock=clock)
    assert len([c for c, lv in measure.calls if lv == 1]) == 4   # three passed at level 1, one replaced
    assert frozenset(result.chosen.overrides.items()) == list(TABLE)[-2]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(1, 1000), st.floats(10, 300), st.integers(0, 2)), min_size=7, max_size=7))
def test_never_picks_a_candidate_that_fails_an_slo_and_never_a_worse_one_than_the_base(prep, rows):
    table = {k: (tp, 100.0, tpot, failed) for k, (tp, tpot, failed) in zip(TABLE, rows)}
    result, _ = run(prep, table)
    slo = prep.method.slo
    ok = {k: measurement(v) for k, v in table.items() if not infeasible(measurement(v), slo)}
    if result.chosen is None:
        best_other = max((m.output_throughput for k, m in ok.items() if k != key()), default=None)
        assert best_other is None or (key() in ok and ok[key()].output_throughput >= best_other)
        return
    chosen = frozenset(result.chosen.overrides.items())
    assert chosen in ok, "the chosen candidate breaks an SLO"
    assert ok[chosen].output_throughput == max(m.output_throughput for m in ok.values())
    assert key() not in ok or ok[chosen].output_throughput > ok[key()].output_throughput


def test_the_budget_holds_with_a_fake_clock(prep):
    result, measure = run(prep, budget_s=350, cost_s=100)
    assert len(measure.calls) == 3            # 0, 100, 200 s started; at 300 s the next would end at 400
    assert result.budget_exhausted and result.spent_s <= 350
    assert len(result.skipped) == len(prep.ready) - 3
    assert result.chosen.overrides == {CTX: 8192}   # the best of what was measured, said to be partial
    assert "budget ran out" in result.verdict


def test_an_interrupted_run_resumes_without_measuring_finished_candidates_again(prep, tmp_path):
    path = tmp_path / "state" / "slo.json"
    with TuneState.open(path, "slo", prep.method) as state:
        with pytest.raises(KeyboardInterrupt):
            run(prep, state=state, interrupt_after=4)
    saved = json.loads(path.read_text())
    assert sum(len(v) for v in saved["trials"].values()) == 4 and saved["spent_s"] == 240

    with TuneState.open(path, "slo", prep.method) as state:
        assert "resumed: 4 measurement(s)" in state.note
        resumed, measure = run(prep, state=state)
    uninterrupted, all_calls = run(prep)
    assert len(measure.calls) == len(all_calls.calls) - 4
    assert set(measure.calls) == set(all_calls.calls[4:])        # the first four were not measured again
    assert sum(t.from_state for t in resumed.trials) == 4
    assert resumed.chosen.id == uninterrupted.chosen.id
    assert resumed.spent_s == uninterrupted.spent_s               # the time spent before still counts


def test_a_state_measured_another_way_is_set_aside_not_mixed_in(prep, tmp_path):
    path = tmp_path / "slo.json"
    with TuneState.open(path, "slo", prep.method) as state:
        run(prep, state=state)
    other = prepare("slo", [f"{CTX}=8192,32768,131072", f"{MEM}=0.70,0.75,0.85", "replicas.count=1"], concurrency=16, directory=profiles_dir())
    with TuneState.open(path, "slo", other.method) as state:
        assert "measured another way" in state.note and not state.trials
    assert (tmp_path / "slo.json.old").exists()


def test_two_tunes_of_one_profile_do_not_share_the_state(prep, tmp_path):
    path = tmp_path / "slo.json"
    with TuneState.open(path, "slo", prep.method):
        with pytest.raises(Busy):
            TuneState.open(path, "slo", prep.method)


def test_nothing_better_than_the_base_keeps_the_base(prep):
    table = {k: (300.0, 100.0, 100.0, 0) for k in TABLE}
    table[key()] = (450.0, 100.0, 100.0, 0)
    result, _ = run(prep, table)
    assert result.chosen is None and "keep" in result.verdict


def test_no_candidate_within_the_slos_keeps_the_base(prep):
    result, _ = run(prep, {k: (100.0, 100.0, 100.0, 0) for k in TABLE})
    assert result.chosen is None and result.verdict.startswith("no candidate met the SLOs")


def test_a_backend_error_on_one_candidate_puts_it_out_and_the_search_goes_on(prep):
    clock = FakeClock()
    table = TableMeasure(TABLE, clock)

    def measure(cand, level):
        if cand.overrides == {CTX: 8192}:
            raise RuntimeError("unit failed to start")
        return table(cand, level)

    state = TuneState(None, "slo", prep.method)
    result = successive_halving(prep.candidates, prep.method, measure, state, budget_s=10_000, clock=clock)
    assert result.chosen.overrides == {CTX: 32768}
    assert any("unit failed to start" in why for why in result.eliminated.values())


def test_every_knob_needs_a_restart_today_so_no_two_candidates_share_one(prep):
    assert all(k.restart for k in knobs.KNOBS.values())
    keys = [c.restart_key for c in prep.ready]
    assert len(set(keys)) == len(keys)


def test_candidates_that_differ_only_in_a_live_knob_are_measured_back_to_back(prep, monkeypatch):
    monkeypatch.setitem(knobs.KNOBS, MEM, knobs.Knob(MEM, ("server", MEM.split(".")[1]), restart=False))
    cands = build_candidates(prep.base, prep.space)
    order = restart_order([c for c in cands if not c.refused])
    ctx = [c.overrides.get(CTX) for c in order]
    assert ctx == sorted(ctx, key=ctx.index)     # each context length's candidates are adjacent
    assert len({c.restart_key for c in order}) == 4   # base + three context lengths
