"""Gate timings: the passing profile's gate, the failing profile's gate with early stop (and,
with --full, without), and the automatic rollback time on the twin (from the release history).

    .venv/bin/python bench/gate.py              # ~5 minutes: local twin servers on loopback
    .venv/bin/python bench/gate.py --full       # + the slow profile's gate without early stop (~27 min)
    .venv/bin/python bench/gate.py --early-pass # early pass vs full run: every shipped profile, and
                                                # floors 10% below / above what the twin serves (~25 min)

Prints figures; asserts nothing. The rollback figures need the CT200 twin running with a
history that holds automatic rollbacks (e.g. after `pytest tests/test_deploy_twin.py`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4deploy.gate import GateHost, GateOptions, GateServer, GateSpec, run_gate  # noqa: E402
from dsv4deploy.gate.runner import local_execute, local_upload  # noqa: E402
from dsv4deploy.cli.settings import Settings  # noqa: E402
from dsv4deploy.profile import load  # noqa: E402
from dsv4deploy.render.argv import server_args  # noqa: E402
from ct200twin.server.args import VERSION_ENV  # noqa: E402
from ct200twin.server.faults import Faults  # noqa: E402
from ct200twin.server.perf import PerfConfig, simulate_bench  # noqa: E402
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv  # noqa: E402

PROFILES = Settings.from_environment(os.environ).profiles     # as the dsv4deploy command finds them


def load_profile(name: str) -> load.Profile:
    return load.load_profile(name, PROFILES)


def timed_gate(profile: str, context: int | None, early_stop: bool = True) -> tuple[float, object]:
    spec = GateSpec.from_profile(load_profile(profile).data)
    twin = LocalTwin(argv=None)
    twin.argv = nvfp4_ctx8k_argv(str(twin.model_dir), twin.port, context_length=context)
    port = twin.port
    with twin:
        twin.wait_ready()
        start = time.monotonic()
        outcome = run_gate(spec,
                           GateHost(local_execute, upload=local_upload, client_dir=str(twin.tmp / "gate-client")),
                           GateServer(f"http://127.0.0.1:{port}", str(twin.model_dir), sys.executable),
                           GateOptions(runner="builtin", early_stop=early_stop))
        return time.monotonic() - start, outcome


def profile_argv(name: str, twin: LocalTwin) -> list[str]:
    """The profile's rendered server flags, pointed at the local twin (no API key: no credential here)."""
    args = server_args(load_profile(name))
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "--config":
            skip = True
            continue
        prev = args[i - 1] if i else ""
        out.append(str(twin.model_dir) if prev == "--model-path" else str(twin.port) if prev == "--port" else a)
    return out


def gate_on_profile(name: str, spec: GateSpec, early_pass: bool) -> tuple[float, object]:
    twin = LocalTwin(argv=None, env={VERSION_ENV: load_profile(name).data["sglang"]["version"]})
    twin.argv = profile_argv(name, twin)
    with twin:
        twin.wait_ready()
        start = time.monotonic()
        outcome = run_gate(spec,
                           GateHost(local_execute, upload=local_upload, client_dir=str(twin.tmp / "gate-client")),
                           GateServer(twin.url, str(twin.model_dir), sys.executable),
                           GateOptions(runner="builtin", early_pass=early_pass))
        return time.monotonic() - start, outcome


def with_floors(spec: GateSpec, floors: dict[int, float]) -> GateSpec:
    from dataclasses import replace
    return replace(spec, levels=tuple(replace(lv, min_output_throughput=floors.get(lv.concurrency,
                                                                                   lv.min_output_throughput))
                                      for lv in spec.levels))


def early_pass_table() -> None:
    """Each shipped profile's gate run full and with early pass on the twin: time and verdict; then
    the passing profile with floors placed 10% below and above what the twin serves at each level."""
    print(f"{'profile / floors':44} {'full s':>7} {'early s':>8} {'ratio':>6}  full -> early verdict")
    for name in load.list_profiles(PROFILES):
        spec = GateSpec.from_profile(load_profile(name).data)
        full_s, full = gate_on_profile(name, spec, early_pass=False)
        early_s, early = gate_on_profile(name, spec, early_pass=True)
        same = "same" if (full.passed, [lv.status for lv in full.verdict.levels]) == \
            (early.passed, [lv.status for lv in early.verdict.levels]) else "DIFFERENT"
        print(f"{name:44} {full_s:7.1f} {early_s:8.1f} {early_s / full_s:6.2f}  "
              f"{'PASS' if full.passed else 'FAIL'} -> {'PASS' if early.passed else 'FAIL'} ({same})", flush=True)
        if name != "nvfp4-ctx8k":
            continue
        served = {lv.concurrency: lv.output_throughput for lv in full.result.levels}
        for label, factor in (("floors 10% below the served rate", 1 / 1.1), ("floors 10% above", 1 / 0.9)):
            moved = with_floors(spec, {c: round(x * factor, 1) for c, x in served.items()})
            f_s, f = gate_on_profile(name, moved, early_pass=False)
            e_s, e = gate_on_profile(name, moved, early_pass=True)
            same = "same" if f.passed == e.passed else "DIFFERENT"
            print(f"{'  ' + label:44} {f_s:7.1f} {e_s:8.1f} {e_s / f_s:6.2f}  "
                  f"{'PASS' if f.passed else 'FAIL'} -> {'PASS' if e.passed else 'FAIL'} ({same})", flush=True)


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
    ap.add_argument("--early-pass", action="store_true", help="early pass against full runs (every shipped profile)")
    args = ap.parse_args()
    if args.early_pass:
        early_pass_table()
        return 0
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
