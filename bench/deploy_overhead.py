"""Deploy overhead on the CT200 twin, in one paired run:

1. a no-op re-deploy of a profile next to a bare pyinfra deploy of two `files.directory`
   operations on the same twin (runs alternate, medians compared), and the remote commands a
   no-op sends, counted from pyinfra's own command log (`--debug`: "Running command on");
2. a deploy that changes only the unit: its wall time minus the server's own restart (the old
   server's stop, the twin's simulated load + warm-up) and minus the gate's own duration, as the
   control node timed it (the release's gate.json: `controller_wall_s`, the span every runner
   shares; the figure with the built-in client's own clock, which starts after its python and
   imports, is printed next to it). Its gate is one short level (the profile's full gate adds
   74 s of load and nothing to the overhead: its own duration is subtracted), so it runs CHANGES
   times (the median counts);
3. an automatic rollback (a release whose server crashes at start, a new argv each time, so that
   each pays the launch check): wall time minus the crashing server's own restart (the serving
   server's stop included) and the restored server's own start, CHANGES times; from its `--debug` trace,
   how that splits into before the switch (the old release still serves: the launch check runs
   here), the time nothing serves, and after the restored server is healthy.

    make sim-up && make deploy PROFILE=nvfp4-ctx8k
    .venv/bin/python bench/deploy_overhead.py [--profile nvfp4-ctx8k] [--runs 5] [--changes 3] [--rtt-ms 30]

`--rtt-ms N`: every run reaches the twin through a relay on loopback that delays each byte by
N/2 ms each way (`ct200twin/host/link.py`), so each round trip costs what it would on a link to
a real host N ms away (the bare run pays it too).

Prints figures; asserts nothing. The last line: `no-op: ratio=R commands=N`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dsv4deploy.host.checks import PROBE_MARK  # noqa: E402
from ct200twin.faultlab import FAULTS  # noqa: E402
from ct200twin.host.machines import SimHost  # noqa: E402
from ct200twin.host.layout import known_hosts_file  # noqa: E402
from ct200twin.host.link import DelayRelay  # noqa: E402

PYINFRA = str(REPO / ".venv" / "bin" / "pyinfra")
SHORT_GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 8, num_prompts: 16, input_len: 64, output_len: 32, min_output_throughput: 10}
"""


def timed(cmd: list[str], env: dict | None = None, ok: bool = True) -> tuple[float, str]:
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {})})
    took = time.monotonic() - start
    if ok and out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return took, out.stdout + out.stderr


def timed_lines(cmd: list[str], env: dict | None = None) -> tuple[float, list[tuple[float, str]]]:
    """Run CMD, stamping each output line with its time since the start: (wall, [(t, line)])."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    lines = [(time.monotonic() - start, line) for line in proc.stdout]
    proc.wait()
    return time.monotonic() - start, lines


def first(lines: list[tuple[float, str]], *parts: str, after: float = 0.0, within: bool = False) -> float | None:
    """When the first command holding every one of PARTS was sent (pyinfra --debug), after AFTER.
    WITHIN: PARTS may be on any line of a command that spans several (a record's JSON)."""
    return next((t for t, line in lines if t >= after and (within or "Running command on" in line)
                 and all(p in line for p in parts)), None)


def rollback_phases(lines: list[tuple[float, str]]) -> dict[str, float | None]:
    """From a --debug trace of a deploy that rolled back: the launch check's run, the switch (the
    new release's restart), the restore (its files put back) and the restored server seen
    healthy and its own (its probe, sent as soon as the health poll that saw 200, with the
    identity check in the same command, returns)."""
    check = first(lines, "def sglang_parser()", within=True)     # launch_parser.py's source, in the command
    check_end = next((t for t, line in lines if check is not None and t > check and "Command exit status" in line), None)
    # the switch's one command: the pending record and the unit's files (the old server serves
    # on meanwhile: a few ms counted as nothing serving), then daemon-reload and the restart
    switch = first(lines, "systemctl daemon-reload && { systemctl reset-failed", within=True)
    restore = first(lines, "/files/. / &&", after=switch or 0.0, within=True)
    served = first(lines, PROBE_MARK, after=restore or 0.0, within=True) if restore is not None else None
    return {"launch_check_s": (check_end - check) if check is not None and check_end else None,
            "switch_at": switch, "served_at": served}


def commands_in(log: str) -> int:
    return sum("Running command on" in line for line in log.splitlines())


def last_gate_s(twin: SimHost) -> tuple[float, float]:
    """The newest release's gate (its gate.json): (as the control node timed it, from the gate's
    command to its answer; as its runner's own clock did). bench_serving's own clock is the
    control node's; the built-in client's starts after its python and imports (about 0.07 s on
    the twin), so only the first is the same span on the twin and on a host that runs
    bench_serving."""
    out = twin.run("cat $(ls -d /var/lib/dsv4deploy/releases/[0-9]* | tail -n1)/gate/gate.json").stdout
    result = json.loads(out)["result"]
    own = float(result["wall_s"])
    return float(result.get("client", {}).get("controller_wall_s", own)), own


def own_start_s(twin: SimHost, unit: str = "sglang.service", runs: int = 3, stopped: bool = False) -> float:
    """The server's own restart, measured on the twin itself (no SSH in the loop): from
    `systemctl restart` (the serving server's stop, then the start) to /health answering 200,
    polled every 50 ms. STOPPED: a start with nothing to stop (a rollback restores after the
    crashed server is gone). The median of RUNS."""
    go = f"systemctl stop {unit}; systemctl reset-failed {unit}; s=$(date +%s%N); systemctl start {unit}" if stopped \
        else f"systemctl reset-failed {unit}; s=$(date +%s%N); systemctl restart {unit}"
    script = (f"{go}; i=0; "
              "until [ \"$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:30000/health)\" = 200 ]; "
              "do i=$((i+1)); [ $i -gt 1200 ] && exit 1; sleep 0.05; done; echo $(( ($(date +%s%N) - s) / 1000000 ))")
    return statistics.median(int(twin.run(script).stdout.strip()) / 1000 for _ in range(runs))


def own_crash_s(twin: SimHost, unit: str = "sglang.service", runs: int = 3) -> float:
    """How long a server that crashes at start (the twin's crash_on_start) runs before systemd
    sees it exit, measured on the twin: from `systemctl restart` of a serving server (its stop
    included, as in a deploy's switch) to the unit's state, polled every 50 ms, showing the exit.
    The median of RUNS, each from a healthy server; the serving release is started again
    afterwards."""
    script = (f"systemctl reset-failed {unit}; s=$(date +%s%N); systemctl restart {unit}; i=0; "
              f"until systemctl show -p ActiveState -p SubState {unit} | grep -qE '=(failed|auto-restart|inactive)$'; "
              "do i=$((i+1)); [ $i -gt 1200 ] && exit 1; sleep 0.05; done; echo $(( ($(date +%s%N) - s) / 1000000 ))")
    took = []
    for _ in range(runs):
        own_start_s(twin, unit, runs=1)                 # a serving server, which the restart stops
        twin.write_file(FAULTS, json.dumps({"crash_on_start": "simulated CUDA error"}))
        try:
            took.append(int(twin.run(script).stdout.strip()) / 1000)
        finally:
            twin.run(f"rm -f {FAULTS}")
    own_start_s(twin, unit, runs=1)
    return statistics.median(took)


def slow_link(stack: contextlib.ExitStack, twin: SimHost, rtt_ms: float) -> str:
    """An inventory of TWIN reached through a DelayRelay that adds RTT_MS to every round trip
    (its host key pinned for the relay's port: checking stays on). Lives as long as STACK."""
    relay = stack.enter_context(DelayRelay((twin.address, 0), (twin.address, 22), rtt_s=rtt_ms / 1000))
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="slow-link-")))
    keys = [line.split(None, 1)[1] for line in known_hosts_file().read_text().splitlines()
            if line.split(None, 1)[0] == twin.address]
    (tmp / "known_hosts").write_text("".join(f"[{twin.address}]:{relay.port} {key}\n" for key in keys))
    (tmp / "slow_link.py").write_text(
        "import runpy\n"
        f"_sim = runpy.run_path({str(REPO / 'inventory' / 'sim.py')!r})\n"
        f"twins = [(name, {{**data, 'ssh_port': {relay.port}, 'ssh_known_hosts_file': {str(tmp / 'known_hosts')!r}}})\n"
        "         for name, data in _sim['twins']]\n")
    return str(tmp / "slow_link.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="nvfp4-ctx8k")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--changes", type=int, default=3, help="unit-only changes and rollbacks measured (median)")
    ap.add_argument("--rtt-ms", type=float, default=0.0,
                    help="reach the twin through a relay adding this round-trip time (a link to a real host)")
    args = ap.parse_args()
    twin = SimHost(1)
    if not twin.running():
        sys.exit("twin-1 is not running: make sim-up && make deploy PROFILE=" + args.profile)
    if twin.run(f"test -e {FAULTS} && cat {FAULTS}", check=False).stdout.strip():
        # a fault file left behind (an interrupted faults.py or rolling.py) would change the server's
        # start this bench subtracts: its fast start read 2.5 s instead of 6.2 s
        print(f"removed {FAULTS} left on the twin: {twin.run(f'cat {FAULTS}').stdout.strip()}")
        twin.run(f"rm -f {FAULTS}")
    with contextlib.ExitStack() as stack:
        inventory = slow_link(stack, twin, args.rtt_ms) if args.rtt_ms else "inventory/sim.py"
        if args.rtt_ms:
            print(f"every run through a relay adding {args.rtt_ms:g} ms to each round trip (ct200twin/host/link.py)")
        return measure(args, twin, inventory)


def measure(args, twin: SimHost, inventory: str) -> int:
    deploy = [PYINFRA, "-y", inventory, "deploy/serve.py", "--data", f"profile={args.profile}"]
    timed(deploy)  # settle: the profile is deployed, so the runs below are no-ops
    with tempfile.TemporaryDirectory() as tmp:
        bare_file = Path(tmp) / "bare.py"
        bare_file.write_text("from pyinfra.operations import files\n"
                             "files.directory(name='one', path='/var/lib/dsv4deploy')\n"
                             "files.directory(name='two', path='/etc/dsv4deploy')\n")
        bare = [PYINFRA, "-y", inventory, str(bare_file)]
        noop_times, bare_times = [], []
        for _ in range(args.runs):                       # paired: alternate, same conditions
            noop_times.append(timed(deploy)[0])
            bare_times.append(timed(bare)[0])
        _, log = timed([*deploy, "--debug"])
        _, bare_log = timed([*bare, "--debug"])
    noop, base = statistics.median(noop_times), statistics.median(bare_times)
    commands, bare_commands = commands_in(log), commands_in(bare_log)
    print(f"no-op re-deploy of {args.profile}: median {noop:.2f} s ({', '.join(f'{t:.2f}' for t in noop_times)}); "
          f"{commands} remote commands")
    print(f"bare two-operation pyinfra deploy: median {base:.2f} s ({', '.join(f'{t:.2f}' for t in bare_times)}); "
          f"{bare_commands} remote commands")

    # 2. only the unit changes: a profile that differs from the deployed one in the unit alone
    start_s = own_start_s(twin)
    crash_s = own_crash_s(twin)                          # crash_on_start exits after the load
    restore_s = own_start_s(twin, stopped=True)          # a rollback's restored start: nothing left to stop
    print(f"the twin server's own restart (systemctl restart -> /health 200, measured on the twin): {start_s:.2f} s; "
          f"a crashing one's (restart -> exit seen by systemd): {crash_s:.2f} s; a start with nothing to stop: "
          f"{restore_s:.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        env = {"DSV4_PROFILES_DIR": tmp}
        for name in os.listdir(REPO / "profiles"):
            (Path(tmp) / name).write_text((REPO / "profiles" / name).read_text())
        overheads, own_clock, rollbacks, downtimes = [], [], [], []
        contexts = random.Random().sample(range(16384, 32768, 64), args.changes)
        for i in range(args.changes):
            (Path(tmp) / "unit-only.yaml").write_text(
                f"extends: {args.profile}\ndescription: unit-only change for bench/deploy_overhead.py\n"
                f"service:\n  timeout_stop_s: {119 - i % 2}\n{SHORT_GATE}")
            took, _ = timed([PYINFRA, "-y", inventory, "deploy/serve.py", "--data", "profile=unit-only"], env)
            gate_s, gate_own_s = last_gate_s(twin)
            overheads.append(took - start_s - gate_s)
            own_clock.append(took - start_s - gate_own_s)
            print(f"unit-only change: {took:.2f} s = server restart {start_s:.2f} s + gate {gate_s:.2f} s + "
                  f"overhead {overheads[-1]:.2f} s (the gate by its client's own clock: {gate_own_s:.2f} s, "
                  f"overhead {own_clock[-1]:.2f} s)")

            # 3. automatic rollback: the next release crashes at start; the tool restores unit-only.
            # A new argv each time (an argv a release on this venv passed is not parsed again), so
            # that every rollback pays the launch check, as a first deploy of a new argv does (a
            # context this twin saw in an earlier run shows as "the launch check not run")
            context = contexts[i]
            (Path(tmp) / "crashes.yaml").write_text(
                f"extends: unit-only\ndescription: crashes at start (bench)\nserver:\n  context_length: {context}\n")
            twin.write_file(FAULTS, json.dumps({"crash_on_start": "simulated CUDA error",
                                                "match_argv": f"--context-length {context}"}))
            try:
                took, lines = timed_lines([PYINFRA, "-y", inventory, "deploy/serve.py", "--data",
                                           "profile=crashes", "--debug"], env)
            finally:
                twin.run(f"rm -f {FAULTS}")
            out = "".join(line for _, line in lines)
            restored = "rolled back" in out or "restored" in out
            rollbacks.append(took - crash_s - restore_s)
            print(f"automatic rollback ({'restored' if restored else 'NOT restored'}): {took:.2f} s = "
                  f"crashing restart {crash_s:.2f} s + restored start {restore_s:.2f} s + overhead {rollbacks[-1]:.2f} s")
            ph = rollback_phases(lines)
            if ph["switch_at"] is not None and ph["served_at"] is not None:
                down = ph["served_at"] - ph["switch_at"]
                downtimes.append(down - crash_s - restore_s)
                check = f"{ph['launch_check_s']:.2f} s" if ph["launch_check_s"] is not None else "not run"
                print(f"  of it: before the switch {ph['switch_at']:.2f} s (the launch check {check}; the old "
                      f"release serves), nothing serving {down:.2f} s (overhead {downtimes[-1]:.2f} s), after "
                      f"{took - ph['served_at']:.2f} s (the probe, the records; the restored release serves)")
    print(f"unit-only change overhead: median {statistics.median(overheads):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in overheads)}; a bare pyinfra run: {base:.2f} s; the gate "
          f"by its client's own clock: median {statistics.median(own_clock):.2f} s)")
    print(f"automatic rollback overhead: median {statistics.median(rollbacks):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in rollbacks)}; a bare pyinfra run: {base:.2f} s)")
    if downtimes:
        print(f"automatic rollback, time nothing serves beyond the two starts: median "
              f"{statistics.median(downtimes):.2f} s ({', '.join(f'{t:.2f}' for t in downtimes)})")
    timed(deploy)   # leave the profile deployed
    print(f"no-op: ratio={noop / base:.2f} commands={commands}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
