"""`dsv4deploy tune` on the CT200 twin, from the campaign's starting point:

    make sim-up && make deploy PROFILE=nvfp4-ctx8k      # a good release serving first
    .venv/bin/python bench/tune.py [--profile fp8-ctx1m-baseline] [--fresh] [--set KNOB=V1,V2 ...]

    # with the layout (one TP4 server, or two behind the smg gateway: all 8 GPUs):
    .venv/bin/python bench/tune.py --fresh --set replicas.count=1,2 --set server.mem_fraction_static=0.70,0.85

Runs the search declared in the profile's `tune:` block (its context lengths include the
campaign's fix, 8192), with every candidate deployed as a release and measured by the gate's
client. Prints the candidates tried and refused, the wall time, the best profile found and its
throughput at C=64 against the campaign's 531.7 tok/s. Asserts nothing. The last line:
`tune: best=NAME tok_s=X wall_s=Y tried=N refused=M`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAMPAIGN = 531.7


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="fp8-ctx1m-baseline")
    ap.add_argument("--inventory", default="inventory/sim.py")
    ap.add_argument("--fresh", action="store_true", help="forget an earlier run's measurements")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=V1,V2",
                    help="passed to dsv4deploy tune (replaces that knob's tune.space entry), e.g. the layout: "
                         "--set replicas.count=1,2 --set server.mem_fraction_static=0.70,0.85")
    args = ap.parse_args()
    cli = [str(REPO / ".venv" / "bin" / "dsv4deploy"), "tune", args.profile, "--inventory", args.inventory,
           *(w for s in args.set for w in ("--set", s))]
    plan = json.loads(subprocess.run([*cli, "--plan", "--json"], cwd=REPO, capture_output=True, text=True,
                                     check=True).stdout)
    start = time.monotonic()
    run = subprocess.run([*cli, *(["--fresh"] if args.fresh else [])], cwd=REPO, text=True, capture_output=True)
    wall = time.monotonic() - start
    sys.stdout.write(run.stdout[-6000:])
    if run.returncode != 0:
        sys.stderr.write(run.stderr[-3000:])
        print(f"tune failed (exit {run.returncode}) after {wall:.0f} s")
        return 1
    report = next(Path(line.strip()) for line in run.stdout.splitlines() if line.strip().endswith("tune.json"))
    doc = json.loads((REPO / report if not report.is_absolute() else report).read_text())
    cands = doc.get("candidates", [])
    tried = [c for c in cands if c.get("trials")]
    refused = [c for c in cands if c.get("status") == "refused"]
    print(f"\ncandidates: {len(cands)}; measured {len(tried)}; refused by the validator/budget {len(refused)} "
          f"(never started: {', '.join(c['id'] for c in refused) or 'none'})")
    best_tok, chosen = 0.0, doc.get("chosen")
    for c in tried:
        tok = max(t["measurement"]["output_throughput"] for t in c["trials"])
        if c["id"] == chosen:     # its highest level: the gate's own level, as `make deploy` measures it
            best_tok = max(c["trials"], key=lambda t: t["level"])["measurement"]["output_throughput"]
        print(f"  {c['id']:5} {json.dumps(c.get('overrides') or {}):64} {tok:7.1f} tok/s  {c['status']}: {c['why']}")
    print(f"wall time {wall:.0f} s; verdict: {doc.get('verdict')}")
    print(f"best: {doc.get('tuned_profile') or 'none (the base stays)'} at {best_tok:.1f} tok/s at C="
          f"{doc.get('method', {}).get('concurrency')} (campaign: {CAMPAIGN} tok/s; "
          f"{'at or above' if best_tok >= CAMPAIGN else 'below'})")
    name = Path(doc["tuned_profile"]).stem if doc.get("tuned_profile") else "none"
    print(f"tune: best={name} tok_s={best_tok:.1f} wall_s={wall:.0f} tried={len(tried)} refused={len(refused)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
