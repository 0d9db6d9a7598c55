"""Gate timings: the passing profile's gate, the failing profile's gate with early stop (and,
with --full, without), and the automatic rollback time on the twin (from the release history).

    .venv/bin/python bench/gate.py            # ~5 minutes: local twin servers on loopback
    .venv/bin/python bench/gate.py --full     # + the slow profile's gate without early stop (~27 min)

Prints figures; asserts nothing. The rollback figures need the CT200 twin running with a
history that holds automatic rollbacks (e.g. after `pytest tests/test_deploy_twin.py`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4deploy.gate import GateSpec, run_gate  # noqa: E402
from dsv4deploy.gate.runner import local_execute, local_upload  # noqa: E402
from dsv4deploy.profiles import load_profile  # noqa: E402
from dsv4deploy.twin.faults import Faults  # noqa: E402
from dsv4deploy.twin.perf import PerfConfig, simulate_bench  # noqa: E402
from dsv4deploy.twin.server import LocalTwin, nvfp4_ctx8k_argv  # noqa: E402


def timed_gate(profile: str, context: int | None, early_stop: bool = True) -> tuple[float, object]:
    spec = GateSpec.from_profile(load_profile(profile).data)
    twin = LocalTwin(argv=None)
    twin.argv = nvfp4_ctx8k_argv(str(twin.model_dir), twin.port, context_length=context)
    port = twin.port
    with twin:
        twin.wait_ready()
        start = time.monotonic()
        outcome = run_gate(spec, local_execute, base_url=f"http://127.0.0.1:{port}", model_path=str(twin.model_dir),
                           venv_python=sys.executable, runner="builtin", upload=local_upload,
                           client_dir=str(twin.tmp / "gate-client"),
                           early_stop=early_stop)
        return time.monotonic() - start, outcome


def predicted_full_gate_s(profile: str, context: int) -> float:
    spec = GateSpec.from_profile(load_profile(profile).data)
    cfg = PerfConfig(context_length=context, max_running_requests=256)
    return sum(simulate_bench(cfg, lv.concurrency, lv.num_prompts, lv.input_len, lv.output_len).duration_s
               for lv in spec.levels)


def rollback_times() -> list[tuple[int, int, float]]:
    out = subprocess.run([sys.executable, "-m", "dsv4deploy", "history", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    recs = {r["release"]: r for recs in json.loads(out.stdout).values() for r in recs}
    load = Faults().load_seconds + Faults().warmup_seconds
    rows = []
    for r in recs.values():
        if r.get("kind") == "rollback" and str(r.get("reason", "")).startswith("automatic rollback") \
                and r["status"] in ("deployed", "superseded") and r["release"] - 1 in recs:
            failed = recs[r["release"] - 1]
            t0 = dt.datetime.fromisoformat(failed["updated"])
            t1 = dt.datetime.fromisoformat(r.get("deployed_at") or r["updated"])
            rows.append((failed["release"], r["release"], (t1 - t0).total_seconds() - load))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="also run the slow profile's gate without early stop")
    args = ap.parse_args()
    rows = []
    t, o = timed_gate("nvfp4-ctx8k", 8192)
    rows.append(("nvfp4-ctx8k (passes)", t, o.passed, o.summary, predicted_full_gate_s("nvfp4-ctx8k", 8192)))
    t, o = timed_gate("fp8-ctx1m-baseline", None)
    full = predicted_full_gate_s("fp8-ctx1m-baseline", 1048576)
    rows.append(("fp8-ctx1m-baseline, early stop", t, o.passed, o.summary, full))
    if args.full:
        t, o = timed_gate("fp8-ctx1m-baseline", None, early_stop=False)
        rows.append(("fp8-ctx1m-baseline, no early stop", t, o.passed, o.summary, full))
    print(f"{'gate':36} {'wall s':>8} {'model full s':>13}  verdict")
    for name, wall, passed, summary, pred in rows:
        print(f"{name:36} {wall:8.1f} {pred:13.1f}  {'PASS' if passed else 'FAIL'}: {summary[:90]}")
    early = rows[1][1] / rows[1][4]
    print(f"\nslow profile: early-stopped gate = {early * 100:.1f}% of its full gate ({rows[1][4]:.0f} s by the model)")
    rb = rollback_times()
    if rb:
        print("\nautomatic rollbacks on the twin (gate/health failure -> previous release healthy and probed),")
        print(f"minus the twin's simulated load + warm-up ({Faults().load_seconds + Faults().warmup_seconds:.1f} s):")
        for failed, rollback, secs in rb:
            print(f"  release {failed:04d} failed -> rollback {rollback:04d}: {secs:5.1f} s (1 s resolution)")
    else:
        print("\n(no automatic rollback in the twin's history: run tests/test_deploy_twin.py first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
