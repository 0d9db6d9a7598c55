"""The lab: a booted twin with a clean, good release to strike at, put back before each fault so
that no fault's row depends on the one before."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ct200twin.server.faults import DEFAULT_PATH as TWIN_FAULTS
from ct200twin.faultlab.reading import release_files, releases, wait_no_processes
from ct200twin.faultlab.recovered import Serving, judge, passed, serving
from ct200twin.faultlab.rows import Row
from ct200twin.faultlab.tool import PYINFRA, Run, deploy, run

FAULTS = TWIN_FAULTS          # the twin server's fault file (twin/faults.py)
# The twin's simulated weight load + warm-up (3 s + 1.5 s by default), shortened: every start,
# restart and rollback waits for it, and none of them measures it.
FAST_START = {"load_seconds": 0.5, "warmup_seconds": 0.3}


class Lab:
    """A booted twin with a clean, good release to strike at: `baseline()` puts it back."""

    def __init__(self, twin, profiles_dir: Path, baseline: str = "nvfp4-ctx8k", log=print, any_good: bool = False,
                 rerun: bool = True, inventory: str = "inventory/sim.py", env: dict | None = None):
        self.twin = twin
        self.profiles = profiles_dir
        self.base = baseline
        self.log = log
        self.any_good = any_good    # tests: any release that passed its gate is a clean start
        self.rerun = rerun          # tests: faults that end with a good release serving skip the re-run
        self.inventory, self.env = inventory, dict(env or {})   # an isolated twin: inventory/fleet-sim.py

    # setup
    def reset_host(self) -> None:
        """No faults, CT200's GPUs, no leftover service or mount, and FAST_START."""
        self.twin.run(f"rm -f {FAULTS}; systemctl stop stale-sglang.service 2>/dev/null; "
                      "systemctl reset-failed 2>/dev/null; true", check=False)
        self.twin.write_file(FAULTS, json.dumps(FAST_START))
        self.twin.set_gpus(reset=True)

    def wipe(self) -> None:
        """A fresh host: no release, no service (the venv and the weights stay: they are not state)."""
        self.twin.run(f"rm -f {FAULTS}; systemctl disable --now sglang.service stale-sglang.service "
                      "sglang-gateway.service 'sglang@*.service' 2>/dev/null; systemctl reset-failed 2>/dev/null; "
                      "rm -rf /var/lib/dsv4deploy /etc/dsv4deploy /etc/systemd/system/sglang.service "
                      "/etc/systemd/system/sglang@.service /etc/systemd/system/sglang-gateway.service; "
                      "systemctl daemon-reload", check=False)
        self.reset_host()

    @property
    def where(self) -> dict:
        """What a deploy of this lab needs besides its profile: profiles, inventory, environment."""
        return {"profiles_dir": self.profiles, "inventory": self.inventory, "env": self.env}

    def deploy(self, profile: str | None = None, **kw) -> Run:
        t0 = time.monotonic()
        kw.setdefault("inventory", self.inventory)
        kw["env"] = {**self.env, **(kw.get("env") or {})}
        out = deploy(profile or self.base, profiles_dir=self.profiles, **kw)
        return Run(rc=out.returncode, output=out.stdout + out.stderr, wall_s=time.monotonic() - t0)

    def baseline(self) -> Serving:
        """The baseline profile's release serving: as is, restored by a rollback, or deployed."""
        self.reset_host()
        now = serving(self.twin)
        if now.good and not now.problems and (self.any_good or now.release["profile"] == self.base):
            return now
        recs = releases(self.twin)
        by_number = {r["release"]: r for r in recs}
        kept = release_files(self.twin)
        good = [r for r in recs if r["profile"] == self.base and passed(r, by_number) and r["release"] in kept]
        if good:
            out = run([PYINFRA, "-y", self.inventory, "deploy/rollback.py", "--data", f"to={good[-1]['release']}",
                       "--data", "health_poll_s=0.5"], env=self.env)     # what `make rollback TO=N` runs
            if out.returncode == 0 and serving(self.twin).good:
                return serving(self.twin)
        out = self.deploy(self.base)
        now = serving(self.twin)
        if out.rc != 0 or not now.good or now.release["profile"] != self.base:
            raise RuntimeError(f"cannot establish the baseline {self.base}: exit {out.rc}\n{out.output[-3000:]}")
        return now

    def faults(self, **knobs) -> None:
        self.twin.write_file(FAULTS, json.dumps({**FAST_START, **knobs}))

    # judging
    def after(self, first: Run, within_s: float = 10.0) -> tuple[Serving, list[str]]:
        """Right after the faulty run: what serves, and what of ours is still running (after a
        short grace: a killed run's commands see their session go within a second or two)."""
        left, _ = wait_no_processes(self.twin, within_s=within_s)
        return serving(self.twin), left

    def judge(self, row: Row, first: Run, state: tuple[Serving, list[str]], *, t0: float,
              before: dict[int, str], rerun: Run | None, expect: list[str] = (),
              spared: set[int] = frozenset()) -> Row:
        """recovered.judge on this lab's twin: the checks live with the rest of "recovered"."""
        return judge(self.twin, row, first, state, t0=t0, before=before, rerun=rerun, expect=expect,
                     spared=spared)


def start(lab: Lab) -> tuple[float, dict[int, str]]:
    lab.baseline()
    return time.monotonic(), release_files(lab.twin)
