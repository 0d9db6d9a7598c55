#!/usr/bin/env python3
# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""NCCL all-reduce probe: N ranks of torch.distributed (NCCL), bounded in time.

Standalone: the launcher needs only the Python standard library, the ranks need torch. Copy
this file to a GPU host and run it with the SGLang venv's python (dsv4deploy need not be there):

    /opt/.../venv/bin/python nccl_probe.py launch --nranks 4 \
        --env-file /etc/dsv4deploy/sglang/nccl.env --timeout 60 --json
    ... launch --groups 0,1,2,3:4,5,6,7 ...   # two TP4 groups at once (DP2 x TP4), then each alone

`launch` starts one process per rank (this file in `rank` mode), each in its own session and
process group. A rank's environment: the launcher's minus every inherited NCCL_* (a systemd unit
does not inherit the operator's shell) except KEEP_INHERITED (NVLink multicast stays off where it
was turned off); with --as-service (the deploy's probe) only what systemd gives the unit's
process (PATH, HOME, USER, LOGNAME, LANG) and KEEP_INHERITED; + the unit's Environment= (--env),
+ the NCCL env file (--env-file, read as systemd reads EnvironmentFile=; it wins) or --nccl,
+ MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK. With --groups, each group also gets its GPU set as CUDA_VISIBLE_DEVICES (with
CUDA_DEVICE_ORDER=PCI_BUS_ID, as a replica's env file sets them) and its own MASTER_PORT.

Rank r uses GPU r of what it sees (as SGLang places TP ranks), all-reduces each size (8 KiB to
64 MiB, bf16), checks the sums exactly and times them (5 warm-up calls, then TRIALS loops of
20..200 calls, CUDA events); rank 0 reports latency (per loop the slowest rank, then the median
loop) and bus bandwidth (nccl-tests: busbw = algbw * 2(n-1)/n).

The hard timeout covers everything (start, NCCL init, all sizes) and, with --groups, all groups
at once. On timeout every rank's process group gets SIGTERM then SIGKILL; a rank that fails ends
its own group a few seconds later; /proc is then scanned to prove nothing is left (`leftover`).

Exit status: 0 all sums right, 1 failure (timeout, wrong sum, rank error, process left),
2 bad arguments. `--json` prints the result document; without it, a table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_SIZES = (8 << 10, 32 << 10, 128 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
KEEP_INHERITED = ("NCCL_NVLS_ENABLE",)
# --as-service: what systemd gives a unit's process (User= set) before its Environment=; LANG
# as the login's (systemd reads it from locale.conf, which sets the login's too)
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
SERVICE_INHERITS = ("HOME", "LANG")
FAIL_GRACE_S = 3.0      # after a rank fails, how long the others get to finish on their own
TERM_GRACE_S = 1.5      # SIGTERM -> SIGKILL
REAP_S = 2.5            # after SIGKILL, how long to wait for processes to be gone
HANG_HINT = (
    "On PCIe hosts a hang at NCCL init or at the first all-reduce usually means GPU "
    "peer-to-peer (P2P) transfers are blocked by the IOMMU or PCIe ACS. Try the `nop2p` "
    "preset (NCCL_P2P_DISABLE=1; the server must then also run with "
    "--disable-custom-all-reduce), or disable ACS / boot with iommu=pt.")
TRIALS = 3              # timed loops per size; the median is reported
PHASES = ("spawned", "python", "import-torch", "init", "warmup", "sizes", "done")


# --- small pure helpers -----------------------------------------------------------------------

def parse_size(text: str) -> int:
    """'8K', '8KiB', '64M', '1G', '4096' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 8K, 64M, 1048576)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def parse_sizes(items) -> list[int]:
    out: list[int] = []
    for item in items:
        out += [parse_size(x) for x in str(item).replace(",", " ").split() if x]
    if not out:
        raise ValueError("no sizes given")
    return out


def human_size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}iB"
    return f"{n} B"


def parse_groups(text: str) -> list[list[int]]:
    """'0,1,2,3:4,5,6,7' or '0-3:4-7' -> [[0, 1, 2, 3], [4, 5, 6, 7]]: disjoint GPU sets."""
    groups: list[list[int]] = []
    owner: dict[int, int] = {}
    for i, part in enumerate(str(text).split(":")):
        gpus: list[int] = []
        for item in part.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
            if not m or int(m.group(2) or m.group(1)) < int(m.group(1)):
                raise ValueError(f"--groups {text!r}: {item.strip()!r} is not a GPU number or range "
                                 "(GPU sets are separated by ':', e.g. 0,1,2,3:4,5,6,7 or 0-3:4-7)")
            for gpu in range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1):
                if gpu in owner:
                    raise ValueError(f"--groups {text!r}: GPU {gpu} is in group {owner[gpu]}"
                                     + (" twice" if owner[gpu] == i else f" and in group {i}")
                                     + "; the GPU sets must be disjoint")
                owner[gpu] = i
                gpus.append(gpu)
        groups.append(gpus)
    return groups


def check_layout(nranks: int | None, groups: list[list[int]] | None = None,
                 hang_group: int | None = None, hang_rank: int | None = None) -> None:
    """Refuse, with ValueError and the reason, a rank layout the launcher cannot run."""
    if groups is None:
        if nranks is None:
            raise ValueError("give --nranks N or --groups GPU-SETS")
        if nranks < 1:
            raise ValueError("--nranks and --timeout must be positive")
        if hang_group is not None:
            raise ValueError("--hang-group needs --groups")
        sizes = [nranks]
    else:
        sizes = [len(g) for g in groups]
        if nranks is not None and set(sizes) != {nranks}:
            raise ValueError(f"--nranks {nranks} disagrees with --groups (group sizes "
                             f"{', '.join(map(str, sizes))}): each group runs one rank per GPU of its set; "
                             "drop --nranks")
        if hang_group is not None and not 0 <= hang_group < len(groups):
            raise ValueError(f"--hang-group must be in 0..{len(groups) - 1}")
    size = sizes[hang_group or 0]
    if hang_rank is not None and not 0 <= hang_rank < size:
        raise ValueError(f"--hang-rank must be in 0..{size - 1}")


def read_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them: '#' and ';' comment lines,
    blank lines, optional "double" or 'single' quotes, backslash line continuation."""
    env: dict[str, str] = {}
    joined = re.sub(r"\\\n", "", text)
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"not an environment assignment: {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            if raw.strip().partition("=")[2].strip()[0] == '"':
                value = re.sub(r'\\(["\\$`])', r"\1", value)
        env[key] = value
    return env


def rank_environment(base: dict[str, str], nccl_env: dict[str, str],
                     unit_env: dict[str, str] | None = None,
                     keep: tuple[str, ...] = KEEP_INHERITED,
                     service_user: str | None = None) -> tuple[dict[str, str], dict]:
    """The environment every rank gets (before the rendezvous variables), and a note of
    what was dropped and kept from `base`. See the module docstring for the order. With
    SERVICE_USER, `base` gives only SERVICE_INHERITS and KEEP: a rank starts from what systemd
    gives the unit's server, so a PYTHONPATH or LD_PRELOAD of the login that ran the probe does
    not reach it (the note names what was dropped, never its value)."""
    note: dict = {"stripped_inherited": sorted(k for k in base if k.startswith("NCCL_") and k not in keep)}
    if service_user is not None:
        service = {k: base[k] for k in (*SERVICE_INHERITS, *keep) if k in base}
        note["dropped_inherited"] = sorted(k for k in base if k not in service and not k.startswith("NCCL_"))
        base = {"PATH": SERVICE_PATH, "USER": service_user, "LOGNAME": service_user, **service}
    env = {k: v for k, v in base.items() if not k.startswith("NCCL_") or k in keep}
    kept = {k: base[k] for k in keep if k in base and k not in nccl_env
            and k not in (unit_env or {})}
    env.update({k: str(v) for k, v in (unit_env or {}).items()})
    env.update({k: str(v) for k, v in nccl_env.items()})
    return env, {**note, "kept_inherited": kept}


def _user_name() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def busbw(nbytes: int, seconds: float, nranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 B/s) for an all-reduce, as nccl-tests computes them."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * (2 * (nranks - 1) / nranks if nranks > 1 else 1.0)


def free_port(avoid=()) -> int:
    """A free TCP port on loopback, not one of `avoid` (the other groups' rendezvous ports)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


# --- process bookkeeping ------------------------------------------------------------------------

def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgrp, session) of a live pid from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()
    return rest[0], int(rest[2]), int(rest[3])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


def group_members(groups: set[int]) -> list[dict]:
    """Processes (not zombies) whose process group or session is one of `groups`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _proc_stat(int(name))
        if st and (st[1] in groups or st[2] in groups) and st[0] not in ("Z", "X"):
            found.append({"pid": int(name), "state": st[0], "pgrp": st[1], "cmd": _cmdline(int(name))})
    return found


def signal_groups(groups: set[int], sig: int) -> None:
    """Signal the process groups of `groups` that still have a member: the number of a group
    that is gone can belong to an unrelated process by now (a new session leader gets its own
    PID as group id)."""
    for g in {m["pgrp"] for m in group_members(groups)}:
        try:
            os.killpg(g, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_groups(procs: list[subprocess.Popen], groups: set[int]) -> list[dict]:
    """SIGTERM every group, SIGKILL what is left after TERM_GRACE_S, reap; return leftovers."""
    signal_groups(groups, signal.SIGTERM)
    end = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < end and (any(p.poll() is None for p in procs) or group_members(groups)):
        time.sleep(0.05)
    signal_groups(groups, signal.SIGKILL)
    end = time.monotonic() + REAP_S
    while time.monotonic() < end:
        alive = [p for p in procs if p.poll() is None]
        if not alive and not group_members(groups):
            break
        time.sleep(0.05)
    return group_members(groups)


# --- the launcher -------------------------------------------------------------------------------

def _tail(path: str, limit: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _phase(workdir: str, rank: int) -> str:
    try:
        with open(os.path.join(workdir, f"rank{rank}.phase"), encoding="utf-8") as f:
            lines = [ln.split(" ", 1)[1].strip() for ln in f if " " in ln]
        return lines[-1] if lines else "spawned"
    except OSError:
        return "spawned"


def _transports(text: str) -> list[str]:
    """NCCL_DEBUG=INFO lines 'Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM' -> ['P2P/CUMEM']."""
    return sorted(set(re.findall(r"Channel \S+ : \S+ -> \S+ via (\S+)", text)))


@dataclass(frozen=True)
class ProbeSettings:
    """How a probe's ranks run, the same for each of its groups: the environment they start from
    (BASE_ENV, the launcher's own as its caller passes it; AS_SERVICE keeps only what systemd
    gives a unit's server, plus the unit's Environment= UNIT_ENV), the python and the rank program
    (PROGRAM: this file; tests use a fake), what is all-reduced (SIZES in DTYPE) and one deadline
    (TIMEOUT_S) for all the groups. DRY_RUN ranks dump their environment, no torch."""

    base_env: dict[str, str]
    unit_env: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    program: str | None = None
    sizes: tuple[int, ...] = DEFAULT_SIZES
    dtype: str = "bfloat16"
    timeout_s: float = DEFAULT_TIMEOUT_S
    dry_run: bool = False
    nccl_debug: bool = False
    keep_inherited: tuple[str, ...] = KEEP_INHERITED
    as_service: bool = False
    workdir: str | None = None


def launch(nranks: int, nccl_env: dict[str, str], settings: ProbeSettings, label: str = "",
           hang_rank: int | None = None, gpus: list[int] | None = None) -> dict:
    """Run the probe with one group of `nranks` ranks; return the result document. Never raises
    for a rank's failure or a hang: those are results. `gpus`: the group's GPU set (its
    CUDA_VISIBLE_DEVICES; default: inherited)."""
    spec = {"nranks": nranks, "gpus": gpus, "hang_rank": hang_rank}
    return run_groups([spec], nccl_env, settings, label)["runs"][0]


def launch_groups(groups: list[list[int]], nccl_env: dict[str, str], settings: ProbeSettings, label: str = "",
                  hang_group: int | None = None, hang_rank: int | None = None, alone: bool = True) -> dict:
    """Several groups at once, as a DP x TP layout runs: group i has len(groups[i]) ranks on GPU
    set groups[i] (CUDA_VISIBLE_DEVICES, nvidia-smi numbering) and its own MASTER_PORT; one
    deadline (`timeout_s`) covers all of them. With `alone`, each group then runs by itself,
    under its own timeout, for comparison. `hang_rank` of `hang_group` (default 0) never joins."""
    hang_group = 0 if hang_rank is not None and hang_group is None else hang_group
    specs = [{"nranks": len(g), "gpus": list(g), "hang_rank": hang_rank if i == hang_group else None}
             for i, g in enumerate(groups)]
    together = run_groups(specs, nccl_env, settings, label)
    solo = []
    if alone and len(specs) > 1:
        for i, spec in enumerate(specs):
            res = run_groups([spec], nccl_env, settings, label)["runs"][0]
            solo.append(dict(res, group=i))
    return {"mode": "groups", "label": label, "groups": [list(g) for g in groups],
            "timeout_s": settings.timeout_s,
            "ok": together["ok"] and all(r["ok"] for r in solo), "together": together, "alone": solo}


def run_groups(specs: list[dict], nccl_env: dict[str, str], settings: ProbeSettings, label: str = "") -> dict:
    """Start every group of `specs` ({nranks, gpus, hang_rank}) at once and wait for all under
    one deadline; {ok, elapsed_s, cleanup_s, leftover, runs: [one result per group]}. A rank
    that fails ends its own group after FAIL_GRACE_S; the deadline ends every group still
    running."""
    s = settings
    python, program = s.python or sys.executable, s.program or os.path.abspath(__file__)
    sizes, dtype, timeout_s, unit_env = s.sizes, s.dtype, s.timeout_s, s.unit_env
    dry_run, nccl_debug = s.dry_run, s.nccl_debug
    env, env_note = rank_environment(dict(s.base_env), nccl_env, unit_env, s.keep_inherited,
                                     service_user=_user_name() if s.as_service else None)
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"} if nccl_debug else {})
    own_dir = s.workdir is None
    workdir = s.workdir or tempfile.mkdtemp(prefix="nccl-probe-")
    many = len(specs) > 1
    groups, ports = [], []
    for i, spec in enumerate(specs):
        gdir = os.path.join(workdir, f"g{i}") if many else workdir
        os.makedirs(gdir, exist_ok=True)
        ports.append(free_port(avoid=ports))
        cfg = {"sizes": list(sizes), "dtype": dtype, "hang_rank": spec.get("hang_rank"), "dry_run": dry_run,
               "workdir": gdir, "nranks": spec["nranks"], "group": i, "gpus": spec.get("gpus")}
        with open(os.path.join(gdir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        genv = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[-1]), WORLD_SIZE=str(spec["nranks"]),
                    PYTHONUNBUFFERED="1")
        if spec.get("gpus") is not None:        # as a replica's env file sets them
            genv.update(CUDA_VISIBLE_DEVICES=",".join(map(str, spec["gpus"])), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        res = {"label": label, "ok": False, "nranks": spec["nranks"], "dtype": dtype, "timeout_s": timeout_s,
               "python": python, "nccl_env": dict(sorted(nccl_env.items())),
               "unit_env": dict(sorted((unit_env or {}).items())), "nccl_debug": nccl_debug, **env_note,
               "hang_rank": spec.get("hang_rank"), "dry_run": dry_run, "error": None, "results": [],
               "ranks": [], "leftover": [], "elapsed_s": None}
        if spec.get("gpus") is not None:
            res.update(group=i, gpus=list(spec["gpus"]), master_port=ports[-1])
        groups.append({"dir": gdir, "env": genv, "procs": [], "logs": [], "res": res, "kind": None,
                       "fail_at": None, "term_at": None, "end": None})
    spawn_error = None
    start = time.monotonic()
    try:
        for g in groups:
            for r in range(g["res"]["nranks"]):
                log = open(os.path.join(g["dir"], f"rank{r}.log"), "wb")
                g["logs"].append(log)
                g["procs"].append(subprocess.Popen(
                    [python, program, "rank", "--config", os.path.join(g["dir"], "config.json"), "--rank", str(r)],
                    env=dict(g["env"], RANK=str(r), LOCAL_RANK=str(r)), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, cwd=g["dir"], start_new_session=True))
    except OSError as exc:
        spawn_error = {"kind": "spawn", "message": f"cannot start {python}: {exc}"}
    procs = [p for g in groups for p in g["procs"]]
    pgids = {p.pid for p in procs}      # start_new_session: pgid == sid == pid
    deadline = start + timeout_s
    try:
        while spawn_error is None:
            now = time.monotonic()
            for g in [g for g in groups if g["end"] is None]:
                codes = [p.poll() for p in g["procs"]]
                if all(c is not None for c in codes):
                    g["end"] = now
                elif any(c not in (None, 0) for c in codes):
                    g["fail_at"] = g["fail_at"] or now
                    mine = {p.pid for p in g["procs"]}
                    if g["term_at"] is None and now - g["fail_at"] >= FAIL_GRACE_S:
                        g["kind"], g["term_at"] = "rank-failed", now
                        signal_groups(mine, signal.SIGTERM)
                    elif g["term_at"] is not None and now - g["term_at"] >= TERM_GRACE_S:
                        signal_groups(mine, signal.SIGKILL)
            if all(g["end"] is not None for g in groups):
                break
            if now >= deadline:
                for g in groups:
                    if g["end"] is None:
                        g["kind"] = g["kind"] or "timeout"
                break
            time.sleep(0.05)
    except BaseException:              # Ctrl-C, SIGTERM/SIGHUP (see main): take the ranks along
        kill_groups(procs, pgids)
        raise
    killed_at = time.monotonic()
    leftover = kill_groups(procs, pgids) if pgids else []
    done = time.monotonic()
    runs = []
    for g in groups:
        for log in g["logs"]:
            log.close()
        res = g["res"]
        res["leftover"] = group_members({p.pid for p in g["procs"]}) if g["procs"] else []
        res["elapsed_s"] = round((g["end"] or done) - start, 3)
        res["cleanup_s"] = round(done - killed_at, 3)
        _finish(res, g["procs"], g["dir"], g["kind"], spawn_error)
        runs.append(res)
    ok = all(r["ok"] for r in runs) and not leftover
    if own_dir and ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        for g in groups:
            g["res"]["workdir"] = g["dir"]
    out = {"ok": ok, "elapsed_s": round(done - start, 3), "cleanup_s": round(done - killed_at, 3),
           "leftover": leftover, "runs": runs}
    return dict(out, workdir=workdir) if not ok else out


def _finish(result: dict, procs: list, workdir: str, kind: str | None, spawn_error: dict | None) -> None:
    """Fill one group's result from its rank files: ranks, results, system, error, ok."""
    ranks = []
    for r, p in enumerate(procs):
        doc = {}
        try:
            with open(os.path.join(workdir, f"rank{r}.json"), encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            pass
        log_text = _tail(os.path.join(workdir, f"rank{r}.log"), 200_000)
        ranks.append({"rank": r, "pid": p.pid, "returncode": p.returncode,
                      "phase": _phase(workdir, r), "ok": bool(doc.get("ok")),
                      "transports": _transports(log_text) if result["nccl_debug"] else [],
                      "log_tail": log_text[-1500:], **({"report": doc} if doc else {})})
    result["ranks"] = ranks
    rank0 = ranks[0].get("report", {}) if ranks else {}
    result["results"] = rank0.get("results", [])
    result["system"] = rank0.get("system", {})
    if result["nccl_debug"]:
        result["transports"] = sorted({t for r in ranks for t in r["transports"]})
    result["error"] = spawn_error or _diagnose(kind, ranks, result, result["timeout_s"])
    if result["error"] is None and result["leftover"]:
        result["error"] = {"kind": "leftover", "message": "rank processes survived SIGKILL: "
                           + ", ".join(f"{x['pid']} ({x['state']})" for x in result["leftover"])}
    result["ok"] = result["error"] is None


def _diagnose(kind: str | None, ranks: list[dict], result: dict, timeout_s: float) -> dict | None:
    where = ", ".join(f"rank {r['rank']} at '{r['phase']}'" for r in ranks)
    cleanup = ("all rank processes were killed; none is left" if not result["leftover"]
               else f"{len(result['leftover'])} process(es) could NOT be killed")
    if kind == "timeout":
        stuck = [r for r in ranks if r["returncode"] is None or r["returncode"] < 0]
        done = [str(r["rank"]) for r in ranks if r not in stuck]
        state = "; ".join(f"rank {r['rank']} stuck at '{r['phase']}'" for r in stuck)
        if done:
            state += f"; rank(s) {', '.join(done)} had finished"
        sweep = [r["phase"] for r in stuck if r["phase"].startswith("size") or r["phase"] == "sizes"]
        hint = HANG_HINT if not sweep else ("The ranks hung during the size sweep (after "
                                            f"'{sweep[0]}'). " + HANG_HINT)
        msg = (f"NCCL probe did not finish within {timeout_s:g} s ({state}). {hint} ({cleanup}.)")
        return {"kind": "timeout", "message": msg}
    failed = [r for r in ranks if r["returncode"] not in (0, None) and r["returncode"] > 0]
    if kind == "rank-failed" or failed:
        first = failed[0] if failed else ranks[0]
        last = [ln for ln in first["log_tail"].splitlines() if ln.strip()][-3:]
        msg = (f"rank {first['rank']} exited with status {first['returncode']} at "
               f"'{first['phase']}' ({where}): {' | '.join(last) or 'no output'} ({cleanup}.)")
        return {"kind": "rank-failed", "message": msg}
    bad = [r for r in ranks if not r["ok"]]
    if bad:
        return {"kind": "rank-failed", "message": f"rank {bad[0]['rank']} reported no success ({where})"}
    wrong = [x for x in result["results"] if not x.get("correct", False)]
    if wrong:
        return {"kind": "wrong-sum", "message": "all-reduce gave wrong sums at "
                + ", ".join(human_size(x["bytes"]) for x in wrong)}
    return None


# --- formatting -------------------------------------------------------------------------------

def format_result(res: dict) -> str:
    """A human report of one `launch` result."""
    where = (f" group {res['group']} (GPUs {','.join(map(str, res['gpus']))})" if res.get("gpus") is not None
             else "")
    head = f"NCCL all-reduce probe{(' [' + res['label'] + ']') if res.get('label') else ''}{where}: " \
           f"{res['nranks']} ranks, {res['dtype']}"
    sysinfo = res.get("system") or {}
    if sysinfo.get("torch"):
        head += (f"; torch {sysinfo.get('torch')}, NCCL {sysinfo.get('nccl')}, "
                 f"{', '.join(sysinfo.get('gpus', []))}")
    lines = [head, "env: " + (" ".join(f"{k}={v}" for k, v in res["nccl_env"].items()) or "(none)")]
    if res.get("transports"):
        lines.append("transports: " + ", ".join(res["transports"]))
    if res["results"]:
        rows = [("size", "latency us", "algbw GB/s", "busbw GB/s", "sum")]
        for x in res["results"]:
            rows.append((human_size(x["bytes"]), f"{x['latency_us']:.1f}", f"{x['algbw_gbps']:.2f}",
                         f"{x['busbw_gbps']:.2f}", "ok" if x["correct"] else "WRONG"))
        lines += text_grid(rows, right={1, 2, 3})
    status = "OK" if res["ok"] else f"FAILED ({res['error']['kind']}): {res['error']['message']}"
    lines.append(f"{status} in {res['elapsed_s']:.1f} s")
    return "\n".join(lines) + "\n"


def text_grid(rows, right=frozenset()) -> list[str]:
    """ROWS as aligned text lines, the columns in RIGHT right-aligned (the reports' tables)."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


# --- the rank program ---------------------------------------------------------------------------

def _mark(workdir: str, rank: int, phase: str) -> None:
    with open(os.path.join(workdir, f"rank{rank}.phase"), "a", encoding="utf-8") as f:
        f.write(f"{time.time():.3f} {phase}\n")


def _write(workdir: str, rank: int, doc: dict) -> None:
    path = os.path.join(workdir, f"rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def _hang_forever() -> None:
    while True:
        time.sleep(3600)


def rank_main(config_path: str, rank: int, environ: dict[str, str]) -> int:
    """One rank (ENVIRON: its own environment, as main passes it)."""
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    workdir, world = cfg["workdir"], int(cfg["nranks"])
    _mark(workdir, rank, "python")
    if cfg.get("dry_run"):
        env = {k: v for k, v in environ.items()
               if k.startswith(("NCCL_", "MASTER_", "CUDA_", "TORCH_", "NVSHMEM_", "DSV4_", "PYTHON", "LD_"))
               or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PATH", "HOME", "USER", "LOGNAME", "LANG")}
        if cfg.get("hang_rank") == rank:
            _mark(workdir, rank, "hang")
            # a child in the same process group: tests see the group (not only the rank) killed
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            _hang_forever()
        _write(workdir, rank, {"rank": rank, "ok": True, "env": env, "results": [],
                               "system": {"dry_run": True, "python": sys.version.split()[0]}})
        _mark(workdir, rank, "done")
        return 0

    _mark(workdir, rank, "import-torch")
    import torch
    import torch.distributed as dist

    if cfg.get("hang_rank") == rank:
        _mark(workdir, rank, "hang")
        _hang_forever()
    if torch.cuda.device_count() < world:
        print(f"rank {rank}: {world} ranks need {world} GPUs; torch sees {torch.cuda.device_count()} "
              f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES')})", file=sys.stderr)
        return 3
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[cfg["dtype"]]
    _mark(workdir, rank, "init")
    try:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    except TypeError:       # torch < 2.3 has no device_id
        dist.init_process_group("nccl", rank=rank, world_size=world)
    _mark(workdir, rank, "warmup")
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    torch.cuda.synchronize()
    if probe.item() != world:
        print(f"rank {rank}: warm-up all-reduce gave {probe.item()}, expected {world}", file=sys.stderr)
    _mark(workdir, rank, "sizes")
    elem = torch.tensor([], dtype=dtype).element_size()
    results = []
    for nbytes in cfg["sizes"]:
        n = max(1, nbytes // elem)
        pattern = (torch.arange(n, device=device) % 7).to(dtype)
        x = pattern + (rank + 1)
        dist.all_reduce(x)
        expected = pattern * world + world * (world + 1) // 2
        correct = bool(torch.equal(x, expected))
        buf = torch.zeros(n, dtype=dtype, device=device)
        iters = max(20, min(200, int(2.5e8 // max(nbytes, 1))))
        for _ in range(5):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        trials = []
        for _ in range(TRIALS):
            dist.barrier(device_ids=[rank])
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                dist.all_reduce(buf)
            end.record()
            end.synchronize()
            trials.append(start.elapsed_time(end) / 1e3 / iters)
        # per trial the slowest rank; then the median trial
        stats = torch.tensor(trials + [0.0 if correct else 1.0], device=device, dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        per_trial = sorted(float(t) for t in stats[:TRIALS])
        seconds, any_wrong = per_trial[TRIALS // 2], bool(stats[TRIALS] > 0)
        algbw, bus = busbw(n * elem, seconds, world)
        results.append({"bytes": n * elem, "count": n, "iters": iters, "trials_us":
                        [round(t * 1e6, 2) for t in per_trial],
                        "latency_us": round(seconds * 1e6, 2), "algbw_gbps": round(algbw, 3),
                        "busbw_gbps": round(bus, 3), "correct": not any_wrong})
        _mark(workdir, rank, f"size:{n * elem}")
    nccl_version = torch.cuda.nccl.version()
    system = {"torch": torch.__version__, "cuda": torch.version.cuda,
              "nccl": ".".join(map(str, nccl_version)) if isinstance(nccl_version, tuple)
              else str(nccl_version),
              "gpus": [torch.cuda.get_device_name(i) for i in range(world)],
              "gpu_uuids": [str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) for i in range(world)],
              "cuda_visible_devices": environ.get("CUDA_VISIBLE_DEVICES"),
              "hostname": socket.gethostname()}
    _write(workdir, rank, {"rank": rank, "ok": all(r["correct"] for r in results),
                           "results": results if rank == 0 else [], "system": system,
                           "env": {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")}})
    dist.destroy_process_group()
    _mark(workdir, rank, "done")
    return 0


# --- command line -------------------------------------------------------------------------------

def _pairs(items) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nccl_probe.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    la = sub.add_parser("launch", help="run the probe")
    la.add_argument("--nranks", type=int, help="ranks of one group (GPUs 0..N-1)")
    la.add_argument("--groups", help="GPU sets probed at once, e.g. 0,1,2,3:4,5,6,7 (one rank per GPU)")
    la.add_argument("--no-alone", action="store_true", help="with --groups: skip each group's run alone")
    la.add_argument("--hang-group", type=int, default=None, help="debug: the group of --hang-rank (default 0)")
    la.add_argument("--python", help="python for the ranks (default: this one)")
    la.add_argument("--env-file", action="append", default=[],
                    help="NCCL env file as systemd reads it (repeatable, later wins)")
    la.add_argument("--nccl", action="append", default=[], metavar="KEY=VALUE", help="NCCL variable (over --env-file)")
    la.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="the unit's Environment= value (under the env file)")
    la.add_argument("--sizes", nargs="+", default=None, help="e.g. 8K 1M 64M (default 8K..64M)")
    la.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16")
    la.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    la.add_argument("--label", default="")
    la.add_argument("--hang-rank", type=int, default=None, help="debug: this rank never joins")
    la.add_argument("--dry-run", action="store_true", help="ranks dump their environment, no torch")
    la.add_argument("--nccl-debug", action="store_true", help="add NCCL_DEBUG=INFO to report the transports NCCL chose")
    la.add_argument("--keep-env", action="append", default=[], metavar="NAME",
                    help="keep this inherited NCCL_* variable too (NCCL_NVLS_ENABLE always is)")
    la.add_argument("--as-service", action="store_true",
                    help="ranks start from what systemd gives a unit (PATH, HOME, USER, LOGNAME, LANG), "
                         "not the whole inherited environment")
    la.add_argument("--json", action="store_true")
    ra = sub.add_parser("rank", help=argparse.SUPPRESS)
    ra.add_argument("--config", required=True)
    ra.add_argument("--rank", type=int, required=True)
    return p


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def exit_on_term() -> None:
    """SIGTERM/SIGHUP (an SSH session closing, a unit stopping) end the launcher through
    SystemExit, so `launch` kills the ranks' groups on the way out."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "rank":
        return rank_main(args.config, args.rank, dict(os.environ))
    try:
        nccl_env: dict[str, str] = {}
        for path in args.env_file:
            with open(path, encoding="utf-8") as f:
                nccl_env.update(read_env_file(f.read()))
        nccl_env.update(_pairs(args.nccl))
        unit_env = _pairs(args.env)
        sizes = parse_sizes(args.sizes) if args.sizes else list(DEFAULT_SIZES)
        groups = parse_groups(args.groups) if args.groups is not None else None
        check_layout(args.nranks, groups, args.hang_group, args.hang_rank)
        if args.timeout <= 0:
            raise ValueError("--nranks and --timeout must be positive")
    except (OSError, ValueError) as exc:
        print(f"nccl_probe: {exc}", file=sys.stderr)
        return 2
    exit_on_term()
    settings = ProbeSettings(base_env=dict(os.environ), unit_env=unit_env, python=args.python, sizes=tuple(sizes),
                             dtype=args.dtype, timeout_s=args.timeout, dry_run=args.dry_run,
                             nccl_debug=args.nccl_debug, keep_inherited=KEEP_INHERITED + tuple(args.keep_env),
                             as_service=args.as_service)
    if groups is None:
        res = launch(args.nranks, nccl_env, settings, args.label, hang_rank=args.hang_rank)
        text = format_result(res)
    else:
        res = launch_groups(groups, nccl_env, settings, args.label, hang_group=args.hang_group,
                            hang_rank=args.hang_rank, alone=not args.no_alone)
        text = "".join([*map(format_result, res["together"]["runs"]),
                        *("alone: " + format_result(r) for r in res["alone"]),
                        f"{len(groups)} groups at once: {'OK' if res['ok'] else 'FAILED'}\n"])
    print(json.dumps(res, indent=2) if args.json else text, end="" if not args.json else "\n")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
