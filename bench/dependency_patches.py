"""What each of the two patches of a dependency saves per deploy run, on an isolated twin:

- pyinfra's operation order read from the frames instead of inspect.stack() (order_from_stack,
  installed when dsv4deploy.tasks is imported);
- SSH session channels opened one ahead of the command that takes them (SessionsAhead, which
  replaces the connection's paramiko open_session; the deploy files call sessions_ahead first).

    .venv/bin/python -m ct200twin up --fleet ovh --hosts 1
    DSV4_SIM_FLEET=ovh .venv/bin/pyinfra -y inventory/fleet-sim.py deploy/serve.py --data profile=nvfp4-ctx8k
    .venv/bin/python bench/dependency_patches.py [--fleet ovh] [--runs 10] [--changes 4] [--rtt-ms 0 30]

Every run is a re-deploy with `pyinfra -y inventory/fleet-sim.py` (DSV4_SIM_FLEET=FLEET: never
the default twin): RUNS no-op re-deploys of the deployed profile, then CHANGES deploys that change
only the unit (as bench/deploy_overhead.py does: service.timeout_stop_s alternates, the gate is
one short level), each with a copy of deploy/serve.py: as it is ("both"), with pyinfra's own
ordering put back after the import ("no order patch"), or with sessions_ahead left out (Nagle
still turned off, as every command does: "no sessions ahead"). The three alternate. Besides its
wall time and CPU time (the pyinfra process's), each run reports from inside the time its
operations' ordering took (summed over the calls) and the time its commands waited for an SSH
channel (the open_session calls, summed): what the patches act on, without the run's noise.

`--rtt-ms N` (N > 0): the SSH connection goes through a ProxyCommand (this file, --pipe) that
delays every byte by N/2 ms each way, to the twin's own address: a link to a host N ms away.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PYINFRA = str(REPO / ".venv" / "bin" / "pyinfra")
MARK = "@@dependency-patches "

# Timers put into the deploy file's copy right after `from dsv4deploy import tasks` (which
# installs the order patch) and the deploy's first call: the run prints what they summed at exit.
TIMERS = '''
import atexit as _b_atexit, importlib as _b_importlib, json as _b_json, sys as _b_sys, time as _b_time
_b_operation = _b_importlib.import_module("pyinfra.api.operation")   # pyinfra.api.operation is the decorator
from dsv4deploy.host.io import ssh_transport as _b_transport
{restore}_b_spent = {{"order_ms": 0.0, "orders": 0, "channel_ms": 0.0, "channels": 0}}
_b_order = _b_operation.get_operation_order_from_stack


def _b_timed_order(state):
    start = _b_time.perf_counter()
    try:
        return _b_order(state)
    finally:
        _b_spent["order_ms"] += (_b_time.perf_counter() - start) * 1000
        _b_spent["orders"] += 1


_b_operation.get_operation_order_from_stack = _b_timed_order
_b_t = _b_transport(host)
_b_open = _b_t.open_session


def _b_timed_open(*args, **kwargs):
    start = _b_time.perf_counter()
    try:
        return _b_open(*args, **kwargs)
    finally:
        _b_spent["channel_ms"] += (_b_time.perf_counter() - start) * 1000
        _b_spent["channels"] += 1


_b_t.open_session = _b_timed_open
_b_atexit.register(lambda: print({mark!r} + _b_json.dumps(_b_spent), file=_b_sys.stderr, flush=True))
'''
RESTORE = ("import pyinfra.api.util as _b_util\n"
           "_b_operation.get_operation_order_from_stack = _b_util.get_operation_order_from_stack\n")
VARIANTS = ("both", "no order patch", "no sessions ahead")


def variant_text(serve: str, variant: str) -> str:
    """deploy/serve.py's text as VARIANT, with the timers."""
    call, anchor = "\nsessions_ahead(host)", "\nfrom dsv4deploy import tasks  # noqa: E402\n"
    if call not in serve or anchor not in serve:
        sys.exit("deploy/serve.py no longer has `sessions_ahead(host)` and `from dsv4deploy import tasks`: "
                 "update bench/dependency_patches.py")
    if variant == "no sessions ahead":
        serve = serve.replace(call, "\nfrom dsv4deploy.host.io import no_delay  # noqa: E402\nno_delay(host)", 1)
    timers = TIMERS.format(restore=RESTORE if variant == "no order patch" else "", mark=MARK)
    return serve.replace(anchor, anchor + timers, 1)


def pipe(host: str, port: int, rtt_ms: float) -> int:
    """ProxyCommand: stdin/stdout <-> HOST:PORT, each direction delayed by RTT_MS / 2."""
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    one_way = rtt_ms / 2000

    def write_out(data: bytes) -> None:
        while data:
            data = data[os.write(1, data):]

    def relay(read, write, close) -> None:
        due: queue.Queue = queue.Queue()

        def deliver() -> None:
            while True:
                at, data = due.get()
                wait = at - time.monotonic()
                if wait > 0:                  # read once: a second reading could be past AT already
                    time.sleep(wait)
                if not data:
                    close()
                    return
                write(data)

        sender = threading.Thread(target=deliver, daemon=True)
        sender.start()
        while True:
            try:
                data = read()
            except OSError:
                data = b""
            due.put((time.monotonic() + one_way, data))
            if not data:
                break
        sender.join()

    up = threading.Thread(target=relay, args=(lambda: os.read(0, 65536), sock.sendall,
                                              lambda: sock.shutdown(socket.SHUT_WR)), daemon=True)
    up.start()
    relay(lambda: sock.recv(65536), write_out, lambda: os.close(1))
    return 0


def slow_inventory(folder: Path, address: str, rtt_ms: float) -> tuple[str, dict]:
    """An inventory of the fleet whose SSH goes through pipe() (ssh_config_file: ProxyCommand)."""
    from ct200twin.host.layout import known_hosts_file

    config = folder / "ssh_config"
    config.write_text(f"Host {address}\n  ProxyCommand {sys.executable} {Path(__file__).resolve()} --pipe %h %p "
                      f"{rtt_ms:g}\n  UserKnownHostsFile {known_hosts_file()}\n")
    inventory = folder / "slow_fleet.py"
    inventory.write_text(
        "import runpy\n"
        f"_fleet = runpy.run_path({str(REPO / 'inventory' / 'fleet-sim.py')!r})\n"
        f"fleet = [(name, {{**data, 'ssh_config_file': {str(config)!r}}}) for name, data in _fleet['fleet']]\n")
    return str(inventory), {}


HUNG: list[str] = []      # runs that did not end within RUN_TIMEOUT_S (killed, run again)
RUN_TIMEOUT_S = 120


def one_run(argv: list[str], env: dict) -> tuple[float, dict]:
    """(wall s, the run's own timers plus its CPU s) of one pyinfra run; a run that hangs (seen
    once in a while through the ProxyCommand) is killed with its process group and run again."""
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            HUNG.append(" ".join(argv))
            continue
        took = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        break
    else:
        sys.exit(f"hung three times: {' '.join(argv)}")
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{stdout[-2000:]}{stderr[-2000:]}")
    inside = [json.loads(line[len(MARK):]) for line in stderr.splitlines() if line.startswith(MARK)]
    if not inside:
        sys.exit(f"no timers in the output of {' '.join(argv)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, {**inside[-1], "cpu_s": cpu}


SHORT_GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 8, num_prompts: 16, input_len: 64, output_len: 32, min_output_throughput: 10}
"""


def measure(fleet: str, profile: str, runs: int, changes: int, rtt_ms: float, folder: Path) -> tuple[dict, dict]:
    from ct200twin.host.twin_host import SimHost

    twin = SimHost(1, fleet)
    if not twin.running():
        sys.exit(f"{twin.name} is not running: python -m ct200twin up --fleet {fleet} --hosts 1")
    env = {**os.environ, "DSV4_SIM_FLEET": fleet}
    inventory = str(REPO / "inventory" / "fleet-sim.py")
    if rtt_ms:
        inventory, _ = slow_inventory(folder, twin.address, rtt_ms)
    serve = (REPO / "deploy" / "serve.py").read_text()
    files = {}
    for variant in VARIANTS:
        files[variant] = folder / f"serve-{variant.replace(' ', '-')}.py"
        files[variant].write_text(variant_text(serve, variant))
    argv = lambda v, p=profile: [PYINFRA, "-y", inventory, str(files[v]), "--data", f"profile={p}"]  # noqa: E731
    one_run(argv("both"), env)     # settle: the runs below change nothing
    got: dict = {v: [] for v in VARIANTS}
    for _ in range(runs):
        for variant in VARIANTS:       # alternating: the same conditions for each
            got[variant].append(one_run(argv(variant), env))
    changed: dict = {v: [] for v in VARIANTS}
    profiles = folder / "profiles"
    profiles.mkdir()
    for path in (REPO / "profiles").glob("*.yaml"):
        (profiles / path.name).write_text(path.read_text())
    n = 0
    for _ in range(changes):
        for variant in VARIANTS:
            n += 1
            (profiles / "unit-only.yaml").write_text(
                f"extends: {profile}\ndescription: unit-only change for bench/dependency_patches.py\n"
                f"service:\n  timeout_stop_s: {119 - n % 2}\n{SHORT_GATE}")
            changed[variant].append(one_run(argv(variant, "unit-only"), {**env, "DSV4_PROFILES_DIR": str(profiles)}))
    one_run(argv("both"), env)     # leave the profile deployed
    return got, changed


def summary(got: dict) -> dict:
    out = {}
    for variant, rows in got.items():
        walls = [w for w, _ in rows]
        out[variant] = {"wall_s": statistics.median(walls), "walls": walls,
                        "cpu_s": statistics.median(r["cpu_s"] for _, r in rows),
                        "order_ms": statistics.median(r["order_ms"] for _, r in rows),
                        "orders": rows[0][1]["orders"],
                        "channel_ms": statistics.median(r["channel_ms"] for _, r in rows),
                        "channels": rows[0][1]["channels"]}
    return out


def report(title: str, s: dict) -> None:
    print(title)
    for variant, r in s.items():
        print(f"  {variant:<18} wall {r['wall_s']:.3f} s ({', '.join(f'{w:.2f}' for w in r['walls'])}); "
              f"CPU {r['cpu_s']:.3f} s; ordering {r['orders']} operations {r['order_ms']:.1f} ms; "
              f"{r['channels']} channels waited for {r['channel_ms']:.1f} ms")
    both, order, ahead = s["both"], s["no order patch"], s["no sessions ahead"]
    print(f"  order patch saves: {order['order_ms'] - both['order_ms']:.1f} ms inside the run, "
          f"{(order['cpu_s'] - both['cpu_s']) * 1000:.0f} ms of CPU, "
          f"{(order['wall_s'] - both['wall_s']) * 1000:.0f} ms of wall time")
    print(f"  sessions ahead saves: {ahead['channel_ms'] - both['channel_ms']:.1f} ms of channel waits, "
          f"{(ahead['wall_s'] - both['wall_s']) * 1000:.0f} ms of wall time")


def main() -> int:
    if sys.argv[1:2] == ["--pipe"]:
        return pipe(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", default="ovh", help="the isolated twins' fleet (twin 1 is used)")
    ap.add_argument("--profile", default="nvfp4-ctx8k")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--changes", type=int, default=4, help="unit-only changes per variant")
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0])
    args = ap.parse_args()
    results = {}
    for rtt in args.rtt_ms:
        with tempfile.TemporaryDirectory(prefix="dependency-patches-") as tmp:
            noop, changed = measure(args.fleet, args.profile, args.runs, args.changes, rtt, Path(tmp))
        for kind, got, count in (("no-op re-deploys", noop, args.runs), ("unit-only changes", changed, args.changes)):
            if not count:
                continue
            s = summary(got)
            results[f"{rtt:g} ms {kind}"] = s
            report(f"RTT +{rtt:g} ms, {count} {kind} of {args.profile} per variant (medians):", s)
    if HUNG:
        print(f"{len(HUNG)} run(s) hung past {RUN_TIMEOUT_S} s, killed and run again (not in the figures)")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
