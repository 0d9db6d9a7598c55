#!/usr/bin/env python3
"""Both gate runners on one twin server, every level to its end: the built-in client and SGLang's
bench_serving (from the server's venv, as the gate account), and how far apart they came out.

    python -m ct200twin up --fleet bs --hosts 1
    DSV4_SIM_FLEET=bs .venv/bin/pyinfra -y inventory/fleet-sim.py deploy/serve.py --data profile=nvfp4-ctx8k
    .venv/bin/python bench/gate_runners.py --fleet bs [--profile nvfp4-ctx8k] [--rounds 2]

    .venv/bin/python bench/gate_runners.py --fleet bs --early-pass   # each runner: early pass vs full

The twin must serve PROFILE already (a deploy of it; its venv the real host's lock, i.e. the
default DSV4_SIM_LAUNCH_CHECK=sglang). Prints one Markdown table per round (tokens and tok/s of
both runners per level, bench_serving's gap to the built-in client) and the largest gap. With
--early-pass: each runner's gate as a deploy runs it, in full and with its early pass, on the same
server: the gate's wall time, each level's figure and what it rests on, and whether the verdicts
agree.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ct200twin.host import gate_runs  # noqa: E402
from ct200twin.host.machines import SimHost  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", required=True, help="the isolated twin fleet whose twin 1 serves PROFILE")
    ap.add_argument("--profile", default="nvfp4-ctx8k")
    ap.add_argument("--profiles-dir", default="profiles", type=Path)
    ap.add_argument("--rounds", type=int, default=1, help="run both runners this many times")
    ap.add_argument("--early-pass", action="store_true", help="each runner's early pass against its full gate")
    args = ap.parse_args()
    twin = SimHost(1, args.fleet)
    spec, server = gate_runs.deployed_server(args.profile, args.profiles_dir)
    if args.early_pass:
        return early_pass(twin, spec, server, args.profile)
    gaps = []
    for n in range(args.rounds):
        t0 = time.monotonic()
        results = gate_runs.run_both(twin, spec, server)
        pairs = gate_runs.agreements(results)
        print(f"\nround {n + 1}: {args.profile} on {twin.name}, {time.monotonic() - t0:.0f} s "
              f"(bench_serving: {results['bench_serving'].client.get('runner_choice')})\n")
        print(gate_runs.HEADER)
        for pair in pairs:
            print(pair.row())
            gaps.append(abs(pair.throughput_gap))
        for runner, res in results.items():
            if res.error or any(lv.status != "ok" for lv in res.levels):
                print(f"{runner}: {res.error or [(lv.label, lv.status, lv.reason) for lv in res.levels]}")
    if gaps:
        print(f"\nlargest throughput gap: {100 * max(gaps):.2f}% over {len(gaps)} level runs")
    return 0


def with_floors(spec, floors: dict[int, float]):
    return replace(spec, levels=tuple(replace(lv, min_output_throughput=floors.get(lv.concurrency, lv.min_output_throughput))
                                      for lv in spec.levels))


def early_pass(twin, spec, server, profile: str) -> int:
    """Each runner's gate in full and with its early pass (gate_runs.early_and_full), one table; then
    bench_serving's with floors 10% below what the full run served (no level clears the 25% margin:
    each runs its first round, then in full: what that extra round costs)."""
    rows, walls = [], []
    cases = [(runner, runner, spec) for runner in gate_runs.RUNNERS]
    served = None
    while cases:
        name, runner, case = cases.pop(0)
        runs = gate_runs.early_and_full(twin, case, server, runner)
        rows += gate_runs.early_rows(name, runs)
        (full_s, full), (early_s, early) = runs["full"], runs["early"]
        same = "same" if (full.passed, [lv.passed for lv in full.verdict.levels]) == \
            (early.passed, [lv.passed for lv in early.verdict.levels]) else "DIFFERENT"
        walls.append(f"{name}: gate {full_s:.1f} s in full, {early_s:.1f} s with the early pass "
                     f"({early_s / full_s:.2f}); {'PASS' if full.passed else 'FAIL'} -> "
                     f"{'PASS' if early.passed else 'FAIL'} ({same})")
        print(walls[-1], flush=True)
        if runner == "bench_serving" and served is None:
            served = {lv.concurrency: lv.output_throughput for lv in full.result.levels}
            near = with_floors(spec, {c: round(x / 1.1, 1) for c, x in served.items()})
            cases.append(("bench_serving, floors 10% below", runner, near))
    print(f"\n{profile} on {twin.name}\n")
    print(gate_runs.EARLY_HEADER)
    print("\n".join(rows))
    print("\n" + "\n".join(walls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
