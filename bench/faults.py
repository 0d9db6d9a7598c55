"""The fault matrix (issue 12) on the CT200 twin: each fault from a clean, good release
(nvfp4-ctx8k deployed), one row per fault: where it strikes, what the tool did, the release
serving afterwards, whether the history is consistent, whether anything was lost, and the time
until a release that passed its gate served again.

    make sim-up
    .venv/bin/python bench/faults.py [--only 1,6,12] [--keep]

    # or on an isolated twin of one's own (its own network namespace, docs/fleet.md):
    .venv/bin/python -m ct200twin up --fleet faults --hosts 1
    .venv/bin/python bench/faults.py --fleet faults

The first run wipes the twin's releases (venv and weights stay) and deploys nvfp4-ctx8k with its
own gate; each fault then deploys its own variant (ct200twin/faultlab/variants.py VARIANTS: the
baseline with another context length and a one-level gate; fault 6 a fresh one for each cut, so
that every cut run takes the steps the run that listed them took, the launch check included) and
runs the same deploy again once the fault is gone. "Recovered" is defined in docs/faults.md. Fault
14 deploys a replica set (nvfp4-ctx8k-dp2 behind smg) and strikes its gateway and a replica;
fault 15 (ct200twin/faultlab/converge.py) three TP2 replicas: a crash mid-roll, a shrink, a
rollback across an smg change, a cut before the gateway's restart, a tampered kept profile.
Prints figures; asserts nothing; the last line is `faults: N/M recovered`, where a row counts only
when every strike it lists struck: a strike that did not land (its step never came) is printed as
DID NOT STRIKE, and named on that line too.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ct200twin import faultlab  # noqa: E402
from ct200twin.host.layout import check_fleet  # noqa: E402
from ct200twin.host.machines import SimError, SimHost, down, up  # noqa: E402

COLUMNS = ["#", "fault", "strikes at", "what the tool did", "serving after", "history", "lost",
           "recover s", "recovered"]


def table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for cells in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def reboot(twin) -> None:
    """The host reboots: its container is stopped (systemd shuts down) and booted again."""
    down([twin.index], fleet=twin.fleet)
    up(twin.index, fleet=twin.fleet)


def where(fleet: str | None, launch_check: str | None) -> tuple[str, dict]:
    """(the inventory, the environment) of the lab's deploys: the default twin's, or those of
    FLEET's twin 1 (inventory/fleet-sim.py, DSV4_SIM_FLEET), with the launch check's parser
    (DSV4_SIM_LAUNCH_CHECK, ct200twin/host/stand_ins.py) when one is named."""
    env = {"DSV4_SIM_LAUNCH_CHECK": launch_check} if launch_check else {}
    if fleet is None:
        return "inventory/sim.py", env
    return "inventory/fleet-sim.py", {**env, "DSV4_SIM_FLEET": fleet}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated fault numbers (default: all)")
    ap.add_argument("--keep", action="store_true", help="do not wipe the twin's releases first")
    ap.add_argument("--outputs", help="folder to write every run's output to (one file per run)")
    ap.add_argument("--fleet", metavar="NAME",
                    help="strike the isolated twin NAME-1 (`python -m ct200twin up --fleet NAME`), not the default twin")
    ap.add_argument("--launch-check", choices=("twin", "sglang"),
                    help="the parser of the deploys' launch check (DSV4_SIM_LAUNCH_CHECK); default: with --fleet "
                         "the twin's, as the lab's tests (tests/sim_fixtures.py LAB_ENV), else the environment's")
    args = ap.parse_args(argv)
    try:
        only = {int(x) for x in args.only.split(",")} if args.only else None
    except ValueError:
        print(f"faults: --only takes fault numbers like 1,6,12, not {args.only!r}", file=sys.stderr)
        return 2
    if only and not only <= set(range(1, 16)):
        print(f"faults: no fault {sorted(only - set(range(1, 16)))}: the matrix has 1-15", file=sys.stderr)
        return 2
    try:
        twin = SimHost(1, check_fleet(args.fleet) if args.fleet is not None else None)
    except SimError as exc:
        print(f"faults: --fleet: {exc}", file=sys.stderr)
        return 2
    if not twin.running():
        start = "make sim-up" if args.fleet is None else f"python -m ct200twin up --fleet {args.fleet} --hosts 1"
        print(f"faults: {twin.name} is not running: start it with `{start}`", file=sys.stderr)
        return 1
    try:
        return strike(args, twin, only)
    finally:        # the lab's fast start and faults stay on no twin after it: other benches time the start
        twin.run(f"rm -f {faultlab.FAULTS}", check=False)


def strike(args, twin, only: set[int] | None) -> int:
    profiles = faultlab.write_profiles(Path(tempfile.mkdtemp(prefix="faults-profiles-")), faultlab.VARIANTS)
    launch_check = args.launch_check or (os.environ.get("DSV4_SIM_LAUNCH_CHECK") if args.fleet is None else "twin")
    inventory, env = where(args.fleet, launch_check)
    lab = faultlab.Lab(twin, profiles, baseline="nvfp4-ctx8k", inventory=inventory, env=env)
    print(f"twin: {twin.name} ({inventory}{''.join(f', {k}={v}' for k, v in env.items())})", flush=True)
    if not args.keep:
        lab.wipe()
    t0 = time.monotonic()
    base = lab.baseline()
    print(f"baseline: release {base.release['release']:04d} nvfp4-ctx8k serving "
          f"({time.monotonic() - t0:.1f} s)", flush=True)
    rows, details = [], []
    for fn in faultlab.ALL:
        number = int(fn.__name__.split("_")[1])
        if only and number not in only:
            continue
        t = time.monotonic()
        if fn is faultlab.fault_12:
            row = fn(lab, reboot=lambda: reboot(twin))
        else:
            row = fn(lab)
        verdict = "recovered" if row.recovered else "DID NOT STRIKE" if row.not_struck else "NOT recovered"
        print(f"fault {number}: {verdict} ({time.monotonic() - t:.0f} s)"
              f"{'' if row.recovered else ': ' + '; '.join(row.not_struck + row.why_not)}", flush=True)
        rows.append(row)
        if args.outputs:
            folder = Path(args.outputs)
            folder.mkdir(parents=True, exist_ok=True)
            for key, text in row.outputs.items():
                (folder / f"{number:02d}-{''.join(c if c.isalnum() else '-' for c in key)[:80]}.log").write_text(text)
        details += row.details
    lab.baseline()
    print()
    print(table([r.cells() for r in rows]))
    if details:
        print()
        print("\n".join(details))
    missed = [f"fault {r.number}: {why}" for r in rows for why in r.not_struck]
    if missed:          # proves nothing either way: said apart, not as recovered and not as a failure
        print("\nDID NOT STRIKE (no evidence either way):\n" + "\n".join(f"- {m}" for m in missed))
    print(f"\nTotal {time.monotonic() - t0:.0f} s.")
    print(faultlab.summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
