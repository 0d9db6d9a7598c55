#!/usr/bin/env python3
"""The built-in gate client's own CPU share, and the slow profile's early-stop fraction.

    python bench/gate_client_cpu.py              # C=64 n=128 256/256 on a ctx-8192 twin (~70 s)
                                                 # + the fp8-ctx1m-baseline gate on a ~1M twin (~25 s)
    python bench/gate_client_cpu.py --quick      # C=64 n=64 256/64 only

Runs the client exactly as the deploy does (run_gate, runner builtin, client script uploaded and
run as a subprocess) against local twin servers and prints, per level, output tok/s next to the
twin model's prediction and the client's CPU time / wall time (resource.getrusage in the client).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4deploy.gate import (GateHost, GateOptions, GateServer, GateSpec, LevelSpec, local_execute,  # noqa: E402
                             local_upload, run_gate)
from dsv4deploy.cli.settings import Settings  # noqa: E402
from dsv4deploy.profile import load  # noqa: E402
from ct200twin.server import perf  # noqa: E402
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv  # noqa: E402

PROFILES = Settings.from_environment(os.environ).profiles     # as the dsv4deploy command finds them


def load_profile(name: str) -> load.Profile:
    return load.load_profile(name, PROFILES)


FAST = {"load_seconds": 0.3, "warmup_seconds": 0.1, "health_poll_seconds": 0.1}


def run(spec: GateSpec, context: int | None):
    t = LocalTwin(faults=FAST)
    t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, context_length=context)
    with t:
        t.wait_ready()
        t0 = time.monotonic()
        out = run_gate(spec,
                       GateHost(local_execute, upload=local_upload, host_python=sys.executable,
                                client_dir=str(t.tmp / "gate-client")),
                       GateServer(t.url, str(t.model_dir), "/nonexistent"),
                       GateOptions(runner="builtin"))
        return out, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    lv = LevelSpec(64, 64, 256, 64) if a.quick else LevelSpec(64, 128, 256, 256)
    out, wall = run(GateSpec(levels=(lv,), warmup_requests=2, budget_s=600), 8192)
    r = out.result.levels[0]
    pred = perf.simulate_bench(perf.reference_config(8192), lv.concurrency, lv.num_prompts, lv.input_len,
                               lv.output_len).output_throughput
    print(f"C={lv.concurrency} n={lv.num_prompts} {lv.input_len}/{lv.output_len} ctx 8192: "
          f"{r.output_throughput:.1f} tok/s (model {pred:.1f}, {100 * (r.output_throughput / pred - 1):+.1f}%), "
          f"client CPU {r.client_cpu_s:.2f} s over {r.duration_s:.1f} s = {100 * r.client_cpu_share:.1f}% of one core "
          f"({1e6 * r.client_cpu_s / max(1, r.streamed_output_tokens or 0):.0f} us per streamed token)")
    if a.quick:
        return 0
    spec = GateSpec.from_profile(load_profile("fp8-ctx1m-baseline").data)
    full = sum(perf.simulate_bench(perf.reference_config(None), x.concurrency, x.num_prompts, x.input_len,
                                   x.output_len).duration_s for x in spec.levels)
    out, wall = run(spec, None)
    print(f"fp8-ctx1m-baseline gate: {'PASS' if out.passed else 'FAIL'} after {wall:.1f} s "
          f"(full gate per the twin model {full:.0f} s without warm-ups: {100 * wall / full:.2f}%)")
    print("  " + out.verdict.message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
