"""The objective: throughput at the target concurrency within the gate's SLOs, no failed request."""

from __future__ import annotations

import pytest

from checkout import load_profile
from dsv4deploy.tune.objective import Measurement, Slo, infeasible, method_for, pareto_front, rung_prompts
from dsv4deploy.tune.space import build_space

SLO = Slo(min_output_throughput=400, max_p99_ttft_ms=2000, max_p99_tpot_ms=150)


def test_a_measurement_within_every_slo_passes():
    assert infeasible(Measurement(531.7, p99_ttft_ms=900, p99_tpot_ms=118, completed=128), SLO) == []


@pytest.mark.parametrize("m, words", [
    (Measurement(600, 900, 118, failed=1), "1 failed request"),
    (Measurement(29.7, 900, 118), "output 29.7 tok/s < floor 400"),
    (Measurement(600, 2500, 118), "p99 TTFT 2500.0 ms > ceiling 2000 ms"),
    (Measurement(600, 900, 151), "p99 TPOT 151.0 ms > ceiling 150 ms"),
    (Measurement(600, 900, None), "p99 TPOT not measured"),
    (Measurement(30, None, None, cannot_reach=True), "cannot reach the floor of 400 tok/s"),
    (Measurement(600, 900, 118, gate_passed=False), "the gate failed"),
    (Measurement(0, error="OOM at CUDA-graph capture"), "did not serve: OOM"),
])
def test_each_broken_constraint_is_named(m, words):
    why = infeasible(m, SLO)
    assert why and words in "; ".join(why)


def test_no_declared_ceiling_means_only_failures_count():
    assert infeasible(Measurement(1.0, None, None), Slo()) == []
    assert infeasible(Measurement(1.0, None, None, failed=2), Slo()) == ["2 failed request(s)"]


def test_pareto_front_keeps_only_undominated_points():
    pts = [("a", 500, 120), ("b", 450, 100), ("c", 400, 130), ("d", 530, 160), ("e", 500, 125)]
    assert pareto_front(pts) == ["b", "a", "d"]


def test_levels_end_with_the_gates_own_level_and_start_with_one_wave():
    assert rung_prompts(64, 128, 3) == (64, 128)
    assert rung_prompts(1, 8, 3) == (1, 3, 8)
    assert rung_prompts(16, 16, 3) == (16,)
    base = load_profile("fp8-ctx1m-baseline")
    method = method_for(base, build_space(base))
    assert method.concurrency == 64 and method.rung_prompts == (64, 128)
    assert method.slo.min_output_throughput == 400 and method.slo.max_failed_requests == 0
    assert [lv.final for lv in method.levels] == [False, True]
    assert method.levels[-1].num_prompts == 128 and method.levels[-1].input_len == 256


def test_a_concurrency_without_a_gate_level_has_no_floor(profile_dir):
    base = load_profile("fp8-ctx1m-baseline")
    method = method_for(base, build_space(base, concurrency=32))
    assert method.slo == Slo() and method.rung_prompts == (32, 64)
