"""`dsv4deploy fleet deploy PROFILE --inventory INV [--batch N]`: one profile to many hosts, canary
first, then in batches, stopping at the first failure (docs/fleet.md).

1. The profile is validated once (schema, semantics, memory budget; a placeholder revision only
   where every host has a weights stand-in) and the inventory is loaded, connecting to nothing:
   bad input is a message and exit 2, and no host is touched.
2. The canary batch: the hosts with host data `canary: true` (or `--canary NAME`), else the
   first host. Then the others, in inventory order, `--batch` at a time (default 1).
3. Each batch is the deploy an operator runs (`pyinfra -y INV deploy/serve.py --data profile=P`),
   limited to the batch's hosts (`--limit NAME` each): same validation, preflight, lock, gate, and
   the automatic rollback of a host whose gate fails. Before and after it, the batch's hosts' release
   records are read (one SSH command each) to say what each ended on.
4. The first batch that fails (pyinfra exits non-zero, or a host does not end on the profile)
   stops the rollout: the hosts after it are never connected to. A summary says which hosts got
   the release, which failed (and the release each was rolled back to), which were untouched;
   the exit code is 0 only when every host got it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from dsv4deploy.cli.settings import Settings
from dsv4deploy.gate.verdict import headline_basis
from dsv4deploy.profile.boundary import TEXT
from dsv4deploy.profile.errors import EXIT_BAD_INPUT, EXIT_FAILED, Problem, ProfileError

DEPLOY_FILE = "deploy/serve.py"       # in the checkout
DATA_KEY = r"[a-z_][a-z0-9_]{0,63}"
# --limit takes fnmatch patterns and group names: a host is named exactly, or not at all
HOST_NAME = r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}"


def _bad(message: str, path: str = "") -> ProfileError:
    return ProfileError([Problem(message, path=path, file="<command line>")])


@dataclass(frozen=True)
class FleetRequest:
    """One `dsv4deploy fleet deploy`: PROFILE to INVENTORY's hosts, the canaries first (named,
    else marked `canary: true`, else the first host), then BATCH hosts at a time, each batch's
    pyinfra run given DATA (`key=value` words for --data); PLAN_ONLY stops after the batches."""

    profile: str
    inventory: str
    batch: int = 1
    canaries: Sequence[str] = ()
    data: Sequence[str] = ()
    plan_only: bool = False


@dataclass(frozen=True)
class FleetEffects:
    """What a fleet rollout does outside itself, one callable each (None: the real one; tests
    swap them): load the inventory (inventory -> [(name, data)]), read the release records
    (inventory, names -> records or a message), run one batch's pyinfra (argv -> exit code)."""

    hosts_of: Callable[[str], list[tuple[str, dict]]] | None = None
    reader: Callable[[str, Sequence[str]], dict] | None = None
    runner: Callable[[list[str]], int] | None = None


@dataclass
class HostResult:
    name: str
    batch: int                       # 0: the canary batch
    state: str = "untouched"         # untouched | deployed | failed | refused | unknown
    release: int | None = None       # the release now serving (deployed, or rolled back to)
    serving: str | None = None       # its profile
    detail: str = ""

    def line(self) -> str:
        return f"{self.name}: {self.detail}" if self.detail else self.name


@dataclass
class FleetResult:
    profile: str
    inventory: str
    batches: list[list[str]]
    hosts: dict[str, HostResult] = field(default_factory=dict)
    stopped_at: int | None = None    # the batch that failed (None: all passed, or none ran)
    exit_code: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "inventory": self.inventory, "batches": self.batches,
                "stopped_at": self.stopped_at, "exit_code": self.exit_code, "ok": self.exit_code == 0,
                "hosts": {n: asdict(h) for n, h in self.hosts.items()}}


# --- the plan (pure) -----------------------------------------------------------------------------

def plan_batches(hosts: Sequence[tuple[str, dict]], batch: int, canaries: Sequence[str] = ()) -> list[list[str]]:
    """[[canary hosts], [next batch], ...]: the named or marked canaries (else the first host) go
    first, the rest in inventory order, `batch` at a time."""
    if batch < 1:
        raise _bad(f"must be at least 1, got {batch}", "--batch")
    names = [n for n, _ in hosts]
    if not names:
        raise _bad("the inventory names no host")
    unknown = [c for c in canaries if c not in names]
    if unknown:
        raise _bad(f"--canary {unknown[0]}: no such host in the inventory (hosts: {', '.join(names)})", "--canary")
    first = list(canaries) or [n for n, data in hosts if data.get("canary") is True] or names[:1]
    rest = [n for n in names if n not in first]
    return [first] + [rest[i:i + batch] for i in range(0, len(rest), batch)]


def data_args(words: Sequence[str]) -> list[str]:
    """`--data KEY=VALUE` words handed to pyinfra, checked (the profile is this command's own)."""
    out = []
    for word in words or ():
        key, sep, value = word.partition("=")
        if not sep or not re.fullmatch(DATA_KEY, key):
            raise _bad(f"--data {word!r}: expected key=value with a lower-case key", "--data")
        if key == "profile":
            raise _bad("--data profile=...: the profile is this command's first argument", "--data")
        msg = TEXT.check(value) if value else None
        if msg:
            raise _bad(f"--data {key}=: {msg}", "--data")
        out += ["--data", word]
    return out


def outcome(name: str, batch: int, profile: str, before: list[dict], after: list[dict]) -> HostResult:
    """What a host of a batch ended on, from its release records before and after the batch."""
    from dsv4deploy.release.records import DEPLOYED, FAILED, current

    res = HostResult(name, batch)
    seen = max((r["release"] for r in before), default=0)
    new = [r for r in after if r["release"] > seen]
    live = current(after)
    failed = [r for r in new if r["status"] == FAILED]
    if live:
        res.release, res.serving = live["release"], live["profile"]
    if live and live["profile"] == profile and not failed and live["status"] == DEPLOYED:
        res.state = "deployed"
        gate = live.get("gate") or {}
        how = (f"gate passed: {gate.get('level')} {gate['output_throughput']:.1f} tok/s{headline_basis(gate)}"
               if gate.get("output_throughput") is not None else "")
        res.detail = (f"release {live['release']:04d} ({profile}) deployed" + (f", {how}" if how else "")
                      if live["release"] > seen else f"already serving {profile} (release {live['release']:04d}), "
                                                     "nothing changed")
        return res
    res.state = "failed"
    parts = []
    if failed:
        first = failed[0]
        parts.append(f"release {first['release']:04d} ({first['profile']}) failed: {first.get('reason') or '?'}")
    elif not new:
        parts.append("no release recorded: refused or stopped before the switch (its output above says why)")
    if live and live["release"] > seen and live.get("kind") == "rollback":
        parts.append(f"rolled back: release {live['release']:04d} (restores {live.get('restores') or 0:04d}, "
                     f"profile {live['profile']}) is serving")
    elif live:
        parts.append(f"serving release {live['release']:04d} ({live['profile']})")
    else:
        parts.append("NOTHING IS SERVING")
    res.detail = "; ".join(parts)
    return res


# --- the run -------------------------------------------------------------------------------------

def pyinfra_bin() -> str:
    here = Path(sys.executable).with_name("pyinfra")
    if here.exists():
        return str(here)
    import shutil

    found = shutil.which("pyinfra")
    if not found:
        raise RuntimeError("pyinfra is not installed next to this Python (make venv)")
    return found


def _from_repo(path: str, checkout: Path) -> str:
    """PATH relative to the CHECKOUT (the deploy runs there, as `make deploy` does), when inside it."""
    p = Path(path).absolute()
    return str(p.relative_to(checkout)) if p.is_relative_to(checkout) else str(p)


def batch_argv(inventory: str, profile: str, names: Sequence[str], extra: Sequence[str], checkout: Path) -> list[str]:
    """The deploy of one batch, run in the CHECKOUT: the operator's own command, limited."""
    argv = [_from_repo(pyinfra_bin(), checkout), "-y", _from_repo(inventory, checkout), DEPLOY_FILE,
            "--data", f"profile={profile}", *extra]
    for n in names:
        argv += ["--limit", n]
    return argv


def read_records(inventory: str, names: Sequence[str]) -> dict[str, list[dict] | str]:
    """The release records of NAMES (a message instead where a host cannot be read)."""
    from dsv4deploy.host.connect import RemoteError, connected, on
    from dsv4deploy.host.facts import Releases
    from dsv4deploy.render.layout import RELEASES

    try:
        with connected(inventory, only=names) as hosts:
            out: dict[str, list[dict] | str] = {}
            for h in hosts:
                with on(h):
                    out[h.name] = h.get_fact(Releases, releases_dir=RELEASES) or []
            return out
    except RemoteError as exc:
        return {n: str(exc) for n in names}
    except Exception as exc:  # noqa: BLE001 - a fact that fails on the host: a message, not a traceback
        from dsv4deploy.host.connect import describe
        return {n: describe(exc) for n in names}


def inventory_hosts(inventory: str) -> list[tuple[str, dict]]:
    """(name, host data) of every host of the inventory file, connecting to none."""
    from dsv4deploy.host.connect import load_inventory

    _, _, inv = load_inventory(inventory)
    hosts = [(h.name, dict(h.data.dict()) if hasattr(h.data, "dict") else {}) for h in inv]
    for name, _ in hosts:
        if not re.fullmatch(HOST_NAME, name):
            raise _bad(f"{inventory}: host name {ascii(name)} cannot be named exactly to pyinfra --limit")
    groups = set(getattr(inv, "groups", {}) or {})
    clash = [n for n, _ in hosts if n in groups]
    if clash:
        raise _bad(f"{inventory}: host {clash[0]} has the name of a group: --limit would select the whole group")
    return hosts


def check_profile(profile: str, profiles: Path, hosts: Sequence[tuple[str, dict]] | None = None) -> None:
    """Everything that stops PROFILE (of the folder PROFILES) from being deployed (to HOSTS: a
    placeholder revision only where every one has a weights stand-in), before any host is touched."""
    from dsv4deploy.cli.inventories import deploy_problems

    stand_in = hosts is None or all(data.get("weights_source") and data.get("stand_ins") for _, data in hosts)
    problems = deploy_problems(profile, profiles, weights_stand_in=stand_in)
    if problems:
        raise ProfileError(problems)


Say = Callable[[str], None]


def run_fleet(request: FleetRequest, settings: Settings, say: Say | None = None, child_stdout=None,
              effects: FleetEffects = FleetEffects()) -> FleetResult:
    """Roll the REQUEST's profile out over its inventory's hosts; ProfileError (exit 2) before
    anything on bad input. Each batch's pyinfra runs in the checkout, its output to CHILD_STDOUT."""
    from dsv4deploy.profile.boundary import check_name
    from dsv4deploy.host.connect import RemoteError

    profile, inventory = request.profile, request.inventory
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    hosts_of = effects.hosts_of or inventory_hosts
    reader = effects.reader or read_records
    runner = effects.runner or (lambda argv: subprocess.run(argv, cwd=settings.checkout, stdin=subprocess.DEVNULL,
                                                             stdout=child_stdout).returncode)
    msg = check_name(profile)
    if msg:
        raise _bad(f"profile {ascii(profile)}: {msg}", "profile")
    extra = data_args(request.data)
    check_profile(profile, settings.profiles)      # the profile itself, before the inventory is even loaded
    inv_path = str(Path(inventory).absolute()) if Path(inventory).is_file() else inventory
    try:
        hosts = hosts_of(inventory)
    except RemoteError as exc:
        raise FleetError(str(exc)) from None
    check_profile(profile, settings.profiles, hosts)   # and what these hosts accept (a placeholder revision)
    batches = plan_batches(hosts, request.batch, request.canaries)
    result = FleetResult(profile, inventory, batches)
    for i, names in enumerate(batches):
        for n in names:
            result.hosts[n] = HostResult(n, i)
    say(f"fleet: {profile} to {len(hosts)} host(s) of {inventory}: "
        + "; ".join(f"{'canary' if i == 0 else f'batch {i}'}: {', '.join(b)}" for i, b in enumerate(batches)))
    if request.plan_only:
        return result
    for i, names in enumerate(batches):
        label = "canary" if i == 0 else f"batch {i} of {len(batches) - 1}"
        say(f"fleet: {label}: deploying {profile} to {', '.join(names)}")
        before = reader(inventory, names)
        unreadable = {n: v for n, v in before.items() if isinstance(v, str)}
        if unreadable:
            for n, why in unreadable.items():
                result.hosts[n].state = "unknown"
                result.hosts[n].detail = f"not deployed: cannot read its releases: {why}"
            result.stopped_at, result.exit_code = i, EXIT_FAILED
            break
        argv = batch_argv(inv_path, profile, names, extra, settings.checkout)
        say(f"fleet: $ {shlex.join(argv)}")
        try:
            rc = runner(argv)
        except KeyboardInterrupt:
            for n in names:
                result.hosts[n].state = "unknown"
                result.hosts[n].detail = ("interrupted mid-deploy: its next deploy settles what this one left "
                                          "(dsv4deploy history shows its releases)")
            result.stopped_at, result.exit_code = i, EXIT_FAILED
            break
        after = reader(inventory, names)
        if rc == EXIT_BAD_INPUT and all(after.get(n) == before[n] for n in names):
            # refused before anything changed (the inventory's own check of the profile: bad input)
            for n in names:
                result.hosts[n].state = "refused"
                result.hosts[n].detail = "refused before any change (the lines above say why)"
            result.stopped_at, result.exit_code = i, EXIT_BAD_INPUT
            break
        ok = rc == 0
        for n in names:
            recs = after.get(n)
            if isinstance(recs, str):
                res = HostResult(n, i, "unknown", detail=f"cannot read its releases after the deploy: {recs}")
            else:
                res = outcome(n, i, profile, before[n], recs or [])
            result.hosts[n] = res
            ok = ok and res.state == "deployed"
        if not ok:
            if rc != 0 and all(result.hosts[n].state == "deployed" for n in names):
                for n in names:
                    result.hosts[n].detail += f" (but the deploy exited {rc})"
            result.stopped_at, result.exit_code = i, EXIT_FAILED
            break
    return result


class FleetError(Exception):
    """An operation failed before any host was touched (an inventory that does not load)."""


def summary(result: FleetResult) -> list[str]:
    by_state: dict[str, list[HostResult]] = {}
    for h in result.hosts.values():
        by_state.setdefault(h.state, []).append(h)
    lines = [f"fleet summary: {result.profile} on {result.inventory}"]
    for state, title in (("deployed", "got the release"), ("failed", "FAILED"), ("refused", "REFUSED"),
                         ("unknown", "UNKNOWN"), ("untouched", "untouched")):
        for h in by_state.get(state, []):
            where = "canary" if h.batch == 0 else f"batch {h.batch}"
            detail = h.detail
            if state == "untouched":
                detail = ("not deployed: the rollout stopped at "
                          + ("the canary" if result.stopped_at == 0 else f"batch {result.stopped_at}")
                          if result.stopped_at is not None else "not deployed (plan only)")
            lines.append(f"  {title:<16} {h.name:<16} {where:<9} {detail}")
    if result.exit_code == 0:
        lines.append(f"fleet: {result.profile} is deployed on all {len(result.hosts)} host(s)")
    else:
        where = "the canary" if result.stopped_at == 0 else f"batch {result.stopped_at}"
        lines.append(f"fleet: stopped at {where}; the hosts after it were not touched (exit {result.exit_code})")
    return lines


def cmd_fleet_deploy(args) -> int:
    """`dsv4deploy fleet deploy`: bad input exits 2 before any host is touched; a failed batch 1."""
    out = sys.stderr if args.json else None
    try:
        request = FleetRequest(args.profile, args.inventory, batch=args.batch, canaries=args.canary or (),
                               data=args.data or (), plan_only=args.plan)
        result = run_fleet(request, args.settings, child_stdout=out)
    except FleetError as exc:
        print(f"dsv4deploy fleet: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("dsv4deploy fleet: interrupted; a host's deploy that was cut off is settled by its next run",
              file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    if not args.plan:
        for line in summary(result):
            print(line, file=sys.stderr if args.json else sys.stdout)
    return result.exit_code


def register(sub) -> None:
    p = sub.add_parser("fleet", help="roll a profile out to many hosts: canary first, then batches",
                       description="Deploy a profile to every host of an inventory: the canary first (host data "
                                   "canary: true, else the first host), then the rest in batches, stopping at the "
                                   "first batch that fails. See docs/fleet.md.")
    fs = p.add_subparsers(dest="fleet_command", metavar="COMMAND", required=True)
    d = fs.add_parser("deploy", help="canary first, then batches; stop at the first failure")
    d.add_argument("profile")
    d.add_argument("--inventory", default="inventory/fleet-sim.py", help="pyinfra inventory file "
                   "(default inventory/fleet-sim.py: the isolated twins of `sim up --fleet`)")
    d.add_argument("--batch", type=int, default=1, metavar="N", help="hosts per batch after the canary (default 1)")
    d.add_argument("--canary", action="append", metavar="NAME", help="this host is the canary (repeatable; "
                   "default: the hosts with host data canary: true, else the first)")
    d.add_argument("--data", action="append", metavar="KEY=VALUE", help="pyinfra --data for every batch "
                   "(e.g. health_poll_s=0.5)")
    d.add_argument("--plan", action="store_true", help="print the batches and stop (connects to no host)")
    d.add_argument("--json", action="store_true", help="the result as JSON on stdout (pyinfra's output on stderr)")
    d.set_defaults(func=cmd_fleet_deploy)
