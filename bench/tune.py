"""`dsv4deploy tune` on the CT200 twin, from the campaign's starting point, with the space the
profile ships (its `tune:` block: the layout, one TP4 server or two behind the smg gateway, x the
context lengths, with the campaign's fix 8192, x the memory fraction, 0.85 refused by the budget):

    make sim-up && make deploy PROFILE=nvfp4-ctx8k      # a good release serving first
    .venv/bin/python bench/tune.py [--profile fp8-ctx1m-baseline] [--fresh] [--set KNOB=V1,V2 ...]

    # on an isolated twin fleet of one's own instead of the default twin:
    .venv/bin/python -m ct200twin up --fleet tune --hosts 1
    DSV4_SIM_FLEET=tune DSV4_SIM_LAUNCH_CHECK=twin .venv/bin/pyinfra -y inventory/fleet-sim.py deploy/serve.py \
        --data profile=nvfp4-ctx8k
    DSV4_SIM_FLEET=tune DSV4_SIM_LAUNCH_CHECK=twin .venv/bin/python bench/tune.py --inventory inventory/fleet-sim.py --fresh

Every candidate is deployed as a release and scored by the gate's client at the objective's
concurrency where users reach it (a replica set through its gateway, whether it started fresh or
was rolled). Prints the candidates tried and refused, each one's score and where it was measured
(with a rolled set's per-replica gates beside it), the candidates that did not start for lack of
GPU memory, the wall time, and the best profile found and its throughput at C=64 against the
campaign's 531.7 tok/s. Asserts nothing. The last line:
`tune: best=NAME tok_s=X wall_s=Y tried=N refused=M oom=K`.
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
    ap.add_argument("--state-dir", help="passed to dsv4deploy tune (default .cache/tune)")
    ap.add_argument("--reports-dir", help="passed to dsv4deploy tune (default reports)")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=V1,V2",
                    help="passed to dsv4deploy tune (replaces that knob's tune.space entry), e.g. "
                         "--set server.context_length=8192 (default: the profile's own space)")
    args = ap.parse_args()
    cli = [str(REPO / ".venv" / "bin" / "dsv4deploy"), "tune", args.profile, "--inventory", args.inventory,
           *(w for s in args.set for w in ("--set", s)),
           *(["--state-dir", args.state_dir] if args.state_dir else []),
           *(["--reports-dir", args.reports_dir] if args.reports_dir else [])]
    plan = json.loads(subprocess.run([*cli, "--plan", "--json"], cwd=REPO, capture_output=True, text=True,
                                     check=True).stdout)
    start = time.monotonic()
    lines = []
    with subprocess.Popen([*cli, *(["--fresh"] if args.fresh else [])], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as run:
        for line in run.stdout:         # the search's progress, as it goes
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    wall = time.monotonic() - start
    if run.returncode != 0:
        print(f"tune failed (exit {run.returncode}) after {wall:.0f} s")
        return 1
    report = next(Path(line.strip()) for line in lines if line.strip().endswith("tune.json"))
    doc = json.loads((REPO / report if not report.is_absolute() else report).read_text())
    cands = doc.get("candidates", [])
    tried = [c for c in cands if c.get("trials")]
    refused = [c for c in cands if c.get("status") == "refused"]
    print(f"\ncandidates: {len(cands)}; measured {len(tried)}; refused by the validator/budget {len(refused)} "
          f"(never started: {', '.join(c['id'] for c in refused) or 'none'})")
    best_tok, chosen, oom = 0.0, doc.get("chosen"), []
    for c in tried:
        tok = max(t["measurement"]["output_throughput"] for t in c["trials"])
        if c["id"] == chosen:     # its highest level: the gate's own level, as `make deploy` measures it
            best_tok = max(c["trials"], key=lambda t: t["level"])["measurement"]["output_throughput"]
        print(f"  {c['id']:5} {json.dumps(c.get('overrides') or {}):64} {tok:7.1f} tok/s  {c['status']}: {c['why']}")
        for t in c["trials"]:
            m = t["measurement"]
            oom += [c["id"]] if m.get("out_of_memory") else []
            alone = ", ".join(f"replica {g['replica']} alone {g['output_throughput']:.1f}" for g in m.get("per_replica") or [])
            split = m.get("requests_per_replica") or []
            early = (f" (passed early: {m.get('completed')} of {m.get('num_prompts')} requests)"
                     if m.get("passed_early") else "")
            print(f"        level {t['level']}: {m['output_throughput']:7.1f} tok/s{early} {m.get('scope') or ''}"
                  + (f", requests per replica {split}" if split else "") + (f" (rolled: {alone})" if alone else ""))
    print(f"wall time {wall:.0f} s; verdict: {doc.get('verdict')}")
    print(f"did not start for lack of GPU memory: {', '.join(sorted(set(oom))) or 'none'}")
    best = next((c for c in cands if c["id"] == chosen), None)
    layout = (best or {}).get("overrides", {}).get("replicas.count", 1) if best else None
    print(f"best: {doc.get('tuned_profile') or 'none (the base stays)'}"
          + (f" ({layout} replica{'s' if layout != 1 else ''})" if layout else "")
          + f" at {best_tok:.1f} tok/s at C={doc.get('method', {}).get('concurrency')} (campaign: {CAMPAIGN} tok/s; "
          f"{'at or above' if best_tok >= CAMPAIGN else 'below'})")
    name = Path(doc["tuned_profile"]).stem if doc.get("tuned_profile") else "none"
    print(f"tune: best={name} tok_s={best_tok:.1f} wall_s={wall:.0f} tried={len(tried)} refused={len(refused)} "
          f"oom={len(set(oom))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
