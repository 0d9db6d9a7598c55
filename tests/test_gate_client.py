"""The built-in client against local twin servers (no twin host): agreement with the twin's
performance model at C=1/16/64, its CPU share, early stop on the default (~1M) context, failed
requests counted with error_rate, a crash mid-level, budget exhaustion, the API key."""

import contextlib
import sys
import time

from dsv4deploy.gate.inputs import GateHost, GateOptions, GateServer
from dsv4deploy.gate.result import BUDGET, EARLY_STOP, FAILED, OK, SKIPPED
from dsv4deploy.gate.runner import local_execute, local_upload, run_gate
from dsv4deploy.gate.spec import GateSpec, LevelSpec
from checkout import load_profile
from ct200twin.server import perf
from ct200twin.server.faults import Faults
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv

import pytest

pytestmark = pytest.mark.timing

FAST = {"load_seconds": 0.3, "warmup_seconds": 0.1, "health_poll_seconds": 0.1}


@contextlib.contextmanager
def twin(context=8192, faults=None, extra=()):
    t = LocalTwin(faults={**FAST, **(faults or {})})
    t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, context_length=context) + list(extra)
    with t:
        t.wait_ready()
        yield t


def gate(t, spec, **options):
    return run_gate(spec, GateHost(local_execute, upload=local_upload, host_python=sys.executable,
                                   client_dir=str(t.tmp / "gate-client")),
                    GateServer(t.url, str(t.model_dir), str(t.tmp / "no-venv" / "bin" / "python"),
                               api_key_file=str(t.tmp / "api-key")), GateOptions(**options))


@pytest.mark.slow
def test_throughput_agrees_with_twin_model_and_client_cpu_is_small():
    levels = (LevelSpec(1, 2, 256, 32), LevelSpec(16, 16, 256, 64), LevelSpec(64, 64, 256, 64))
    spec = GateSpec(levels=levels, warmup_requests=1, budget_s=300)
    with twin() as t:
        out = gate(t, spec)      # runner auto: no sglang in that venv -> builtin
    assert out.result.runner == "builtin" and out.passed, out.verdict.failures
    for lv in levels:
        r = out.result.level(lv.concurrency)
        pred = perf.simulate_bench(perf.reference_config(8192), lv.concurrency, lv.num_prompts, lv.input_len,
                                   lv.output_len).output_throughput
        diff = r.output_throughput / pred - 1
        print(f"C={lv.concurrency}: measured {r.output_throughput:.2f} tok/s, model {pred:.2f} ({100 * diff:+.2f}%), "
              f"client CPU {r.client_cpu_s:.3f} s = {100 * r.client_cpu_share:.1f}% of {r.duration_s:.2f} s")
        assert r.completed == lv.num_prompts and r.failed == 0
        assert r.total_output_tokens == lv.num_prompts * lv.output_len       # from meta_info
        assert abs(diff) < 0.05, (lv, r.output_throughput, pred)
        assert r.ttft_ms.p99 >= r.ttft_ms.median > 0 and r.tpot_ms.mean > 0 and r.itl_ms.p90 > 0
        assert r.e2e_ms.max >= r.e2e_ms.p99
    c64 = out.result.level(64)
    assert c64.max_in_flight == 64
    # TPOT at C=64: the twin's decode step is 40 ms + 64 x 1.15 ms (prefill stalls raise the mean)
    assert 113 < c64.tpot_ms.median < 135
    assert c64.client_cpu_share < 0.15, c64.client_cpu_share


@pytest.mark.slow
def test_slow_profile_stops_early_in_a_small_fraction_of_the_full_gate():
    spec = GateSpec.from_profile(load_profile("fp8-ctx1m-baseline").data)
    cfg = perf.reference_config(None)                     # default ~1M context
    full = sum(perf.simulate_bench(cfg, lv.concurrency, lv.num_prompts, lv.input_len, lv.output_len).duration_s
               for lv in spec.levels)
    with twin(context=None) as t:
        t0 = time.monotonic()
        out = gate(t, spec)
        took = time.monotonic() - t0
    print(f"slow profile: gate failed after {took:.1f} s; full gate (model) {full:.0f} s; fraction {took / full:.2%}")
    print("\n".join(out.verdict.lines()))
    assert not out.passed
    c64 = out.result.level(64)
    assert c64.status == EARLY_STOP and c64.early_stop["rule"] in ("bound", "running")
    assert 25 < c64.running_output_throughput < 36          # the campaign's ~30 tok/s plateau
    assert out.verdict.failures[0].startswith("C=64 output throughput ")
    assert " tok/s < floor 400 tok/s (running rate, stopped early after " in out.verdict.failures[0]
    assert [out.result.level(c).status for c in (16, 1)] == [SKIPPED, SKIPPED]
    assert took < 0.05 * full and took < 60


@pytest.mark.slow
def test_a_clear_pass_stops_early_and_a_near_floor_level_runs_to_the_end():
    """Early pass: 25% above the floor after C completions stops the level as passed; a level
    10% above its floor runs every request (the verdict must equal a full run's)."""
    pred = perf.simulate_bench(perf.reference_config(8192), 4, 16, 64, 32).output_throughput
    clear = GateSpec(levels=(LevelSpec(4, 16, 64, 32, min_output_throughput=round(pred / 2, 1)),),
                     warmup_requests=1, budget_s=120)
    near = GateSpec(levels=(LevelSpec(4, 16, 64, 32, min_output_throughput=round(pred * 0.9, 1)),),
                    warmup_requests=1, budget_s=120)
    with twin() as t:
        fast = gate(t, clear)
        whole = gate(t, near)
    lv = fast.result.levels[0]
    assert fast.passed and lv.status == OK and lv.early_stop["rule"] == "pass"
    assert 4 <= lv.completed < 16 and lv.failed == 0 and lv.output_throughput >= 1.25 * lv_floor(clear)
    assert " ".join(r.note for r in fast.verdict.levels[0].rows).count("passed early") == 1   # said once
    lv = whole.result.levels[0]
    assert whole.passed and lv.completed == 16 and lv.early_stop is None


def lv_floor(spec):
    return spec.levels[0].min_output_throughput


@pytest.mark.slow
def test_error_rate_failures_are_counted():
    faults = {"error_rate": 0.3, "error_seed": 3}
    n = 24
    expected = sum(Faults(error_rate=0.3, error_seed=3).fails(i) for i in range(n))   # warm-up 0: indices 0..n-1
    assert 0 < expected < n
    spec = GateSpec(levels=(LevelSpec(4, n, 64, 8),), warmup_requests=0, max_failed_requests=100, budget_s=120)
    with twin(faults=faults) as t:
        out = gate(t, spec, runner="builtin")
    r = out.result.levels[0]
    assert r.status == OK and r.failed == expected and r.completed == n - expected
    assert r.errors and "server error mid-stream" in r.errors[0]["message"]
    assert out.passed                                         # within max_failed_requests
    spec0 = GateSpec(levels=spec.levels, warmup_requests=0, max_failed_requests=0, budget_s=120)
    with twin(faults=faults) as t:
        out = gate(t, spec0, runner="builtin")
    r = out.result.levels[0]
    # stops at the first failure (another one of the same decode step may land before the stop)
    assert r.status == FAILED and 1 <= r.failed <= 4 and r.completed + r.failed < n
    assert out.verdict.failures[0].startswith("C=4 failed: 1 failed request > max 0 (last: server error mid-stream")
    assert f"C=4 failed requests {r.failed} > max 0" in out.verdict.failures


@pytest.mark.slow
def test_crash_mid_level_fails_fast_not_a_hang():
    spec = GateSpec(levels=(LevelSpec(4, 40, 64, 16), LevelSpec(1, 4, 64, 16)), warmup_requests=0, budget_s=120)
    with twin(faults={"crash_after_requests": 6}) as t:
        t0 = time.monotonic()
        out = gate(t, spec, runner="builtin", fail_fast=False)
        took = time.monotonic() - t0
        assert t.proc.wait(timeout=5) == 1
    c4, c1 = out.result.level(4), out.result.level(1)
    assert took < 15, took
    assert c4.status == FAILED and 6 <= c4.completed < 40 and c4.failed >= 1
    assert "connection" in c4.reason
    assert c1.status == FAILED and c1.reason.startswith("warm-up failed") is False   # no warm-up: first request fails
    assert not out.passed


@pytest.mark.slow
def test_budget_exhaustion_ends_within_budget():
    spec = GateSpec(levels=(LevelSpec(4, 8, 256, 256), LevelSpec(1, 2, 256, 256)), warmup_requests=1, budget_s=6)
    with twin(context=None) as t:                     # ~1M context: this level takes minutes
        t0 = time.monotonic()
        out = gate(t, spec, runner="builtin")
        took = time.monotonic() - t0
    print(f"budget 6 s: gate returned after {took:.1f} s")
    assert took < 6 + 4
    assert [lv.status for lv in out.result.levels] == [BUDGET, SKIPPED]
    assert out.result.budget_exhausted
    # the gate's budget as the profile sets it, not what was left of it when the client started
    # (5.9 s when its upload took a tenth of a second under load)
    assert out.verdict.failures[0].startswith("C=4: gate budget 6 s exhausted during C=4"), out.verdict.failures


@pytest.mark.slow
def test_api_key_from_the_key_file_not_argv_nor_environment():
    spec = GateSpec(levels=(LevelSpec(2, 4, 32, 8),), warmup_requests=1, budget_s=60)
    with twin(extra=["--api-key", "k-123456"]) as t:
        seen = []

        def execute(cmd, timeout_s):
            seen.append(cmd)
            return local_execute(cmd, timeout_s)

        (t.tmp / "api-key").write_text("k-123456\n")
        ok = run_gate(spec,
                      GateHost(execute, upload=local_upload, host_python=sys.executable, client_dir=str(t.tmp / "c")),
                      GateServer(t.url, str(t.model_dir), "/nonexistent", api_key_file=str(t.tmp / "api-key")),
                      GateOptions(runner="builtin"))
        (t.tmp / "api-key").write_text("wrong\n")
        bad = gate(t, spec, runner="builtin")
    assert ok.passed and ok.result.client["api_key"] is True
    assert all("k-123456" not in c for c in seen)
    assert "--api-key-fd 3" in seen[-1] and "API_KEY=" not in seen[-1]
    assert not bad.passed and bad.result.levels[0].reason.startswith("warm-up failed: HTTP 401")


def test_the_client_exits_when_its_session_is_gone():
    """The control node killed mid-gate: sshd closes the session's pipes. The client notices on its
    next heartbeat (a newline on stderr that fails with EPIPE), exits 141 and stops loading the server."""
    import subprocess

    from dsv4deploy.gate.runner import builtin_command, install_client

    spec = GateSpec(levels=(LevelSpec(4, 64, 256, 256),), warmup_requests=0, budget_s=600)
    with twin(context=None) as t:                     # ~1M context: the level takes minutes
        client_dir = str(t.tmp / "gate-client")
        install_client(local_execute, local_upload, client_dir, as_root=False)
        cmd = builtin_command(spec, GateHost(local_execute, host_python=sys.executable, client_dir=client_dir),
                              GateServer(t.url, str(t.model_dir), "/nonexistent", str(t.tmp / "api-key")))
        assert "--heartbeat-s 1" in cmd
        p = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        try:
            got = b""
            while b"\n\n" not in got and p.poll() is None:    # running, heartbeats on stderr
                got += p.stderr.read1(4096)
            assert p.poll() is None, got.decode(errors="replace")
            p.stdout.close()
            p.stderr.close()                                   # the session is gone
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                import os
                import signal
                os.killpg(p.pid, signal.SIGKILL)
    assert rc == 141
