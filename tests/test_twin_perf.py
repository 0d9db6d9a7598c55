"""The twin's performance model: calibration against the campaign, and client-side measurements
over HTTP agreeing with the model's prediction (same scheduler code, virtual time)."""

import asyncio
import dataclasses

import pytest

from ct200twin.server import args as targs
from ct200twin.server import perf
from ct200twin.server import resolved as tresolved
from ct200twin.server.faults import Faults
from ct200twin.server.logs import Log
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv

pytestmark = pytest.mark.timing

FAST = {"load_seconds": 0.3, "warmup_seconds": 0.1, "health_poll_seconds": 0.1}


def test_step_model_matches_campaign():
    cfg = perf.reference_config()
    assert cfg.decode_step_s(1) == pytest.approx(0.071, abs=5e-4)  # "71 ms/step"
    assert cfg.decode_step_s(9) - cfg.decode_step_s(8) == pytest.approx(0.031, abs=5e-4)  # "+31 ms/req"
    assert cfg.decode_step_s(0) == pytest.approx(0.040, abs=5e-4)  # "40 ms fixed"


def test_perf_config_has_no_continuous_decode_steps():
    """SGLang 0.5.12-0.5.23 never read --num-continuous-decode-steps: the model has no knob for it."""
    fields = {f.name for f in dataclasses.fields(perf.PerfConfig)}
    assert not any("continuous" in f for f in fields), fields


@pytest.mark.parametrize("context", [None, "8192"])
def test_continuous_decode_steps_flag_changes_nothing(monkeypatch, tmp_path, context):
    """The twin accepts --num-continuous-decode-steps (SGLang does) and shows the parsed value,
    but the server's perf config and its predicted throughput are the same with and without it."""
    monkeypatch.setattr(tresolved, "query_gpus", lambda log: (97887, 8))
    base = ["--model-path", str(tmp_path), "--tp-size", "4", "--mem-fraction-static", "0.7",
            "--cuda-graph-max-bs-decode", "32", "--moe-runner-backend", "marlin"]
    if context:
        base += ["--context-length", context]
    configs = {}
    for steps in (None, "1", "4", "16"):
        argv = base + (["--num-continuous-decode-steps", steps] if steps else [])
        parsed = targs.parse_args(argv)
        assert parsed.num_continuous_decode_steps == int(steps or 1)  # parsed, like SGLang's
        configs[steps] = tresolved.resolve(parsed, Faults(), Log("error")).perf_config()
    assert len(set(configs.values())) == 1, configs
    cfg = configs[None]
    for c, n, out in ((1, 4, 64), (16, 32, 32), (64, 64, 16)):
        without = perf.simulate_bench(cfg, c, n, 256, out)
        with_flag = perf.simulate_bench(configs["4"], c, n, 256, out)
        assert with_flag == without and with_flag.output_throughput > 0


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
@pytest.mark.slow
def test_client_throughput_agrees_with_model(context, c, n, out):
    with LocalTwin(faults=FAST) as t:
        t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, context_length=context)
        t.stop()
        t.start()
        t.wait_ready()
        predicted = perf.simulate_bench(perf.reference_config(context), c, n, 256, out)
        # best of two, as benchmarks report: another process's burst on a 2-core CI machine (the
        # twin lane runs beside this one) only ever slows a run down, never speeds it up
        for _ in range(2):
            measured = asyncio.run(perf.measure_bench(t.url, c, n, 256, out, warmup=0))
            assert measured.completed == n and measured.failed == 0
            diff = measured.output_throughput / predicted.output_throughput - 1
            if abs(diff) < 0.05:
                break
    print(f"C={c} ctx={context}: measured {measured.output_throughput:.3f} predicted "
          f"{predicted.output_throughput:.3f} ({100 * diff:+.2f}%)")
    assert abs(diff) < 0.05, (measured.output_throughput, predicted.output_throughput)
