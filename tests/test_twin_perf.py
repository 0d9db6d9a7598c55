"""The twin's performance model: calibration against the campaign, and client-side measurements
over HTTP agreeing with the model's prediction (same scheduler code, virtual time)."""

import asyncio

import pytest

from dsv4deploy.twin import perf
from dsv4deploy.twin.server import LocalTwin, nvfp4_ctx8k_argv

pytestmark = pytest.mark.timing

FAST = {"load_seconds": 0.3, "warmup_seconds": 0.1, "health_poll_seconds": 0.1}


def test_step_model_matches_campaign():
    cfg = perf.reference_config()
    assert cfg.decode_step_s(1) == pytest.approx(0.071, abs=5e-4)  # "71 ms/step"
    assert cfg.decode_step_s(9) - cfg.decode_step_s(8) == pytest.approx(0.031, abs=5e-4)  # "+31 ms/req"
    assert cfg.decode_step_s(0) == pytest.approx(0.040, abs=5e-4)  # "40 ms fixed"
    assert perf.reference_config(k=1).decode_step_s(1) > cfg.decode_step_s(1)  # CDS helps a little
    assert perf.reference_config(k=1).decode_step_s(64) / cfg.decode_step_s(64) < 1.01


def test_calibration_table_within_5_percent():
    for row in perf.calibration_table():
        assert abs(row["diff_pct"]) < 5, row


def test_queueing_beyond_max_running_requests():
    cfg = perf.PerfConfig(context_length=8192, max_running_requests=8)
    capped = perf.simulate_bench(cfg, 16, 16, 256, 16).output_throughput
    free = perf.simulate_bench(perf.PerfConfig(context_length=8192), 16, 16, 256, 16).output_throughput
    assert capped < free


@pytest.mark.parametrize("context,c,n,out", [
    (None, 1, 2, 16),      # default ~1M context: 71 ms steps
    (None, 16, 16, 6),     # default context, the plateau
    (8192, 64, 64, 48),    # the capped context
])
def test_client_throughput_agrees_with_model(context, c, n, out):
    with LocalTwin(faults=FAST) as t:
        t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, context_length=context)
        t.stop()
        t.start()
        t.wait_ready()
        measured = asyncio.run(perf.measure_bench(t.url, c, n, 256, out, warmup=0))
    predicted = perf.simulate_bench(perf.reference_config(context), c, n, 256, out)
    assert measured.completed == n and measured.failed == 0
    diff = measured.output_throughput / predicted.output_throughput - 1
    print(f"C={c} ctx={context}: measured {measured.output_throughput:.3f} predicted "
          f"{predicted.output_throughput:.3f} ({100 * diff:+.2f}%)")
    assert abs(diff) < 0.05, (measured.output_throughput, predicted.output_throughput)
