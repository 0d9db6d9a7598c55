"""Deploy overhead on the CT200 twin:

1. wall time of a no-op re-deploy of a profile, next to a bare pyinfra deploy of one no-op
   operation to the same twin, as a ratio measured in the same run;
2. time from `systemctl restart` to healthy-and-identified (the deploy's own wait and checks),
   minus the twin's simulated weight-load and warm-up time.

    make sim-up && make deploy PROFILE=nvfp4-ctx8k
    .venv/bin/python bench/deploy_overhead.py [--profile nvfp4-ctx8k] [--runs 3]

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dsv4deploy.profiles import load_profile  # noqa: E402
from dsv4deploy.remote import connected, on  # noqa: E402
from dsv4deploy.rollout import Target  # noqa: E402
from dsv4deploy.tasks.verify import confirm  # noqa: E402
from dsv4deploy.twin.faults import Faults  # noqa: E402

PYINFRA = str(REPO / ".venv" / "bin" / "pyinfra")


def wall(cmd: list[str]) -> float:
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    took = time.monotonic() - start
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="nvfp4-ctx8k")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    deploy = [PYINFRA, "-y", "inventory/sim.py", "deploy/serve.py", "--data", f"profile={args.profile}"]
    wall(deploy)  # settle: make sure the profile is deployed, so the runs below are no-ops
    with tempfile.TemporaryDirectory() as tmp:
        bare_file = Path(tmp) / "bare.py"
        bare_file.write_text("from pyinfra.operations import files\nfiles.directory(name='noop', path='/tmp')\n")
        bare = [PYINFRA, "-y", "inventory/sim.py", str(bare_file)]
        noop_times = [wall(deploy) for _ in range(args.runs)]
        bare_times = [wall(bare) for _ in range(args.runs)]
    noop, base = statistics.median(noop_times), statistics.median(bare_times)
    print(f"no-op re-deploy of {args.profile}: median {noop:.2f} s  ({', '.join(f'{t:.2f}' for t in noop_times)})")
    print(f"bare one-operation pyinfra deploy: median {base:.2f} s  ({', '.join(f'{t:.2f}' for t in bare_times)})")
    print(f"ratio: {noop / base:.2f}x")

    target = Target.of(load_profile(args.profile).data)
    simulated = Faults().load_seconds + Faults().warmup_seconds
    detections = []
    with connected("inventory/sim.py") as hosts:
        h = hosts[0]
        with on(h):
            for _ in range(args.runs):
                h.run_shell_command(f"systemctl reset-failed {target.unit}; systemctl restart {target.unit}")
                start = time.monotonic()
                confirm(h, target, budget_s=600, poll_s=0.5)
                detections.append(time.monotonic() - start - simulated)
    print(f"restart -> healthy + identified, minus the twin's simulated load + warm-up ({simulated:.1f} s): "
          f"median {statistics.median(detections):.2f} s ({', '.join(f'{d:.2f}' for d in detections)}); "
          "this includes SGLang's own ~1 s /health generation and the 0.5 s poll")
    return 0


if __name__ == "__main__":
    sys.exit(main())
