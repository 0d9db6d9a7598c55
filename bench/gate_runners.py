#!/usr/bin/env python3
"""Both gate runners on one twin server, every level to its end: the built-in client and SGLang's
bench_serving (from the server's venv, as the gate account), and how far apart they came out.

    python -m ct200twin up --fleet bs --hosts 1
    DSV4_SIM_FLEET=bs .venv/bin/pyinfra -y inventory/fleet-sim.py deploy/serve.py --data profile=nvfp4-ctx8k
    .venv/bin/python bench/gate_runners.py --fleet bs [--profile nvfp4-ctx8k] [--rounds 2]

The twin must serve PROFILE already (a deploy of it; its venv the real host's lock, i.e. the
default DSV4_SIM_LAUNCH_CHECK=sglang). Prints one Markdown table per round (tokens and tok/s of
both runners per level, bench_serving's gap to the built-in client) and the largest gap.
"""

from __future__ import annotations

import argparse
import sys
import time
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
    args = ap.parse_args()
    twin = SimHost(1, args.fleet)
    spec, server = gate_runs.deployed_server(args.profile, args.profiles_dir)
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


if __name__ == "__main__":
    sys.exit(main())
