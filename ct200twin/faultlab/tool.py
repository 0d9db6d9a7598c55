"""Running the tool as a user does (`pyinfra -y inventory/sim.py deploy/serve.py`), and striking
it at a step boundary: every fault drives the real command, never an import of it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(REPO / ".venv" / "bin" / "pyinfra")
OP_LINE = "--> Starting operation: "


def run(cmd: list[str], env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def deploy_argv(profile: str, *extra: str, dry: bool = False, inventory: str = "inventory/sim.py") -> list[str]:
    mode = ["--dry", "--diff"] if dry else ["-y"]
    return [PYINFRA, *mode, inventory, "deploy/serve.py", "--data", f"profile={profile}",
            "--data", "health_poll_s=0.5", *extra]


def deploy(profile: str, *extra: str, env=None, dry=False, profiles_dir=None, timeout: int = 600,
           inventory: str = "inventory/sim.py"):
    env = {**(env or {}), **({"DSV4_PROFILES_DIR": str(profiles_dir)} if profiles_dir else {})}
    return run(deploy_argv(profile, *extra, dry=dry, inventory=inventory), env=env, timeout=timeout)


def changed_ops(output: str) -> list[str]:
    """Names of operations that reported Success (i.e. changed something)."""
    names, current = [], None
    for line in output.splitlines():
        if line.startswith(OP_LINE.rstrip()):
            current = line.split(":", 1)[1].strip()
        elif line.strip().endswith("] Success") and current:
            names.append(current)
    return names


def operations(output: str) -> list[str]:
    """Every operation the run started, in order (the step boundaries a strike can hit)."""
    return [line[len(OP_LINE):].strip() for line in output.splitlines() if line.startswith(OP_LINE)]


@dataclass
class Run:
    """A finished run of the tool: exit code, its whole output, where a strike hit, its wall time."""

    rc: int
    output: str
    struck: str | None = None
    wall_s: float = 0.0
    pid: int = 0


def deploy_and_strike(profile: str, strike: Callable[[str, int], bool] | None, action: Callable, *,
                      profiles_dir=None, env=None, timeout: float = 600, extra: tuple = (),
                      on_line: Callable[[str], None] | None = None, inventory: str = "inventory/sim.py") -> Run:
    """Run a deploy, watch its output for "--> Starting operation: <step>" and call
    `action(popen, step)` once, at the first step for which `strike(step, index)` is true."""
    env = {**(env or {}), **({"DSV4_PROFILES_DIR": str(profiles_dir)} if profiles_dir else {})}
    return strike_run(deploy_argv(profile, *extra, inventory=inventory), strike, action, env=env, timeout=timeout,
                      on_line=on_line)


def strike_run(argv: list[str], strike: Callable[[str, int], bool] | None, action: Callable | None, *,
               env: dict | None = None, timeout: float = 600, on_line: Callable[[str], None] | None = None) -> Run:
    """deploy_and_strike for any command that prints pyinfra's operation lines (ARGV, run in the
    repository in its own session): `Run.struck` is the step the action ran at, None when no step
    the command started matched."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    timer = threading.Timer(timeout, lambda: p.poll() is None and os.killpg(p.pid, signal.SIGKILL))
    timer.start()
    lines, struck, index = [], None, 0
    try:
        for line in p.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)
            if line.startswith(OP_LINE) and struck is None and strike is not None:
                step = line[len(OP_LINE):].strip()
                if strike(step, index):
                    struck = step
                    action(p, step)
                index += 1
        rc = p.wait()
    finally:
        timer.cancel()
    return Run(rc=rc, output="".join(lines), struck=struck, wall_s=time.monotonic() - t0, pid=p.pid)


def step_key(step: str) -> str:
    """A step's name without its parenthesised details (a restart names its reasons and the
    release number, which differ from run to run)."""
    return step.split(" (")[0].strip()


def cut_missed(step: str, run: Run) -> str | None:
    """Why a strike at STEP did not land on RUN, or None when it did. A step the run never started
    (a step that runs only when its inputs change, as the launch check) is said so by name: such a
    cut is no evidence of recovery, and not a failure to recover either."""
    if run.struck is not None:
        return None
    key = step_key(step)
    started = [s for s in operations(run.output) if step_key(s) == key]
    if not started:
        group = key.split(" | ")[0].lower()         # what the run's plan says of it ("plan: launch check: ...")
        said = next((line.split("plan: ", 1)[1].strip() for line in run.output.splitlines()
                     if f"plan: {group}" in line.lower()), None)
        return (f"did not strike at {key!r}: the run (exit {run.rc}) never started that step "
                f"(it started {len(operations(run.output))} others)" + (f"; it said: {said}" if said else ""))
    return f"did not strike at {key!r}: the run (exit {run.rc}) started it, but ended before the strike landed"


def deploy_watching(profile: str, on_line: Callable[[str], None], *, profiles_dir=None, timeout: float = 600,
                    env=None, inventory: str = "inventory/sim.py") -> Run:
    """A deploy whose every output line is handed to ON_LINE as it comes (a strike at a message,
    not at a step boundary)."""
    return deploy_and_strike(profile, None, None, profiles_dir=profiles_dir, timeout=timeout, on_line=on_line,
                             env=env, inventory=inventory)


def while_paused(action: Callable[[], object]) -> Callable[[subprocess.Popen, str], None]:
    """A strike that runs ACTION with the deploy stopped (SIGSTOP to its process group, SIGCONT
    after): the deploy's next command waits for the fault, however slow this machine is. Without
    it a fault struck at a step's start raced that step's own commands, and on a loaded 2-core
    CI runner the restart won now and then (fault 10's GPUs vanished after the server had read
    them)."""
    def strike(p: subprocess.Popen, _step: str = "") -> None:
        os.killpg(p.pid, signal.SIGSTOP)
        try:
            _wait_stopped(p.pid)
            action()
        finally:
            os.killpg(p.pid, signal.SIGCONT)
    return strike


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until PID is seen stopped (kill() returns once the signal is sent, not once it has taken
    effect: on a loaded machine the deploy ran on for a moment), or has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in "TtZX":
            return
        time.sleep(0.002)
    raise TimeoutError(f"the deploy (pid {pid}) did not stop within {timeout:.0f} s of SIGSTOP")


def kill(p: subprocess.Popen, _step: str = "") -> None:
    """The control process dies at once (SIGKILL to pyinfra: its SSH connection drops with it)."""
    os.kill(p.pid, signal.SIGKILL)
