"""A replica set on the host: start it, roll it one replica at a time behind the gateway.

A rolling step for replica i: take it out of the gateway and wait for its in-flight requests
(gateway.drain: smg itself does not wait), restart its instance, health and identity on its own
port, the caller's check (the gate for a new release, a probe for a restore), and add it back
(gateway.readmit). The other replicas serve throughout. The gateway's HTTP calls run on the host
(host/gateway_http.py): the key never reaches the control node.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Callable

from dsv4deploy.gateway import model as gateway
from dsv4deploy.sglang.health import HealthError
from dsv4deploy.release.rollout import Target
from dsv4deploy.release.running_set import gateway_files, instance_files
from dsv4deploy.host.checks import confirm, journal_tail
from dsv4deploy.host.facts import GatewayStale, pid_and_files_command
from dsv4deploy.host.gateway_http import CONTROL_KEY, KEY, host_http, key_files
from dsv4deploy.host.io import sh

GATEWAY_READY_S = 60.0      # smg registers a listed worker within a second (docs/replicas.md)
LOAD_REPORT_S = 25.0        # smg polls every worker's load every 10 s: two rounds and some slack


class ReplicaFailed(Exception):
    """Replica `index` failed its restart, health, identity or check; `done` were switched before it."""

    def __init__(self, index: int, message: str, done: list[int]):
        super().__init__(message)
        self.index, self.done = index, done


@dataclass
class Step:
    """What happened to one replica in a roll (kept in the release record)."""

    index: int
    instance: str
    status: str = "untouched"        # untouched | switched | failed
    drained_s: float | None = None
    in_flight_left: int = 0
    seconds: float = 0.0
    detail: dict = field(default_factory=dict)
    pid_before: int | None = None    # its MainPID as the host's read saw it (roll: restarted since?); not recorded

    def record(self) -> dict:
        doc = {"index": self.index, "instance": self.instance, "status": self.status,
               "seconds": round(self.seconds, 1)}
        if self.drained_s is not None:
            doc["drained_s"] = round(self.drained_s, 1)
        if self.in_flight_left:
            doc["in_flight_left"] = self.in_flight_left
        return {**doc, **self.detail}


def api(h, t: Target):
    """(http, endpoint, keys) for gateway.py's worker API against the set's gateway on the host:
    its control-plane key for /workers, the inference key for the workers it adds."""
    if not t.data["server"].get("api_key"):
        return host_http(h, None), t.base_url, None
    files = key_files(t.layout.api_key_file, t.layout.gateway_control_key_file)
    return host_http(h, files), t.base_url, gateway.Keys(control=CONTROL_KEY, worker=KEY)


def unit_active(h, unit: str) -> bool:
    return sh(h, f"systemctl is-active --quiet {unit}")[0]


def wait_all_routable(h, t: Target, timeout_s: float = GATEWAY_READY_S) -> None:
    """Until the gateway routes to every replica of the set (its /health answers before any is)."""
    http, endpoint, key = api(h, t)
    urls = {rt.base_url for rt in t.replica_targets}
    last: list = []

    def ready() -> bool:
        try:
            last[:] = gateway.list_workers(http, endpoint, key)
        except (gateway.GatewayError, OSError):
            return False
        return urls <= {w.url for w in last if w.routable}

    if not gateway.wait_for(ready, timeout_s, poll_s=0.3):
        seen = ", ".join(f"{w.url} {w.status}" for w in last) or "no worker"
        raise HealthError(f"the gateway {endpoint} does not route to every replica after {timeout_s:g} s ({seen})")


def wait_load_reports(h, t: Target, log: Callable[[str], None], timeout_s: float = LOAD_REPORT_S) -> float | None:
    """Until smg holds a load report of every replica (gateway.load_reported, read from its metrics
    port on the host), so that a gate through it right after a (re)registration does not measure
    the 10 s in which a replica without a report gets nothing. Seconds waited, or None (logged,
    not fatal) when the reports did not come in time."""
    http, _, _ = api(h, t)
    metrics = f"http://{gateway.METRICS_HOST}:{t.plan.gateway.metrics_port}/metrics"
    start = time.monotonic()
    missing: list[str] = []

    def reported() -> bool:
        try:
            status, body = http("GET", metrics, {}, None, 10)
        except OSError:
            return False
        text = body.decode("utf-8", "replace") if status == 200 else ""
        missing[:] = [rt.base_url for rt in t.replica_targets if not gateway.load_reported(text, rt.base_url)]
        return not missing

    if gateway.wait_for(reported, timeout_s, poll_s=1.0) is None:
        log(f"the gateway has no load report of {', '.join(missing) or 'every replica'} after {timeout_s:g} s: "
            "its routing may starve that replica during the gate")
        return None
    return time.monotonic() - start


STARTED_DIR = "/run/dsv4deploy"     # tmpfs: empty after a boot, when systemd starts the gateway from the files in place


def started_marker(t: Target) -> str:
    return f"{STARTED_DIR}/{t.unit}.started"


def stale_query(t: Target) -> dict:
    """GatewayStale's arguments for T's gateway."""
    return {"unit": t.unit, "files": gateway_files(t), "marker": started_marker(t)}


def mark_started_command(t: Target) -> str:
    """Write the gateway's started marker (GatewayStale): its MainPID and its files' sha256 now."""
    return (f"mkdir -p -m 700 {STARTED_DIR} && {{ {pid_and_files_command(t.unit, gateway_files(t))}; }} "
            f"> {shlex.quote(started_marker(t))}")


def gateway_stale(h, t: Target) -> bool:
    """GatewayStale on host H now (one command)."""
    _, out = sh(h, GatewayStale().command(**stale_query(t)))
    return GatewayStale().process(out.splitlines())


def start_gateway(h, t: Target, restart: bool, reload: bool = False) -> None:
    """Enable and (re)start the gateway (and mark which files it started from: GatewayStale; a
    marker that cannot be written fails nothing), then wait until it routes to every replica.
    RELOAD: daemon-reload first (a caller that has not: the unit on disk is what it starts)."""
    verb = "restart" if restart else "start"
    first = "systemctl daemon-reload && " if reload else ""
    ok, out = sh(h, f"{first}systemctl enable --quiet {t.unit} && systemctl reset-failed {t.unit} 2>/dev/null; "
                    f"systemctl {verb} {t.unit} && {{ {mark_started_command(t)} || true; }}")
    if not ok:
        raise HealthError(f"could not {verb} {t.unit}: {out.strip()[-300:]}\n{journal_tail(h, t)}")
    wait_all_routable(h, t)


def instances_command(t: Target) -> str:
    """Print a line per instance of T's service template systemd knows: its name, ActiveState,
    when its process started (unix seconds, 0: none), the newest change time of its files (-:
    not one of T's replicas; ctime, not mtime: a restore's `cp -a` keeps the kept copies' mtime)
    and the sha256 of its process's argv as the kernel holds it (-: none, or a process that
    renamed itself: its argv is one word)."""
    files = {rt.unit: " ".join(shlex.quote(f) for f in instance_files(t, rt.index)) for rt in t.replica_targets}
    cases = " ".join(f"{shlex.quote(u)}) f=$(stat -c %Z {fs} 2>/dev/null | sort -n | tail -1);;"
                     for u, fs in files.items())
    return (f"for u in $(systemctl list-units --all --plain --no-legend --type=service "
            f"{shlex.quote(t.layout.service + '@*')} | cut -d' ' -f1); do f=-; a=-; case \"$u\" in {cases} esac; "
            "s=$(systemctl show -p ExecMainStartTimestamp --value --timestamp=unix \"$u\" | tr -d @); "
            "p=$(systemctl show -p MainPID --value \"$u\"); "
            "if [ \"${p:-0}\" -gt 0 ] && [ \"$(tr -dc '\\000' < /proc/$p/cmdline 2>/dev/null | wc -c)\" -gt 1 ]; "
            "then a=$(sha256sum < /proc/$p/cmdline | cut -c1-64); fi; "
            "printf '%s %s %s %s %s\\n' \"$u\" \"$(systemctl show -p ActiveState --value \"$u\")\" \"${s:-0}\" "
            "\"${f:--}\" \"$a\"; done; true")


def parse_instances(text: str | None) -> dict[str, dict]:
    """instances_command's output: {unit: {"active": bool, "started": int, "files": int | None,
    "argv": sha256 | None}}."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) in (4, 5) and parts[0].endswith(".service"):
            out[parts[0]] = {"active": parts[1] == "active",
                             "started": int(parts[2]) if parts[2].isdigit() else 0,
                             "files": int(parts[3]) if parts[3].isdigit() else None,
                             "argv": parts[4] if len(parts) == 5 and len(parts[4]) == 64 else None}
    return out


def surplus_command(t: Target) -> str:
    """Stop and disable every instance of T's service template that T does not run, printing each
    name: after a set shrank (`count`), or a restore of a smaller set, the instance left over
    would go on holding its GPUs and port (and start again at boot)."""
    keep = "|".join(shlex.quote(rt.unit) for rt in t.replica_targets)
    return (f"for u in $(systemctl list-units --all --plain --no-legend --type=service "
            f"{shlex.quote(t.layout.service + '@*')} | cut -d' ' -f1); do case \"$u\" in {keep}) ;; "
            "*) systemctl disable --now \"$u\" >/dev/null 2>&1; echo \"$u\";; esac; done; true")


def stop_surplus(h, t: Target, log: Callable[[str], None]) -> list[str]:
    """surplus_command on host H; the instances it stopped (one command)."""
    _, out = sh(h, surplus_command(t))
    gone = [u for u in out.split() if u]
    if gone:
        log(f"stopped {', '.join(gone)}: not in this release's set of {len(t.replica_targets)} replicas")
    return gone


GPU_FREE_MIB = 1024     # a GPU no process holds shows a few MiB (the driver's own context)


def gpus_free_command(gpus: list[int]) -> str:
    """Print `index, memory.used` (MiB) of GPUS (nvidia-smi's own numbering)."""
    return (f"nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits "
            f"-i {','.join(map(str, gpus))}")


def held_gpus(out: str) -> list[str]:
    """From gpus_free_command's output: the GPUs still holding memory ("4: 30000 MiB"); a line
    that cannot be read counts as held."""
    held = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[1].isdigit():
            held.append(f"unread: {line.strip()[:80]!r}")
        elif int(parts[1]) >= GPU_FREE_MIB:
            held.append(f"GPU {parts[0]}: {parts[1]} MiB in use")
    return held


def gpu_mib(out: str | None) -> dict[int, int] | None:
    """gpus_free_command's output as {GPU index: MiB in use} (lines that do not parse left out;
    None: nothing read, as without nvidia-smi)."""
    found = {}
    for line in (out or "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            found[int(parts[0])] = int(parts[1])
    return found or None


def retire(h, serving: Target, indices: list[int], log: Callable[[str], None], done: list[int]) -> None:
    """The serving set's replicas INDICES that the new release no longer runs (count shrank): each
    drained from the gateway (SERVING: the set the gateway runs), stopped and disabled, and its
    GPUs checked free. Raises ReplicaFailed with DONE (the replicas already switched: the restore
    takes them back, and starts the one that failed here again)."""
    http, endpoint, key = api(h, serving)
    for i in indices:
        rt = serving.replica(i)
        try:
            if gateway.find(gateway.list_workers(http, endpoint, key), rt.base_url):
                drained = gateway.drain(http, endpoint, key, rt.base_url, serving.plan.drain_timeout_s, poll_s=0.3)
                log(f"{rt.label} drained from the gateway in {drained.idle_s or drained.removed_s:.1f} s: "
                    "the new release does not run it")
            gpus = list(serving.plan.replicas[i].gpus)
            ok, out = sh(h, f"systemctl disable --now {rt.unit} && {gpus_free_command(gpus)}")
            held = held_gpus(out) if ok else [out.strip()[-300:] or "the stop failed"]
            if held:
                raise HealthError(f"its GPUs are not free after the stop: {'; '.join(held)}")
        except (HealthError, gateway.GatewayError, OSError) as exc:
            raise ReplicaFailed(i, f"{rt.label}: {exc}", done=done) from None
        log(f"stopped {rt.unit}: not in the new release's set; GPUs {','.join(map(str, gpus))} free")


def start_set(h, t: Target, check: Callable[[Target], None], poll_s: float, log: Callable[[str], None],
              steps: list[Step] | None = None) -> list[Step]:
    """Start every replica at once (nothing serves yet: a first deploy, or a switch from the single
    server; or the set replaced at once), health and identity each, the check on each, then the
    gateway in front. Instances the set no longer has are stopped first (their GPUs go back)."""
    steps = steps if steps is not None else [Step(rt.index, rt.unit.removesuffix(".service"))
                                             for rt in t.replica_targets]
    stop_surplus(h, t, log)
    units = " ".join(rt.unit for rt in t.replica_targets)
    start = time.monotonic()
    ok, out = sh(h, f"systemctl enable --quiet {units} && systemctl reset-failed {units} 2>/dev/null; "
                    f"systemctl restart {units}")
    for step, rt in zip(steps, t.replica_targets):
        try:
            if not ok:
                raise HealthError(f"could not start {units}: {out.strip()[-300:]}")
            confirm(h, rt, budget_s=t.data["service"]["health_timeout_s"], poll_s=poll_s)
            check(rt)
        except HealthError as exc:
            step.status = "failed"
            raise ReplicaFailed(rt.index, f"{rt.label}: {exc}\n--- last journal lines of {rt.unit} ---\n"
                                          f"{journal_tail(h, rt)}", done=[]) from None
        step.status, step.seconds = "switched", time.monotonic() - start
        log(f"{rt.label} healthy on {rt.base_url}")
    start_gateway(h, t, restart=unit_active(h, t.unit))
    log(f"gateway {t.unit} routes to {len(steps)} replicas on {t.base_url}")
    return steps


def restarted_since(h, t: Target, pids_before: dict[int, int | None], among: list[int]) -> list[int]:
    """The replicas AMONG whose process is not the one PIDS_BEFORE (the host's read) saw: systemd
    restarted them (a crash) from the files in place since. One command."""
    rest = [i for i in among if isinstance(pids_before.get(i), int) and pids_before[i] > 0]
    if not rest:
        return []
    _, out = sh(h, "systemctl show -p MainPID --value " + " ".join(t.replica(i).unit for i in rest))
    return [i for i, pid in zip(rest, out.split()) if pid.isdigit() and int(pid) != pids_before[i]]


def take_out(h, t: Target, indices: list[int], why: str, log: Callable[[str], None]) -> list[int]:
    """Remove replicas INDICES from the gateway (no drain wait: what they serve is not what was
    gated); the ones it listed. A gateway that does not answer removes nothing."""
    http, endpoint, key = api(h, t)
    try:
        listed = gateway.list_workers(http, endpoint, key)
    except (gateway.GatewayError, OSError):
        return []
    out = []
    for i in indices:
        w = gateway.find(listed, t.replica(i).base_url)
        if w is not None:
            gateway.remove_worker(http, endpoint, key, w.id)
            log(f"{t.replica(i).label} taken out of {t.unit}: {why}")
            out.append(i)
    return out


def roll(h, t: Target, indices: list[int], check: Callable[[Target], None], poll_s: float,
         log: Callable[[str], None], steps: list[Step] | None = None) -> list[Step]:
    """Replace the replicas INDICES one at a time while the others serve (see the module doc).
    Raises ReplicaFailed at the first that fails; the steps say what each went through. Where
    the steps know each replica's MainPID as the host's read saw it (Step.pid_before): before
    each step, a replica the roll has not reached whose process changed (systemd restarted it
    from the files in place, which no gate passed on it) is taken out of the gateway until its
    own step readmits it."""
    http, endpoint, key = api(h, t)
    steps = steps if steps is not None else [Step(rt.index, rt.unit.removesuffix(".service"))
                                             for rt in t.replica_targets]
    by_index = {s.index: s for s in steps}
    pids_before = {s.index: s.pid_before for s in steps if s.pid_before is not None}
    gateway_up = unit_active(h, t.unit)
    done: list[int] = []
    out_since: set[int] = set()
    for pos, i in enumerate(indices):
        rt, step = t.replica(i), by_index[i]
        start = time.monotonic()
        if gateway_up and pids_before:     # (replica I's own step drains it now anyway)
            ahead = [j for j in indices[pos + 1:] if j not in out_since]
            crashed = restarted_since(h, t, pids_before, ahead)
            out_since.update(take_out(h, t, crashed, "it restarted during the roll from files no gate passed on "
                                                     "it; out until its turn", log))
        try:
            # a replica the gateway does not list gets no traffic: nothing to drain (it may be down)
            listed = gateway_up and gateway.find(gateway.list_workers(http, endpoint, key), rt.base_url)
            if listed:
                drained = gateway.drain(http, endpoint, key, rt.base_url, t.plan.drain_timeout_s, poll_s=0.3)
                step.drained_s, step.in_flight_left = drained.idle_s or drained.removed_s, drained.in_flight
                if drained.idle_s is None and drained.unanswered:
                    log(f"{rt.label}: its /metrics did not answer to the end of the drain budget "
                        f"({t.plan.drain_timeout_s} s: {drained.unanswered}): restarting it cuts off whatever still runs")
                elif drained.idle_s is None:
                    log(f"{rt.label}: {drained.in_flight} requests still running after the drain budget "
                        f"({t.plan.drain_timeout_s} s): restarting it cuts them off")
                else:
                    log(f"{rt.label} drained from the gateway in {drained.idle_s:.1f} s")
            ok, out = sh(h, f"systemctl reset-failed {rt.unit} 2>/dev/null; systemctl enable --quiet {rt.unit}; "
                            f"systemctl restart {rt.unit}")
            if not ok:
                raise HealthError(f"could not restart {rt.unit}: {out.strip()[-300:]}")
            confirm(h, rt, budget_s=t.data["service"]["health_timeout_s"], poll_s=poll_s)
            check(rt)
            if gateway_up:
                gateway.readmit(http, endpoint, key, rt.base_url, GATEWAY_READY_S, poll_s=0.3)
        except (HealthError, gateway.GatewayError, OSError) as exc:
            step.status, step.seconds = "failed", time.monotonic() - start
            raise ReplicaFailed(i, f"{rt.label}: {exc}\n--- last journal lines of {rt.unit} ---\n"
                                   f"{journal_tail(h, rt)}", done=done) from None
        step.status, step.seconds = "switched", time.monotonic() - start
        done.append(i)
        log(f"{rt.label} switched in {step.seconds:.1f} s" + (", back in the gateway" if gateway_up else ""))
    return steps
