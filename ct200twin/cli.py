"""``python -m ct200twin ...``: the CT200 twin's command line (up, down, status, gpus, hub, ssh).

The twin's own entry point (``ct200twin/__main__.py``): the product's ``dsv4deploy`` command
knows nothing of it. ``build_parser()`` makes the parser; every leaf sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Callable

from ct200twin.host import machines as simhost
from ct200twin.host.machines import SimError, SimHost

PROG = "python -m ct200twin"


def _at_least(minimum: int, what: str):
    """argparse type: an integer >= minimum."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}: {value}")
        return value
    return parse


_positive = _at_least(1, "at least 1")
_non_negative = _at_least(0, "0 or more")


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a test's captured stream can be closed)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _setup_logging() -> None:
    logger = logging.getLogger("ct200twin.host")
    if not logger.handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("sim: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def wrapper(args: argparse.Namespace) -> int:
        _setup_logging()
        try:
            return fn(args)
        except SimError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
    wrapper.__name__ = fn.__name__
    return wrapper


def _fleet(args: argparse.Namespace) -> str | None:
    """--fleet NAME, or --isolated (the fleet named fleet), or None: the default twins."""
    from ct200twin.host.layout import DEFAULT_FLEET, check_fleet

    name = getattr(args, "fleet", None)
    if name is None and getattr(args, "isolated", False):
        name = DEFAULT_FLEET
    return None if name is None else check_fleet(name)


@_guard
def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    fleet = _fleet(args)
    twins = simhost.up(args.hosts, timeout=args.timeout, rebuild=args.rebuild, fleet=fleet)
    for h in twins:
        print(f"{h.name}\t{h.address}\tpid {h.pid}\tssh root@{h.address}")
    inventory = "inventory/sim.py" if fleet is None else \
        f"inventory/fleet-sim.py{'' if fleet == 'fleet' else f' (DSV4_SIM_FLEET={fleet})'}"
    print(f"up in {time.monotonic() - t0:.1f} s; inventory: {inventory}", file=sys.stderr)
    return 0


@_guard
def cmd_down(args: argparse.Namespace) -> int:
    stopped = simhost.down(args.host or None, timeout=args.timeout, purge=args.purge, fleet=_fleet(args))
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


@_guard
def cmd_status(args: argparse.Namespace) -> int:
    fleet = _fleet(args)
    rows = simhost.status(check_ssh=not args.no_ssh, fleet=fleet)
    if args.json:
        print(json.dumps({"sim_dir": str(simhost.sim_dir()), "rootfs_ready": simhost.rootfs_ready(),
                          "known_hosts": str(simhost.known_hosts_file()),
                          "ssh_key": str(simhost.client_key()), **({"fleet": fleet} if fleet else {}),
                          "twins": rows}, indent=2))
        return 0
    if not rows:
        how = "make sim-up" if fleet is None else f"{PROG} up --fleet {fleet} --hosts N"
        print(f"no twins{f' in fleet {fleet}' if fleet else ''} (state in {simhost.sim_dir()}); start one with `{how}`")
        return 0
    width = max(8, *(len(r["name"]) for r in rows))
    print(f"{'NAME':<{width}} {'ADDRESS':<15} {'PID':>8}  {'STATE':<8} SSH")
    for r in rows:
        ssh = "-" if not r["running"] or args.no_ssh else ("ok" if r["ssh"] else "unreachable")
        print(f"{r['name']:<{width}} {r['address'] or '-':<15} {r['pid'] or '-':>8}  "
              f"{'running' if r['running'] else 'stopped':<8} {ssh}")
    return 0


@_guard
def cmd_gpus(args: argparse.Namespace) -> int:
    h = SimHost(args.host, _fleet(args))
    changes = dict(count=args.count, memory_mib=args.memory_mib, memory_used_mib=args.memory_used_mib,
                   driver_version=args.driver, name=args.name, compute_cap=args.compute_cap)
    if args.no_driver and args.driver:
        raise SimError("--driver and --no-driver exclude each other", 2)
    if args.no_driver:
        changes["driver_installed"] = False
    if args.reset or any(v is not None for v in changes.values()):
        settings = h.set_gpus(reset=args.reset, **changes)
    else:
        if not h.exists():
            raise SimError(f"{h.name} does not exist; run `{PROG} up --hosts {h.index}` first")
        settings = h.gpus()
    print(json.dumps(settings, indent=1, sort_keys=True))
    return 0


@_guard
def cmd_ssh(args: argparse.Namespace) -> int:
    h = SimHost(args.host, _fleet(args))
    if not h.running():
        fleet = f"--fleet {h.fleet} " if h.fleet else ""
        raise SimError(f"{h.name} is not running; run `{PROG} up {fleet}--hosts {h.index}`")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    argv = h.ssh_argv(" ".join(command) if command else None)
    if args.print:
        import shlex
        print(shlex.join(argv))
        return 0
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return 1  # not reached


@_guard
def cmd_hub(args: argparse.Namespace) -> int:
    """Serve the folders below --root as model repos until SIGTERM or Ctrl-C."""
    import signal
    from pathlib import Path

    from ct200twin.host.checkpoint import CHECKPOINTS, make_checkpoint
    from ct200twin.host.hub import NO_XET, Hub, HubFaults, read_token_file

    root = Path(args.root) if args.root else CHECKPOINTS
    for repo in args.make or []:
        if "/" not in repo:
            raise SimError(f"--make {repo!r}: expected a repo id org/name", 2)
        make_checkpoint(repo, root=root)
    if not root.is_dir():
        raise SimError(f"--root {root}: not a folder (make a stand-in with --make ORG/NAME)", 2)
    token = None
    if args.token_file:
        try:
            token = read_token_file(args.token_file)
        except ValueError as exc:
            raise SimError(f"--token-file {exc}", 2) from None
    faults = HubFaults()
    if args.faults:
        try:
            faults = HubFaults.from_dict(json.loads(Path(args.faults).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise SimError(f"--faults {args.faults}: {exc}", 2) from None
    hub = Hub(root, token=token, faults=faults, cdn_host=args.cdn_host)
    repos = hub.repos()
    try:
        server = hub.start(args.host, args.port)
    except OSError as exc:
        raise SimError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    for repo_id, repo in sorted(repos.items()):
        print(f"{repo_id}\t{repo.commit}\t{len(repo.files)} files")
    print(f"hub at {hub.url} (HF_ENDPOINT={hub.url}); root {root}; "
          f"{'token required' if token else 'no token'}", file=sys.stderr)
    print(NO_XET, file=sys.stderr)
    if args.ready_file:
        doc = {"url": hub.url, "pid": os.getpid(), "repos": {r: v.commit for r, v in repos.items()}}
        tmp = Path(args.ready_file + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, args.ready_file)
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        hub.stopping.set()
        server.server_close()
    return 0


def _fleet_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", metavar="NAME", help="the isolated twins NAME-1..NAME-N, each in its own network "
                                                   "namespace (docs/fleet.md), instead of the default twins")
    p.add_argument("--isolated", action="store_true", help="the same as --fleet fleet")


def build_parser() -> argparse.ArgumentParser:
    """The twin's commands: up, down, status, gpus, hub, ssh."""
    p = argparse.ArgumentParser(prog=PROG, description="The CT200 twin: local Debian hosts booted with "
                                "systemd-nspawn. Bring twins up and down, inspect them, set their GPUs.")
    sp = p.add_subparsers(dest="sim_command", metavar="COMMAND", required=True)

    u = sp.add_parser("up", help="start twins 1..N (build the cached root the first time); needs root")
    u.add_argument("--hosts", type=_positive, default=1, metavar="N", help="number of twins (default 1)")
    u.add_argument("--timeout", type=float, default=simhost.SSH_WAIT_S, metavar="S",
                   help="seconds to wait for ssh (default %(default)s)")
    u.add_argument("--rebuild", action="store_true", help="rebuild the cached Debian root first")
    _fleet_options(u)
    u.set_defaults(func=cmd_up)

    d = sp.add_parser("down", help="stop twins by their recorded nspawn PID; needs root")
    d.add_argument("--host", type=_positive, action="append", metavar="N",
                   help="only twin N (repeatable; default all)")
    d.add_argument("--timeout", type=float, default=simhost.STOP_WAIT_S, metavar="S",
                   help="seconds before SIGKILL (default %(default)s)")
    d.add_argument("--purge", action="store_true", help="also delete the twins' roots")
    _fleet_options(d)
    d.set_defaults(func=cmd_down)

    s = sp.add_parser("status", help="list twins: address, PID, running, ssh reachable")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--no-ssh", action="store_true", help="skip the ssh probe")
    _fleet_options(s)
    s.set_defaults(func=cmd_status)

    g = sp.add_parser("gpus", help="set what nvidia-smi reports in a twin (no option: show)")
    g.add_argument("--host", type=_positive, default=1, metavar="N", help="twin number (default 1)")
    g.add_argument("--count", type=_non_negative, metavar="N", help="number of GPUs")
    g.add_argument("--memory-mib", type=_positive, metavar="MIB", help="memory per GPU")
    g.add_argument("--memory-used-mib", type=_non_negative, metavar="MIB", help="memory in use per GPU")
    g.add_argument("--driver", metavar="VERSION", help="driver version (installs nvidia-smi)")
    g.add_argument("--no-driver", action="store_true", help="no driver: remove nvidia-smi")
    g.add_argument("--name", metavar="NAME", help="GPU product name")
    g.add_argument("--compute-cap", metavar="X.Y", help="compute capability")
    g.add_argument("--reset", action="store_true", help="start from CT200's defaults")
    _fleet_options(g)
    g.set_defaults(func=cmd_gpus)

    hb = sp.add_parser("hub", help="a local Hugging Face Hub serving stand-in checkpoints (HF_ENDPOINT for the twin)",
                       description="Serve every ORG--NAME folder below --root as the model repo ORG/NAME at a commit "
                                   "derived from its content (branch main); see ct200twin/host/hub.py.")
    hb.add_argument("--port", type=_non_negative, default=8765, metavar="P", help="port (0: any free; default 8765)")
    hb.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    hb.add_argument("--root", metavar="DIR", help="folder of ORG--NAME repos (default .sim/checkpoints)")
    hb.add_argument("--token-file", metavar="F", help="require 'Authorization: Bearer <the token in F>'")
    hb.add_argument("--faults", metavar="JSON", help="faults file: cut, cut_times, corrupt, stall, fail, rate "
                    "(also PUT /_sim/faults while running)")
    hb.add_argument("--make", action="append", metavar="ORG/NAME", help="make the stand-in checkpoint first")
    hb.add_argument("--cdn-host", default="localhost", metavar="NAME",
                    help="host name of the 302s for LFS files: this server under another name (default localhost; "
                         "an isolated twin knows this machine as sim-host: --host its veth address)")
    hb.add_argument("--ready-file", metavar="F", help="write {url, pid, repos} here once listening")
    hb.set_defaults(func=cmd_hub)

    h = sp.add_parser("ssh", help="ssh into a twin (host-key checking on)")
    h.add_argument("--host", type=_positive, default=1, metavar="N", help="twin number (default 1)")
    h.add_argument("--print", action="store_true", help="print the ssh command instead")
    _fleet_options(h)
    h.add_argument("command", nargs=argparse.REMAINDER, help="command to run")
    h.set_defaults(func=cmd_ssh)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
