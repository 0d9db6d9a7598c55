"""The running replica set against the release that serves it (issue 40): each instance (are
its files the release's, was its process started from them, its GPUs), the instances the release
does not run, and the gateway (its process, the workers it lists). Pure: the deploy's plan
(tasks/replicas.py) and `dsv4deploy status` (cli/status.py) judge from this one comparison, each
from its own read of the host (host/state.py set_queries).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from dsv4deploy.gateway import model as gateway
from dsv4deploy.release.rollout import Target


@dataclass(frozen=True)
class SetRead:
    """What one read of the host saw of a replica set."""

    instances: dict[str, dict]              # host/replicas.py parse_instances: {unit: {active, started, files, argv}}
    workers: list[dict] | None = None       # GatewayWorkers: [{url, status, healthy}]; None: it did not answer
    gateway: dict = field(default_factory=dict)     # UnitInfo of the gateway (ActiveState, MainPID)
    gateway_stale: bool = False             # GatewayStale: it runs older gateway files than those in place
    gpu_mib: dict[int, int] | None = None   # memory.used per GPU index (None: not read)


def argv_sha256(argv: list[str]) -> str:
    """The sha256 of ARGV as /proc/PID/cmdline holds it (each word NUL-terminated)."""
    return hashlib.sha256(b"".join(w.encode() + b"\0" for w in argv)).hexdigest()


def kept_argv(manifest: dict | None) -> dict[str, str]:
    """{unit: argv sha256} of each replica a release's kept launch manifest names (render/
    replicas.py _manifest); an entry that is not a list of words is left out (its process is then
    judged by its start time)."""
    reps = manifest.get("replicas") if isinstance(manifest, dict) else None
    out = {}
    for rep in reps if isinstance(reps, list) else []:
        argv = rep.get("argv") if isinstance(rep, dict) else None
        if isinstance(rep.get("instance") if isinstance(rep, dict) else None, str) and isinstance(argv, list) \
                and all(isinstance(w, str) for w in argv):
            out[rep["instance"] + ".service"] = argv_sha256(argv)
    return out


def instance_files(t: Target, index: int) -> list[str]:
    """The files instance INDEX of T's template starts from: the template, its two env files."""
    return [t.layout.template_unit, t.layout.replica_env(index), t.layout.replica_nccl_env(index)]


def gateway_files(t: Target) -> list[str]:
    """The files the running gateway was started from: its unit, its launcher and (keyed) its two
    keys, so that a rotated key restarts it (GatewayStale)."""
    keys = [t.layout.api_key_file, t.layout.gateway_control_key_file] if t.data["server"].get("api_key") else []
    return [t.layout.gateway_unit, f"{t.gateway_venv}/{gateway.LAUNCHER_FILE}", *keys]


def from_current_files(seen: dict | None, release_argv: str | None) -> bool | None:
    """Whether an instance's process was started from the release's files: its argv (sha256 of
    /proc/PID/cmdline) is the release's; where the argv cannot be read (a process that renamed
    itself) or the release's is not known, it started after its files last changed (ctime: a
    restore's copy keeps the kept copies' mtime). None: no process runs."""
    if not seen or not seen.get("active"):
        return None
    if seen.get("argv") is not None and release_argv is not None:
        return seen["argv"] == release_argv
    if seen.get("files") is not None and seen.get("started"):
        return seen["started"] >= seen["files"]
    return None


def stale(t: Target, argv: dict[str, str | None], instances: dict[str, dict]) -> list[Target]:
    """The release's replicas whose process runs other files than the release's (a cut-off roll, a
    crash restarted from files no gate passed on it). ARGV: {unit: the release's argv sha256}."""
    return [rt for rt in t.replica_targets if from_current_files(instances.get(rt.unit), argv.get(rt.unit)) is False]


def surplus(t: Target, instances: dict[str, dict]) -> list[str]:
    """Instances of the template that run but are none of the release's replicas (a shrink cut off
    before they left, one started by hand): they hold GPUs and may be in the gateway."""
    mine = set(t.units)
    return sorted(u for u, i in instances.items() if i.get("active") and u not in mine)


def unlisted(t: Target, workers: list[dict] | None) -> list[Target]:
    """The release's replicas the gateway does not list (none when it did not answer)."""
    if workers is None:
        return []
    urls = {w["url"].rstrip("/") for w in workers}
    return [rt for rt in t.replica_targets if rt.base_url.rstrip("/") not in urls]


def strays(t: Target, workers: list[dict] | None) -> list[str]:
    """The workers the gateway lists that no replica of the release serves."""
    wanted = {u.rstrip("/") for u in t.plan.worker_urls}
    return [w["url"] for w in workers or [] if w["url"].rstrip("/") not in wanted]


def compare(t: Target, argv: dict[str, str | None], read: SetRead, changed: frozenset[str] = frozenset()) -> dict:
    """The set as READ against release target T (ARGV: each replica unit's argv sha256 as the
    release rendered it; CHANGED: the release's files that differ on the host now): one entry per
    replica, the surplus instances, the gateway, and the differences in words."""
    listed = None if read.workers is None else {w["url"].rstrip("/"): w for w in read.workers}
    replicas = []
    for rt in t.replica_targets:
        seen = read.instances.get(rt.unit) or {}
        gpus = list(t.plan.replicas[rt.index].gpus)
        worker = None if listed is None else listed.get(rt.base_url.rstrip("/"))
        replicas.append({
            "index": rt.index, "unit": rt.unit, "url": rt.base_url, "active": bool(seen.get("active")),
            "files_current": not set(instance_files(t, rt.index)) & changed,
            "from_current_files": from_current_files(seen, argv.get(rt.unit)),
            "gpus": gpus, "gpu_mib": None if read.gpu_mib is None else [read.gpu_mib.get(g) for g in gpus],
            "in_gateway": None if listed is None else worker is not None,
            "worker_status": worker and worker.get("status")})
    gw = read.gateway or {}
    active = gw.get("ActiveState") == "active"
    view = {"gateway": {"unit": t.unit, "active": active, "pid": gw.get("MainPID") or None,
                        "files_current": not set(gateway_files(t)) & changed,
                        "from_current_files": (not read.gateway_stale) if active else None,
                        "workers": None if read.workers is None else [w["url"] for w in read.workers],
                        "missing": [rt.unit for rt in unlisted(t, read.workers)], "strays": strays(t, read.workers)},
            "replicas": replicas, "surplus": surplus(t, read.instances)}
    view["differences"] = differences(view)
    return view


def differences(view: dict) -> list[str]:
    """What COMPARE found different from the release, one line each (empty: the set matches it)."""
    out = []
    for r in view["replicas"]:
        name = f"replica {r['index']} ({r['unit']})"
        if not r["active"]:
            out.append(f"{name} is not running")
        if not r["files_current"]:
            out.append(f"{name}: its files on the host are not the release's")
        if r["from_current_files"] is False:
            out.append(f"{name} runs other files than the release's (its process's argv is not the release's)")
        if r["active"] and r["in_gateway"] is False:
            out.append(f"{name} runs but the gateway does not list it")
    out += [f"{u} runs and is not one of the release's {len(view['replicas'])} replicas" for u in view["surplus"]]
    g = view["gateway"]
    if not g["active"]:
        out.append(f"{g['unit']} is not running")
    elif g["workers"] is None:
        out.append(f"{g['unit']} does not answer GET /workers")
    if not g["files_current"]:
        out.append(f"{g['unit']}: its files on the host are not the release's")
    if g["from_current_files"] is False:
        out.append(f"{g['unit']} runs older gateway files than those in place")
    out += [f"{g['unit']} lists {u}, which no replica of the release serves" for u in g["strays"]]
    return out


def lines(view: dict, release: int | None = None) -> list[str]:
    """The comparison as status text: a line per replica, surplus instance and the gateway."""
    def said(value: bool | None, yes: str, no: str, unknown: str = "-") -> str:
        return unknown if value is None else yes if value else no

    head = f"  replica set of release {release:04d}:" if release is not None else "  replica set:"
    out = [head + (" matches it" if not view["differences"] else
                   f" {len(view['differences'])} difference(s) (the `replica set:` lines above)")]
    for r in view["replicas"]:
        mib = r["gpu_mib"]
        gpus = ",".join(map(str, r["gpus"])) + (" (" + ", ".join("?" if m is None else f"{m} MiB" for m in mib)
                                                + " used)" if mib else "")
        out.append(f"    replica {r['index']} {r['unit']} {'active' if r['active'] else 'NOT RUNNING'}: "
                   f"files {said(r['files_current'], 'current', 'CHANGED')}, process "
                   f"{said(r['from_current_files'], 'from current files', 'from OTHER files')}, GPUs {gpus}, "
                   f"{said(r['in_gateway'], 'in the gateway', 'NOT in the gateway', 'gateway not read')}")
    out += [f"    {u} active: NOT one of the release's replicas (holds its GPUs)" for u in view["surplus"]]
    g = view["gateway"]
    workers = "no answer" if g["workers"] is None else ", ".join(g["workers"]) or "none"
    out.append(f"    gateway {g['unit']} {'active' if g['active'] else 'NOT RUNNING'}"
               + (f" (PID {g['pid']})" if g["pid"] else "") + f": files {said(g['files_current'], 'current', 'CHANGED')}, "
               f"process {said(g['from_current_files'], 'from current files', 'from OLDER files')}; workers: {workers}")
    return out
