"""Faults on the CT200 twin: run a deploy, strike at a step, and judge how it ended.

Shared by `bench/faults.py` (the table of issue 12), `tests/test_faults_twin.py` (one test per
row) and `tests/test_deploy_twin.py` (the deploy helpers). Everything here drives the real
command a user runs (`pyinfra -y inventory/sim.py deploy/serve.py`) and reads the twin over SSH.

"Recovered" (docs/faults.md): a release that passed its gate is serving, or the tool exited
non-zero with a message that says what happened and what to do; no release is left `pending`
after the next run; no release is recorded `deployed` without a passed gate; earlier releases'
files are intact; a re-run converges without manual cleanup; no process of ours outlives the run
that started it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(REPO / ".venv" / "bin" / "pyinfra")
FAULTS = "/etc/dsv4deploy-twin/faults.json"
RELEASES_DIR = "/var/lib/dsv4deploy/releases"
MANIFEST = "/etc/dsv4deploy/sglang/manifest.json"
LOCK = "/var/lib/dsv4deploy/deploy.lock"
GATE_USER = "dsv4deploy-gate"
OP_LINE = "--> Starting operation: "
# The twin's simulated weight load + warm-up (3 s + 1.5 s by default), shortened: every start,
# restart and rollback waits for it, and none of them measures it.
FAST_START = {"load_seconds": 0.5, "warmup_seconds": 0.3}

QUICK_GATE = """gate:
  levels:
    - {concurrency: 1, num_prompts: 2, input_len: 256, output_len: 32, min_output_throughput: 10}
    - {concurrency: 16, num_prompts: 16, input_len: 256, output_len: 32, min_output_throughput: 120}
    - {concurrency: 64, num_prompts: 64, input_len: 256, output_len: 32, min_output_throughput: 300}
"""
# One short level: enough to prove the server answers at speed, for faults that are not about the gate.
TINY_GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 8, num_prompts: 8, input_len: 64, output_len: 16, min_output_throughput: 10}
"""


def variant(context_length: int, gate: str = TINY_GATE, extra: str = "", base: str = "nvfp4-ctx8k") -> str:
    """A test profile: `base` with its own context length (which the twin's fault file can match
    with match_argv, so a fault hits this release and not the one a rollback restores)."""
    return f"extends: {base}\nserver:\n  context_length: {context_length}\n{extra}{gate}"


def write_profiles(folder: Path, variants: dict[str, str]) -> Path:
    """The shipped profiles plus `variants` ({name: yaml}) in `folder` (DSV4_PROFILES_DIR)."""
    folder.mkdir(parents=True, exist_ok=True)
    for src in (REPO / "profiles").glob("*.yaml"):
        (folder / src.name).write_text(src.read_text())
    for name, text in variants.items():
        (folder / f"{name}.yaml").write_text(text)
    return folder


# --- running the tool ---------------------------------------------------------------------------

def run(cmd: list[str], env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def deploy_argv(profile: str, *extra: str, dry: bool = False) -> list[str]:
    mode = ["--dry", "--diff"] if dry else ["-y"]
    return [PYINFRA, *mode, "inventory/sim.py", "deploy/serve.py", "--data", f"profile={profile}",
            "--data", "health_poll_s=0.5", *extra]


def deploy(profile: str, *extra: str, env=None, dry=False, profiles_dir=None, timeout: int = 600):
    env = {**(env or {}), **({"DSV4_PROFILES_DIR": str(profiles_dir)} if profiles_dir else {})}
    return run(deploy_argv(profile, *extra, dry=dry), env=env, timeout=timeout)


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
                      profiles_dir=None, env=None, timeout: float = 600, extra: tuple = ()) -> Run:
    """Run a deploy, watch its output for "--> Starting operation: <step>" and call
    `action(popen, step)` once, at the first step for which `strike(step, index)` is true."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}),
           **({"DSV4_PROFILES_DIR": str(profiles_dir)} if profiles_dir else {})}
    t0 = time.monotonic()
    p = subprocess.Popen(deploy_argv(profile, *extra), cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    timer = threading.Timer(timeout, lambda: p.poll() is None and os.killpg(p.pid, signal.SIGKILL))
    timer.start()
    lines, struck, index = [], None, 0
    try:
        for line in p.stdout:
            lines.append(line)
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


def kill(p: subprocess.Popen, _step: str = "") -> None:
    """The control process dies at once (SIGKILL to pyinfra: its SSH connection drops with it)."""
    os.kill(p.pid, signal.SIGKILL)


# --- reading the twin ---------------------------------------------------------------------------

def releases(twin) -> list[dict]:
    out = twin.run(f"cat {RELEASES_DIR}/*/status.json 2>/dev/null | python3 -c "
                   "\"import sys,json; d=sys.stdin.read().replace('}\\n{', '}\\x00{'); "
                   "print(json.dumps([json.loads(x) for x in d.split('\\x00') if x.strip()]))\"", check=False)
    return sorted(json.loads(out.stdout or "[]"), key=lambda r: r["release"])


def health(twin) -> str:
    return twin.run("curl -s -o /dev/null -w '%{http_code}' --max-time 20 http://127.0.0.1:30000/health",
                    check=False).stdout


def served_context(twin):
    info = json.loads(twin.run("sed 's/^/Authorization: Bearer /' /etc/dsv4deploy/secrets/sglang-api-key | "
                               "curl -s -H @- http://127.0.0.1:30000/server_info").stdout)
    return info["context_length"]


def live_venv(twin) -> str:
    return json.loads(twin.run(f"cat {MANIFEST}").stdout)["venv"]


def main_pid(twin) -> int:
    return int(twin.run("systemctl show -p MainPID --value sglang.service").stdout.strip() or 0)


def live_manifest_sha(twin) -> str | None:
    out = twin.run(f"sha256sum {MANIFEST} 2>/dev/null", check=False).stdout.split()
    return out[0] if out else None


# Processes our runs started on the host: everything in an SSH session's cgroup (or sshd's own,
# without logind) except sshd itself and this check's own session, plus anything of the gate's
# user or in a transient dsv4deploy unit. The server (sglang.service) is not "ours" in this sense:
# systemd owns it and the release history says what it is.
_OURS = r"""
me=$(cat /proc/self/cgroup | cut -d: -f3-)
for d in /proc/[0-9]*; do
  p=${d#/proc/}; [ "$p" = "$$" ] && continue
  cg=$(cut -d: -f3- "$d/cgroup" 2>/dev/null) || continue
  u=$(stat -c %U "$d" 2>/dev/null) || continue
  a=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)
  [ -n "$a" ] || continue
  case "$cg" in
    "$me") continue;;
    */sglang.service|*/sglang@*) [ "$u" = "GATE" ] || continue;;
    */session-*|*/ssh.service|*/dsv4deploy*) ;;
    *) [ "$u" = "GATE" ] || continue;;
  esac
  case "$a" in "sshd: "*|"/usr/sbin/sshd -D"*|"sshd: /usr/sbin/sshd"*) continue;; esac
  echo "$p $u $cg $a"
done
""".replace("GATE", GATE_USER)


def our_processes(twin) -> list[str]:
    """'PID user cgroup argv' of every process of ours still on the host."""
    out = twin.run(["sh", "-c", _OURS], check=False).stdout
    return [line for line in out.splitlines() if line.strip()]


def wait_no_processes(twin, within_s: float = 10.0) -> tuple[list[str], float]:
    """Our processes still there after `within_s` (empty: none), and when the last one went."""
    t0 = time.monotonic()
    while True:
        left = our_processes(twin)
        if not left or time.monotonic() - t0 >= within_s:
            return left, time.monotonic() - t0
        time.sleep(0.3)


# --- judging ------------------------------------------------------------------------------------

def passed(rec: dict, by_number: dict[int, dict]) -> bool:
    """Did this release pass its gate (a rollback: did the release it restores)?"""
    if rec.get("kind") == "rollback":
        origin = by_number.get(rec.get("restores") or 0)
        return origin is not None and origin is not rec and passed(origin, by_number)
    return bool((rec.get("gate") or {}).get("passed"))


def history_problems(recs: list[dict], serving_sha: str | None = None) -> list[str]:
    """What is wrong with a release history: a release left pending, one recorded deployed (or
    superseded) without a passed gate, two deployed at once, or a healthy server that is not the
    deployed release."""
    by_number = {r["release"]: r for r in recs}
    problems = [f"release {r['release']:04d} left pending" for r in recs if r["status"] == "pending"]
    problems += [f"release {r['release']:04d} is {r['status']} without a passed gate" for r in recs
                 if r["status"] in ("deployed", "superseded") and not passed(r, by_number)]
    live = [r for r in recs if r["status"] == "deployed"]
    if len(live) > 1:
        problems.append("more than one release deployed: " + ", ".join(f"{r['release']:04d}" for r in live))
    if serving_sha and live and live[-1]["manifest_sha256"] != serving_sha:
        problems.append(f"the server answering is not release {live[-1]['release']:04d}'s")
    return problems


def release_files(twin) -> dict[int, str]:
    """sha256 over each release folder's kept files (files/ and profile.json)."""
    out = twin.run(f"cd {RELEASES_DIR} 2>/dev/null && for d in [0-9]*; do "
                   "[ -f $d/profile.json ] || continue; "
                   "h=$(find $d/files $d/profile.json -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum); "
                   "echo \"$d ${h%% *}\"; done", check=False).stdout
    return {int(n): h for n, h in (line.split() for line in out.splitlines() if line.strip())}


def lost_files(before: dict[int, str], after: dict[int, str], recs: list[dict], keep: int = 10,
               spared: set[int] = frozenset()) -> list[str]:
    """Releases whose kept files changed or vanished (pruning beyond the newest `keep` is not loss)."""
    newest = {r["release"] for r in recs[-keep:]}
    return [f"release {n:04d}'s files " + ("changed" if n in after else "are gone")
            for n, h in sorted(before.items()) if n in newest and n not in spared and after.get(n) != h]


@dataclass
class Serving:
    http: str
    release: dict | None       # the deployed record, when the server answering is it
    problems: list[str]

    @property
    def good(self) -> bool:
        return self.http == "200" and self.release is not None

    def describe(self) -> str:
        if self.good:
            r = self.release
            what = f"{r['release']:04d} {r['profile']}"
            return what + (f" (restores {r['restores']:04d})" if r.get("restores") else "")
        return "nothing" if self.http != "200" else "a server no record vouches for"


def serving(twin) -> Serving:
    recs = releases(twin)
    sha = live_manifest_sha(twin)
    code = health(twin)
    live = [r for r in recs if r["status"] == "deployed"]
    rec = live[-1] if live and live[-1]["manifest_sha256"] == sha else None
    by_number = {r["release"]: r for r in recs}
    if rec is not None and not passed(rec, by_number):
        rec = None
    return Serving(http=code, release=rec, problems=history_problems(recs, sha if code == "200" else None))


# --- one fault, judged --------------------------------------------------------------------------

@dataclass
class Row:
    number: str
    fault: str
    strikes: str = ""
    did: str = ""
    serving: str = ""
    history: str = ""
    lost: str = ""
    recover_s: float | None = None
    recovered: bool = False
    why_not: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)   # the runs' output, for tests and debugging

    def cells(self) -> list[str]:
        t = "-" if self.recover_s is None else f"{self.recover_s:.1f}"
        return [self.number, self.fault, self.strikes, self.did, self.serving, self.history, self.lost, t,
                "yes" if self.recovered else "NO: " + "; ".join(self.why_not)[:160]]


# What a run's output says it did, most telling first (one line of the table).
_DID = [
    (r"another deploy holds the lock on this host: PID \d+", "refused: another deploy holds the lock ({m})"),
    (r"preflight refused the host:\s*\n\s*- (.+)", "preflight refused: {g}"),
    (r"rollback to release \d+ failed: .+|release \d+ cannot be restored: .+", "{m}"),
    (r"rolled back: release \d+ \(restores \d+", "{m})"),
    (r"failed the smoke gate: (.+)", "gate failed: {g}"),
    (r"release \d+ \([^)]*\) failed: (.+)", "failed: {g}"),
    (r"release (\d+) deployed:", "release {g} deployed"),
    (r"No space left on device", "stopped at the weights push: No space left on device"),
    (r"checkpoint at \S+ is incomplete: .+", "{m}"),
]


def did(output: str) -> str:
    found = []
    for pattern, fmt in _DID:
        m = re.search(pattern, output)
        if m:
            g = m.group(1) if m.groups() else m.group(0)
            found.append(fmt.format(m=m.group(0).strip(), g=g.strip())[:110])
    if not found:
        return "exit 0, nothing to do" if not output.strip() else "-"
    return "; ".join(found[:2])


class Lab:
    """A booted twin with a clean, good release to strike at: `baseline()` puts it back."""

    def __init__(self, twin, profiles_dir: Path, baseline: str = "nvfp4-ctx8k", log=print, any_good: bool = False,
                 rerun: bool = True):
        self.twin = twin
        self.profiles = profiles_dir
        self.base = baseline
        self.log = log
        self.any_good = any_good    # tests: any release that passed its gate is a clean start
        self.rerun = rerun          # tests: faults that end with a good release serving skip the re-run

    # setup
    def reset_host(self) -> None:
        """No faults, CT200's GPUs, no leftover service or mount, and FAST_START."""
        self.twin.run(f"rm -f {FAULTS}; systemctl stop stale-sglang.service 2>/dev/null; "
                      "systemctl reset-failed 2>/dev/null; true", check=False)
        self.twin.write_file(FAULTS, json.dumps(FAST_START))
        self.twin.set_gpus(reset=True)

    def wipe(self) -> None:
        """A fresh host: no release, no service (the venv and the weights stay: they are not state)."""
        self.twin.run(f"rm -f {FAULTS}; systemctl stop sglang.service stale-sglang.service "
                      "2>/dev/null; systemctl reset-failed 2>/dev/null; rm -rf /var/lib/dsv4deploy /etc/dsv4deploy "
                      "/etc/systemd/system/sglang.service; systemctl daemon-reload", check=False)
        self.reset_host()

    def deploy(self, profile: str | None = None, **kw) -> Run:
        t0 = time.monotonic()
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
            out = run(["make", "rollback", f"TO={good[-1]['release']}", "ARGS=--data health_poll_s=0.5"])
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
        """Fill in a row from the faulty run (`first`, and `state` = after(first)) and the re-run
        that must converge."""
        first_serving, left_first = state
        text = first.output
        row.did = row.did or did(text)
        row.outputs["first"] = text
        why = row.why_not
        if tool_traceback(text):
            why.append("a traceback instead of a message")
        for needle in expect:
            if needle not in text:
                why.append(f"the output does not say {needle!r}")
        if first.rc != 0 and first.struck is None and not _SAYS_WHAT_TO_DO.search(text):
            why.append("failed without saying what to do")
        if first.rc == 0 and not first_serving.good:
            why.append("exit 0 but no release that passed its gate is serving")
        if left_first:
            why.append("left running after the faulty run: " + " | ".join(left_first)[:200])
        if rerun is not None:
            row.outputs["rerun"] = rerun.output
            if rerun.rc != 0:
                why.append(f"the re-run failed (exit {rerun.rc}): {did(rerun.output)}")
            if tool_traceback(rerun.output):
                why.append("the re-run printed a traceback")
        final = serving(self.twin)
        recs = releases(self.twin)
        row.serving = final.describe()
        if not final.good:
            why.append("no release that passed its gate is serving at the end")
        row.history = "consistent" if not final.problems else "; ".join(final.problems)
        why += final.problems
        lost = lost_files(before, release_files(self.twin), recs, spared=spared)
        row.lost = "nothing" if not lost else "; ".join(lost)
        why += lost
        left, _ = wait_no_processes(self.twin, within_s=5.0)
        if left:
            why.append("left running at the end: " + " | ".join(left)[:200])
        if first_serving.good:
            row.recover_s = first.wall_s
        elif final.good:
            row.recover_s = time.monotonic() - t0
        row.recovered = not why
        return row


def tool_traceback(output: str) -> bool:
    """A traceback of the tool itself (the server's own, in the journal lines a failure shows, is
    what the operator needs to see)."""
    return bool(re.search(r'File "(%s|[^"]*/site-packages/pyinfra/)' % re.escape(str(REPO)), output))


# A failed run must say what to do next (deploy again, roll back, stop something, ...) or that it
# already rolled back.
_SAYS_WHAT_TO_DO = re.compile(r"(deploy|run) again|make (deploy|rollback)|stop it|rolled back|free |"
                              r"reboot|break_lock|[Dd]eploy a")


def checkpoint_sha(twin, model_dir: str) -> dict[str, str]:
    out = twin.run(f"cd {model_dir} && sha256sum *.safetensors", check=False).stdout
    return {name: h for h, name in (line.split() for line in out.splitlines() if line.strip())}


def local_checkpoint_sha(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.safetensors"))}


# --- the faults of issue 12 -----------------------------------------------------------------------
# Each fault deploys its own variant of the baseline (its own context length, so the twin's fault
# file hits it and not the release a rollback restores), from the baseline serving.

# Long enough to cut in the middle (the client runs a few seconds), short enough to run twice.
MID_GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 16, num_prompts: 32, input_len: 256, output_len: 128, min_output_throughput: 100}
"""
# A gate client must be gone this soon after its control process was killed (its heartbeat: 1 s).
CUT_GRACE_S = 3.0
REVISION_11 = "1" * 40      # fault 11's variant pins another revision: a new model folder to fill
BUDGET_GATE = """gate:
  budget_s: 10
  early_pass_margin: null
  warmup_requests: 1
  levels:
    - {concurrency: 4, num_prompts: 64, input_len: 256, output_len: 256, min_output_throughput: 10}
"""
VARIANTS = {
    "f1crash": variant(9216),
    "f2never": variant(10240, extra="service:\n  health_timeout_s: 10\n"),
    "f3errors": variant(11264, gate=QUICK_GATE),
    "f4midgate": variant(13312, gate=QUICK_GATE),
    "f5stale": variant(14336),
    "f6cut": variant(15360),
    "f6gate": variant(15872, gate=MID_GATE),
    "f7twice": variant(17408),
    "f8rollback": variant(18432),
    "f9weights": variant(19456),
    "f10gpus": variant(21504),
    "f11disk": variant(22528, extra=f"model:\n  revision: \"{REVISION_11}\"\n"),
    "f12reboot": variant(23552),
    "f13budget": variant(25600, gate=BUDGET_GATE),
    "f13ok": variant(25600),
}
VERIFY_STEP = "Verify | health, identity, smoke gate, record"


def _ctx(name: str) -> str:
    ctx = re.search(r"context_length: (\d+)", VARIANTS[name]).group(1)
    return f"--context-length {ctx}"


def start(lab: Lab) -> tuple[float, dict[int, str]]:
    lab.baseline()
    return time.monotonic(), release_files(lab.twin)


def fault_with_knobs(lab: Lab, number: str, fault: str, name: str, knobs: dict, expect: list[str],
                     strikes: str) -> Row:
    """Faults 1-4: a twin knob that hits the new release only; then the knobs are cleared and the
    same deploy is run again."""
    row = Row(number, fault, strikes=strikes)
    t0, before = start(lab)
    lab.faults(**knobs, match_argv=_ctx(name))
    first = lab.deploy(name)
    state = lab.after(first)
    lab.faults()
    rerun = lab.deploy(name)
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun, expect=expect)


def fault_1(lab):
    return fault_with_knobs(lab, "1", "server crashes at start", "f1crash",
                            {"crash_on_start": "simulated CUDA error"},
                            ["simulated CUDA error", "rolled back: release"], "restart (load)")


def fault_2(lab):
    return fault_with_knobs(lab, "2", "never healthy (budget runs out)", "f2never", {"never_healthy": True},
                            ["not healthy after 10 s", "rolled back: release"], "health wait")


def fault_3(lab):
    return fault_with_knobs(lab, "3", "5% of requests fail in the gate", "f3errors", {"error_rate": 0.05},
                            ["failed the smoke gate", "failed request", "rolled back: release"], "gate")


def fault_4(lab):
    return fault_with_knobs(lab, "4", "server crashes mid-gate", "f4midgate", {"crash_after_requests": 10},
                            ["failed the smoke gate", "rolled back: release"], "gate (after 10 requests)")


def fault_5(lab):
    """A stale server from an old run holds the port: refused by PID before anything changes; the
    operator stops it as told, and the same deploy converges."""
    row = Row("5", "stale server holds the port", strikes="preflight")
    t0, before = start(lab)
    twin = lab.twin
    venv = live_venv(twin)
    twin.run("systemctl stop sglang.service")
    twin.write_file("/etc/dsv4deploy-twin/stale.json", json.dumps({"stale_model_path": "/srv/old-model"}))
    twin.run("systemd-run --unit stale-sglang -E DSV4_TWIN_FAULTS=/etc/dsv4deploy-twin/stale.json "
             f"-E PATH=/usr/bin:/bin {venv}/bin/python -m dsv4deploy.twin.server --model-path /srv/old-model "
             "--port 30000")
    for _ in range(100):
        if health(twin) == "200":
            break
        time.sleep(0.1)
    stale_pid = int(twin.run("systemctl show -p MainPID --value stale-sglang.service").stdout.strip() or 0)
    first = lab.deploy("f5stale")
    state = lab.after(first)
    twin.run("systemctl stop stale-sglang.service", check=False)     # what the message says to do
    rerun = lab.deploy("f5stale")
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun,
                     expect=[f"port 30000 is already held by PID {stale_pid}", "stale server"])


def _strike_mid_gate(lab: Lab):
    """An action for the verify step: kill the control process once the gate client runs on the host."""
    def action(p, _step):
        def wait_and_kill():
            for _ in range(300):
                if p.poll() is not None:
                    return
                if lab.twin.run(f"pgrep -u {GATE_USER}", check=False).stdout.strip():
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            kill(p)
        threading.Thread(target=wait_and_kill, daemon=True).start()
    return action


def step_key(step: str) -> str:
    """A step's name without its parenthesised details (a restart names its reasons and the
    release number, which differ from run to run)."""
    return step.split(" (")[0].strip()


def cut_at(lab: Lab, name: str, step: str | None, mid_gate: bool = False) -> tuple[Run, tuple, Run]:
    """Kill the control process at `step` (or mid-gate), then run the same deploy again."""
    if mid_gate:
        first = deploy_and_strike(name, lambda s, _i: s == VERIFY_STEP, _strike_mid_gate(lab),
                                  profiles_dir=lab.profiles)
        if first.rc != -signal.SIGKILL:
            first.struck = None          # the gate ended before the client was seen: no cut
    else:
        first = deploy_and_strike(name, lambda s, _i: step_key(s) == step_key(step), kill,
                                  profiles_dir=lab.profiles)
    state = lab.after(first, within_s=CUT_GRACE_S)
    rerun = lab.deploy(name)
    return first, state, rerun


def fault_6(lab, steps: list[str] | None = None) -> Row:
    """The control process killed at each step boundary of a rollout (and once in the middle of
    the gate), then the same deploy run again: it converges, nothing is left pending, nothing of
    ours keeps running on the host."""
    row = Row("6", "control process killed (SSH cut)", strikes="")
    if steps is None:
        lab.baseline()
        full = lab.deploy("f6cut")
        steps = operations(full.output)
    cases = [(s, False) for s in steps] + [("the gate, mid-run (f6gate)", True)]
    row.strikes = f"each of {len(steps)} step boundaries + mid-gate"
    t_all, worst, dids = [], [], set()
    for step, mid in cases:
        t0, before = start(lab)
        first, state, rerun = cut_at(lab, "f6gate" if mid else "f6cut", None if mid else step, mid_gate=mid)
        sub = Row("6", f"cut at {step}")
        lab.judge(sub, first, state, t0=t0, before=before, rerun=rerun)
        if first.struck is None:
            sub.why_not.append(f"the run never reached {step!r}")
            sub.recovered = False
        row.details.append(f"  6 cut at {step[:60]:<60} exit {first.rc:>4}  re-run exit {rerun.rc}  "
                           f"{'recovered' if sub.recovered else 'NOT: ' + '; '.join(sub.why_not)[:200]}"
                           f"  ({sub.recover_s or 0:.1f} s)")
        row.outputs[f"cut at {step}"] = first.output
        row.outputs[f"re-run after {step}"] = rerun.output
        if not sub.recovered:
            worst.append(f"{step}: " + "; ".join(sub.why_not))
        if sub.recover_s:
            t_all.append(sub.recover_s)
        row.serving, row.history, row.lost = sub.serving, sub.history, sub.lost
        dids.add("pending settled" if "interrupted" in rerun.output else "")
    row.did = "SIGKILL; re-run settled the cut release and converged"
    row.recover_s = max(t_all) if t_all else None
    row.why_not = worst
    row.recovered = not worst
    return row


def fault_7(lab) -> Row:
    """Two deploys started at once: one refuses with the holder's PID, the other finishes."""
    row = Row("7", "two deploys at once", strikes="deploy lock")
    t0, before = start(lab)
    env = {**os.environ, "DSV4_PROFILES_DIR": str(lab.profiles)}
    procs = [subprocess.Popen(deploy_argv("f7twice"), cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    wall = time.monotonic() - t0
    rcs = [p.returncode for p in procs]
    winners = [i for i in (0, 1) if rcs[i] == 0]
    first = Run(rc=max(rcs), output="\n".join(outs), wall_s=wall)
    if len(winners) != 1:
        row.why_not.append(f"exit codes {rcs}: exactly one deploy must finish")
        loser_text = ""
    else:
        w, loser = winners[0], 1 - winners[0]
        loser_text = outs[loser]
        if f"another deploy holds the lock on this host: PID {procs[w].pid} " not in loser_text:
            row.why_not.append("the refused deploy does not name the holder's PID "
                               f"{procs[w].pid}: {did(loser_text)}")
        first = Run(rc=0, output=outs[w], wall_s=wall)
        row.did = f"one deployed, one {did(loser_text)}"
    state = lab.after(first)
    rerun = lab.deploy("f7twice")
    if changed_ops(rerun.output):
        row.why_not.append("the re-run changed something: " + ", ".join(changed_ops(rerun.output)))
    row.outputs["refused"] = loser_text
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun)


def fault_8(lab, cases=("crash", "files")) -> Row:
    """The release a rollback restores is itself broken: (a) it crashes at start too, (b) its kept
    files are gone. The tool ends with a clear error, records the failed rollback, claims nothing."""
    row = Row("8", "the release a rollback restores is broken", strikes="rollback")
    outs = []
    # (a) every server crashes at start: the new release and the restored one
    if "crash" in cases:
        outs.append(_fault_8a(lab, row))
    if "files" in cases:
        outs.append(_fault_8b(lab, row))
    for label, f, r, sub in outs:
        row.details.append(f"  8 {label:<40} {did(f.output)[:100]}  re-run exit {r.rc}  "
                           f"{'recovered' if sub.recovered else 'NOT: ' + '; '.join(sub.why_not)[:200]}")
        row.outputs[label] = f.output
        row.why_not += sub.why_not
    row.did = did(outs[0][1].output)
    row.serving, row.history, row.lost = outs[-1][3].serving, outs[-1][3].history, outs[-1][3].lost
    row.recover_s = max(s.recover_s or 0 for *_, s in outs) or None
    row.recovered = not row.why_not
    return row


def _fault_8a(lab, row):
    t0, before = start(lab)
    lab.faults(crash_on_start="simulated CUDA error")
    first = lab.deploy("f8rollback")
    state = lab.after(first)
    for needle in ("rollback to release", "failed", "NOTHING IS SERVING"):
        if needle not in first.output:
            row.why_not.append(f"(a) the output does not say {needle!r}")
    lab.faults()
    rerun = lab.deploy("f8rollback")
    sub_a = lab.judge(Row("8a", ""), first, state, t0=t0, before=before, rerun=rerun)
    return ("restored release crashes", first, rerun, sub_a)


def _fault_8b(lab, row):
    """(b) the files of the release it would restore are gone."""
    t0, before = start(lab)
    live = serving(lab.twin).release
    lab.twin.run(f"rm -rf {RELEASES_DIR}/{live['release']:04d}/files")
    lab.faults(crash_on_start="simulated CUDA error", match_argv=_ctx("f8rollback"))
    first_b = lab.deploy("f8rollback")
    state_b = lab.after(first_b)
    for needle in ("cannot be restored", "NOTHING IS SERVING"):
        if needle not in first_b.output:
            row.why_not.append(f"(b) the output does not say {needle!r}")
    lab.faults()
    rerun_b = lab.deploy("f8rollback")
    sub_b = lab.judge(Row("8b", ""), first_b, state_b, t0=t0, before=before, rerun=rerun_b,
                      spared={live["release"]})
    return ("restored release's files removed", first_b, rerun_b, sub_b)


def _model_dir(lab: Lab, name: str = "f9weights") -> str:
    rev = REVISION_11 if name == "f11disk" else "0" * 40
    return f"/srv/dsv4deploy/models/nvidia--DeepSeek-V4-Flash-NVFP4/{rev}"


def fault_9(lab, cases=("truncated", "corrupted")) -> Row:
    """A weight shard on the host truncated, or corrupted with its size kept: the next deploy finds
    it, pushes it again and verifies every shard before the restart."""
    from .checkpoint import CHECKPOINTS
    row = Row("9", "weight shard truncated / corrupted", strikes="weights (rsync source)")
    folder = _model_dir(lab)
    source = local_checkpoint_sha(CHECKPOINTS / "nvidia--DeepSeek-V4-Flash-NVFP4")
    shard = "model-00002-of-00003.safetensors"
    t_rec = []
    strikes = {"truncated": f"truncate -s 1000 {folder}/{shard}",
               "corrupted": f"printf 'XXXXXXXX' | dd of={folder}/{shard} bs=1 seek=4096 conv=notrunc status=none"}
    for how in cases:
        t0, before = start(lab)
        lab.twin.run(strikes[how])
        first = lab.deploy("f9weights")
        state = lab.after(first)
        rerun = lab.deploy("f9weights") if lab.rerun else None
        sub = lab.judge(Row("9", how), first, state, t0=t0, before=before, rerun=rerun)
        if checkpoint_sha(lab.twin, folder) != source:
            sub.why_not.append(f"the {how} shard is still on the host after the re-run")
            sub.recovered = False
        row.details.append(f"  9 shard {how:<10} {did(first.output)[:100]}  "
                           f"{'recovered' if sub.recovered else 'NOT: ' + '; '.join(sub.why_not)[:200]}")
        row.outputs[how] = first.output
        row.why_not += sub.why_not
        if sub.recover_s:
            t_rec.append(sub.recover_s)
        row.serving, row.history, row.lost = sub.serving, sub.history, sub.lost
    row.did = "pushed again and verified before the restart"
    row.recover_s = max(t_rec) if t_rec else None
    row.recovered = not row.why_not
    return row


def fault_10(lab, cases=("before", "vanish")) -> Row:
    """(a) The host shows 2 GPUs for a TP4 profile: refused before any change. (b) Two GPUs vanish
    after the deploy started (at the restart): the server cannot start, the rollback neither; a
    clear error; with the GPUs back the same deploy converges."""
    row = Row("10", "too few GPUs / GPUs vanish mid-deploy", strikes="preflight / restart")
    subs = []
    if "before" in cases:
        subs.append(_fault_10a(lab, row))
    if "vanish" in cases:
        subs.append(_fault_10b(lab, row))
    for label, f, sub in subs:
        row.details.append(f"  10 {label:<36} {did(f.output)[:110]}  "
                           f"{'recovered' if sub.recovered else 'NOT: ' + '; '.join(sub.why_not)[:200]}")
        row.outputs[label] = f.output
        row.why_not += sub.why_not
    row.did = "; then: ".join(did(f.output) for _, f, _ in subs)
    row.serving, row.history, row.lost = subs[-1][2].serving, subs[-1][2].history, subs[-1][2].lost
    row.recover_s = max(sub.recover_s or 0 for *_, sub in subs) or None
    row.recovered = not row.why_not
    return row


def _fault_10a(lab, row):
    t0, before = start(lab)
    lab.twin.set_gpus(count=2)
    first = lab.deploy("f10gpus")
    state = lab.after(first)
    if "tp_size 4 needs 4 GPUs; nvidia-smi lists 2 usable" not in first.output or changed_ops(first.output):
        row.why_not.append("(a) not refused before any change: " + did(first.output))
    lab.twin.set_gpus(reset=True)
    rerun = lab.deploy("f10gpus")
    sub_a = lab.judge(Row("10a", ""), first, state, t0=t0, before=before, rerun=rerun)
    return ("2 of 8 GPUs before the deploy", first, sub_a)


def _fault_10b(lab, row):
    t0, before = start(lab)
    first_b = deploy_and_strike("f10gpus-b", lambda s, _i: s.startswith("Restart | restart"),
                                lambda _p, _s: lab.twin.set_gpus(count=2), profiles_dir=lab.profiles)
    state_b = lab.after(first_b)
    if first_b.struck is None:
        row.why_not.append("(b) the run never reached the restart")
    lab.twin.set_gpus(reset=True)
    rerun_b = lab.deploy("f10gpus-b")
    sub_b = lab.judge(Row("10b", ""), first_b, state_b, t0=t0, before=before, rerun=rerun_b,
                      expect=["needed)"])
    return ("6 of 8 GPUs vanish at the restart", first_b, sub_b)


VARIANTS["f10gpus-b"] = variant(26624)


def fault_11(lab) -> Row:
    """The disk fills while the weights are written (a 64 KiB tmpfs over the new model folder, mounted
    when the weights step starts): the deploy stops before any restart with the error; once space
    is freed the same deploy converges. Bounded: nothing on this machine's disk is filled."""
    row = Row("11", "disk fills during the weights step", strikes="weights")
    folder = _model_dir(lab, "f11disk")
    t0, before = start(lab)
    lab.twin.run(f"umount {folder} 2>/dev/null; rm -rf {folder}", check=False)
    pid = main_pid(lab.twin)

    def fill(_p, _step):
        lab.twin.run(f"mkdir -p {folder} && mount -t tmpfs -o size=64k,mode=0755 dsv4deploy-fault-11 {folder}")

    first = deploy_and_strike("f11disk", lambda s, _i: s.startswith("Weights | push"), fill, profiles_dir=lab.profiles)
    state = lab.after(first)
    if first.struck is None:
        row.why_not.append("the run never reached the weights push")
    if main_pid(lab.twin) != pid:
        row.why_not.append("the server was restarted although the weights failed")
    lab.twin.run(f"umount {folder}", check=False)         # the operator frees the disk
    rerun = lab.deploy("f11disk")
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun, expect=["No space left on device"])


def fault_12(lab, reboot: Callable[[], None], step: str = VERIFY_STEP) -> Row:
    """The host reboots in the middle of a deploy (after the switch, at the verify step): the run
    fails; once the host is back, the same deploy settles the cut release and converges."""
    row = Row("12", "host reboots mid-deploy", strikes=f"at '{step}'")
    t0, before = start(lab)
    first = deploy_and_strike("f12reboot", lambda s, _i: s == step, lambda _p, _s: reboot(),
                              profiles_dir=lab.profiles)
    if first.struck is None:
        row.why_not.append(f"the run never reached {step!r}")
    state = lab.after(first)
    rerun = lab.deploy("f12reboot")
    if "interrupted" not in rerun.output:
        row.why_not.append("the re-run did not settle the release the cut run left pending")
    row.did = f"exit {first.rc}; re-run: {did(rerun.output)}"
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun)


def fault_13(lab) -> Row:
    """The gate's wall-clock budget runs out mid-gate (budget_s 10 s, the least a profile may set, for a level that takes minutes):
    the client stops itself, the gate fails with the budget named and the release rolls back; with
    the budget back to normal (f13ok, same server) the deploy converges."""
    row = Row("13", "gate runs out of wall-clock budget", strikes="gate")
    t0, before = start(lab)
    first = lab.deploy("f13budget")
    state = lab.after(first)
    rerun = lab.deploy("f13ok") if lab.rerun else None
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun,
                     expect=["gate budget", "exhausted during C=4", "rolled back: release"])


def fault_14(_lab=None) -> Row:
    row = Row("14", "replicas: gateway dies / a replica dies mid-update", strikes="-")
    row.did = "not run: replicas are not deployable yet (rollout refuses a replicas: profile)"
    return row


ALL = [fault_1, fault_2, fault_3, fault_4, fault_5, fault_6, fault_7, fault_8, fault_9, fault_10, fault_11,
       fault_12, fault_13]
