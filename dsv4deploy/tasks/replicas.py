"""A profile with `replicas:` (docs/replicas.md): the gateway's pinned venv, and the switch of the
replica set, which replaces deploy/serve.py's restart and verify steps for it.

The switch, when this run has a reason to restart:
- a set already serves behind the gateway (same replica URLs): a rolling update, one replica at
  a time (host/replicas.py roll), each gated on its own port before it rejoins the gateway, then
  a probe through the gateway: users are being served there, and a gate through it would load
  them with its bursts (a 1 s stall of every stream on the twin) and count their traffic in its
  figures;
- otherwise (first deploy, or a switch from the single server, which stops first): every
  replica starts, then the gateway, then the gate runs through the gateway as users see it.
A failure marks the release failed and restores the last good release (host/rollback.py): in a
rolling update only the replicas already touched, one at a time, while the others serve.
"""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import DeployError, deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import python

from dsv4deploy.gateway import model as gateway
from dsv4deploy.release import records as releases
from dsv4deploy.release.records import Release
from dsv4deploy.profile import replicas
from dsv4deploy.sglang.health import HealthError
from dsv4deploy.host import installer, ops
from dsv4deploy.host.checks import confirm, probe
from dsv4deploy.host.gate import (gate_record, prepare_release_gate, previous_report, rolling_gate_record,
                                  run_release_gate)
from dsv4deploy.host.io import sh
from dsv4deploy.host.release_store import ReleaseStore, RollbackError
from dsv4deploy.host.rollback import Rollback
from dsv4deploy.host.replicas import (GATEWAY_READY_S, ReplicaFailed, Step, api, parse_instances,
                                      restarted_since,
                                      retire, roll, start_gateway, start_set, stop_surplus, unit_active,
                                      wait_load_reports)
from dsv4deploy.host.state import VENV_MARKER, HostState
from dsv4deploy.release import running_set
from dsv4deploy.release.rollout import Rollout, Target
from dsv4deploy.tasks.release import Pending, reported
from dsv4deploy.tasks.service import gateway_files_differ


def gateway_venv_marker(r: Rollout) -> dict:
    inst = gateway.venv_install(r.rendered.gateway.version)
    install = installer.install_command(inst.venv, ["--compile-bytecode", *inst.pip_args])
    return {"installs": [install], "lock_sha256": hashlib.sha256(inst.lock_src.read_bytes()).hexdigest()}


@deploy("Gateway venv")
def gateway_venv(r: Rollout, state: HostState) -> list[OperationMeta]:
    """smg at the profile's release in its own venv, pinned by its lock file (a new lock: a new
    venv). Returns the operations whose change means the gateway must restart."""
    if r.rendered.gateway is None:
        return []
    inst = gateway.venv_install(r.rendered.gateway.version)
    lock = ops.file(name=f"smg {r.rendered.gateway.version} lock file", dest=inst.lock_dest,
                    content=inst.lock_src.read_bytes(), state=state.file(inst.lock_dest))
    venv = ops.venv(name=f"venv {inst.venv}: {inst.spec}", path=inst.venv, marker=gateway_venv_marker(r),
                    marker_file=f"{inst.venv}/{VENV_MARKER}", marker_state=state["gateway_venv"],
                    exists=bool(state.file(f"{inst.venv}/bin/python")))
    return [lock, venv]


def down_units(r: Rollout, state: HostState) -> list[str]:
    """The set's units that are not active (a crashed replica, a stopped gateway)."""
    return [name for name in state.units if state.unit(name).get("ActiveState") != "active"]


def cannot_roll(r: Rollout, state: HostState, reasons: list[str]) -> str | None:
    """While pyinfra prepares: why the serving replica set cannot take this release one replica at
    a time (replicas.roll_problem against the live release's kept profile: one command), or None.
    Replacing it stops every replica at once: refused, nothing changed, unless the operator asks
    for it with --data allow_downtime=true."""
    live = releases.current(state["releases"] or [])
    if not (r.target.is_set and reasons and live and state.front_active):     # (prev.is_set: a set serves)
        return None
    try:
        prev = ReleaseStore(host, r.layout.releases_dir).target(live)
        problem = replicas.roll_problem(prev.data, r.data) if prev.is_set else None
    except RollbackError as exc:
        # the run cannot know the serving set's replicas either (Switch.run): it replaces them at once
        problem = f"what the serving set runs cannot be read back ({exc})"
    if problem and not host.data.get("allow_downtime"):
        raise DeployError(f"release {live['release']:04d}'s replica set serves, and this release cannot replace it "
                          f"one replica at a time: {problem}. Replacing it stops every replica at once (users get "
                          f"errors until the new set is healthy): nothing was changed. To accept that, deploy again "
                          f"with --data allow_downtime=true")
    return problem


def out_of_gateway(r: Rollout, state: HostState) -> list[Target]:
    """The set's replicas its gateway does not list (a run cut off between a replica's restart and
    its return, a removal by hand): they may serve, but no user reaches them. None of them when
    the gateway did not answer (a stopped gateway is down_units' to start)."""
    return running_set.unlisted(r.target, state["gateway_workers"]) if r.target.is_set else []


def surplus_units(r: Rollout, state: HostState) -> list[str]:
    """Instances of the template that run but are none of the release's replicas (a shrink cut off
    before they left, one started by hand): they hold GPUs and may be in the gateway."""
    return running_set.surplus(r.target, parse_instances(state["instances"])) if r.target.is_set else []


def release_argv(r: Rollout) -> dict[str, str]:
    """Each replica unit's argv sha256 as this run renders it (what its process must run)."""
    return {rep.instance + ".service": running_set.argv_sha256(rep.argv) for rep in r.rendered.replicas}


def stale_instances(r: Rollout, state: HostState) -> list[Target]:
    """The release's replicas whose process runs other files than those in place (a cut-off roll,
    a crash restarted from files no gate passed on it): its argv is not the release's; or, where
    the argv cannot be read (a process that renamed itself), it started before its files last
    changed. (A restore's copy changes every file's ctime, also those of replicas it left alone:
    the argv decides where it can.) running_set.stale: the comparison `status` shows too."""
    if not r.target.is_set:
        return []
    return running_set.stale(r.target, release_argv(r), parse_instances(state["instances"]))


def gateway_restart(r: Rollout, state: HostState, differ: list[str], venv_changed: bool) -> str | None:
    """Why the set's gateway restarts in this run (None: it does not): smg's own venv or files
    change (DIFFER: the unit files' labels that differ), or it runs older gateway files than
    those in place (GatewayStale: a run cut off before the gateway's restart, or a restore)."""
    if not r.target.is_set:
        return None
    if venv_changed:
        return "its venv changes"
    if gateway_files_differ(differ):
        return "its unit or launcher changes"
    if state["gateway_stale"]:
        return "runs older gateway files than those in place"
    return None


@deploy("Replica set")
def switch_set(r: Rollout, state: HostState, reasons: list[str], restart_gateway: str | None,
               store: ReleaseStore, pending: Pending | None) -> None:
    """Roll the set (see the module doc) to PENDING's release (None: no new release), its record
    kept through STORE, the run's; with no reason and every unit active: nothing at all, unless
    the gateway lists a replica no more (it is checked, then added back) or runs older files
    than those in place (RESTART_GATEWAY: why it restarts)."""
    down = down_units(r, state)
    if not reasons and not down:
        surplus, stale = surplus_units(r, state), stale_instances(r, state)
        if surplus:
            stop_surplus_units(r, surplus)
        if stale:
            reroll_stale(r, stale)
        missing = [rt for rt in out_of_gateway(r, state) if rt not in stale]
        if missing:
            readmit_replicas(r, missing)
        if restart_gateway:
            refresh_gateway(r, restart_gateway)
        return
    what = "switch to the new release" if reasons else f"start {', '.join(down)}"

    # each replica's process as the host was read: one the roll has not reached that is another
    # by a failure was restarted meanwhile from the new files (Switch.restarted_meanwhile)
    pids = {rt.index: state.unit(rt.unit.removesuffix(".service")).get("MainPID") for rt in r.target.replica_targets}

    def run(state_, host):  # noqa: pyinfra passes (state, host) by these names
        Switch(store, r, reasons, restart_gateway, pending.release if pending else None, pids_before=pids).run()

    python.call(name=f"replica set: {what}", function=reported(run))


def refresh_gateway(r: Rollout, why: str) -> None:
    """Restart the gateway alone (no new release: the replicas serve throughout), then wait until
    it routes to every replica; then a probe through it."""

    def run(state_, host):  # noqa: pyinfra passes (state, host) by these names
        start_gateway(host, r.target, restart=True, reload=True)
        print(f"[{host.name}] restarted {r.target.unit} ({why}); {probe(host, r.target)}")

    python.call(name=f"replica set: restart {r.target.unit} ({why})", function=reported(run))


def stop_surplus_units(r: Rollout, units: list[str]) -> None:
    """Instances the release does not run: out of the gateway (its workers that are none of the
    release's replicas, drained), then stopped and disabled."""

    def run(state_, host):  # noqa: pyinfra passes (state, host) by these names
        http, endpoint, key = api(host, r.target)
        for w in gateway.strays(gateway.list_workers(http, endpoint, key), r.target.plan.worker_urls):
            gateway.drain(http, endpoint, key, w.url, r.target.plan.drain_timeout_s, poll_s=0.3)
            print(f"[{host.name}] {w.url} drained from {r.target.unit}: no replica of this release listens there")
        stop_surplus(host, r.target, lambda m: print(f"[{host.name}] {m}"))

    python.call(name=f"replica set: stop {', '.join(units)} (not in this release's set)", function=reported(run))


def reroll_stale(r: Rollout, stale: list[Target]) -> None:
    """Replicas running other files than those in place: each out of the gateway, restarted,
    probed on its own port (the release passed its gate), back in."""

    def run(state_, host):  # noqa: pyinfra passes (state, host) by these names
        roll(host, r.target, [rt.index for rt in stale], lambda rt: probe(host, rt),
             float(host.data.get("health_poll_s", 2.0)), lambda m: print(f"[{host.name}] {m}"))

    python.call(name=f"replica set: restart {', '.join(rt.unit for rt in stale)} (runs other files than those "
                     "in place)", function=reported(run))


def readmit_replicas(r: Rollout, missing: list[Target]) -> None:
    """Add back replicas the gateway does not list, each after health and identity on its own port."""

    def run(state_, host):  # noqa: pyinfra passes (state, host) by these names
        http, endpoint, key = api(host, r.target)
        poll = float(host.data.get("health_poll_s", 2.0))
        for rt in missing:
            confirm(host, rt, budget_s=r.data["service"]["health_timeout_s"], poll_s=poll)
            gateway.readmit(http, endpoint, key, rt.base_url, GATEWAY_READY_S, poll_s=0.3)
            print(f"[{host.name}] {rt.label} is back in {r.target.unit} (it served, but the gateway did not list it)")

    python.call(name=f"replica set: add {', '.join(rt.unit for rt in missing)} back to the gateway "
                     "(healthy, not listed)", function=reported(run))


class Switch:
    """One run's switch of the set: which path, the gate per replica, the record."""

    def __init__(self, store: ReleaseStore, r: Rollout, reasons: list[str], restart_gateway: str | None,
                 release: Release | None, pids_before: dict[int, int | None] | None = None):
        self.store, self.h, self.r, self.t, self.reasons = store, store.h, r, r.target, reasons
        self.restart_gateway = restart_gateway
        self.pids_before = pids_before or {}
        self.poll = float(self.h.data.get("health_poll_s", 2.0))
        self.release = release            # the release this switch records (None: none is new)
        self.previous = self.store.current()
        self.gates: dict[int, object] = {}
        self.prepared = None              # the gate's runner and client, once for every replica

    def log(self, message: str) -> None:
        print(f"[{self.h.name}] {message}")

    @property
    def _number(self) -> int | None:
        return self.release.number if self.release else None

    def _previous_report(self, t: Target) -> dict | None:
        """The previous release's gate report for T (the set, or one replica), to compare with."""
        return previous_report(self.h, t, self.previous["release"] if self.previous else None)

    def _previous_target(self) -> Target | None:
        if self.previous is None:
            return None
        try:
            return self.store.target(self.previous)
        except RollbackError:
            return None

    def gate_replica(self, rt: Target) -> None:
        """The profile's gate against one replica on its own port, before it rejoins the gateway."""
        outcome = run_release_gate(self.h, rt, self._number, self._previous_report(rt), self.r.profile.name,
                                   prepared=self.prepared)
        self.gates[rt.index] = outcome
        if not outcome.passed:
            raise HealthError(f"smoke gate failed: {outcome.verdict.message}")

    def run(self) -> None:
        t, L = self.t, self.r.layout
        if unit_active(self.h, f"{L.service}.service"):
            sh(self.h, f"systemctl disable --now {L.service}.service")
            self.log(f"stopped {L.service}.service: the replica set takes its GPUs, and the gateway its port")
        sh(self.h, "systemctl daemon-reload")
        if not self.reasons:
            return self.start_down()
        prev = self._previous_target()
        rolling = (prev is not None and prev.is_set and unit_active(self.h, t.unit)
                   and replicas.roll_problem(prev.data, t.data) is None)
        steps: list[Step] = [Step(rt.index, rt.unit.removesuffix(".service"), pid_before=self.pids_before.get(rt.index))
                             for rt in t.replica_targets]
        try:
            if rolling:
                self.log(f"rolling update of {len(steps)} replicas behind {t.unit}, one at a time")
                self.prepared = prepare_release_gate(self.h, t)      # while every replica still serves
                roll(self.h, t, [s.index for s in steps], self.gate_replica, self.poll, self.log, steps)
                # a set that shrank: the replicas it no longer runs leave once the others passed
                retire(self.h, prev, replicas.surplus(prev.data, t.data), self.log, done=[s.index for s in steps])
                stop_surplus(self.h, t, self.log)        # any other instance the release does not run
                if self.restart_gateway:
                    start_gateway(self.h, t, restart=True)
                    self.log(f"restarted {t.unit} ({self.restart_gateway})")
                # every replica passed its gate alone; the set as users reach it is probed, not loaded
                summary = rolling_gate_record({i: gate_record(o) for i, o in self.gates.items()},
                                              self.probe_through_gateway())
            else:
                start_set(self.h, t, lambda rt: None, self.poll, self.log, steps)
                self.settle_routing()
                gate = run_release_gate(self.h, t, self._number, self._previous_report(t), self.r.profile.name)
                if not gate.passed:
                    self.fail(steps, f"smoke gate through the gateway failed: {gate.verdict.message}", None)
                summary = gate_record(gate)
        except ReplicaFailed as exc:
            self.fail(steps, str(exc), exc if rolling else None)
        except HealthError as exc:
            self.fail(steps, str(exc), None)
        self.record(steps, summary)

    def probe_through_gateway(self) -> str:
        """After a rolling update: short generations through the gateway, two per replica, at once."""
        said = probe(self.h, self.t, requests=2 * len(self.t.replica_targets))
        self.log(said)
        return said

    def settle_routing(self) -> None:
        """Before the gate through the gateway: until smg has a load report of every replica (a
        replica it has just (re)registered has none for up to 10 s and gets no request meanwhile).
        Only for a policy that routes by those reports."""
        if self.t.plan.gateway.policy not in gateway.LOAD_AWARE:
            return
        waited = wait_load_reports(self.h, self.t, self.log)
        if waited is not None and waited >= 1.0:
            self.log(f"the gateway has a load report of every replica after {waited:.1f} s")

    def start_down(self) -> None:
        """No new release: start what is down, each probed on its own port (the release passed its
        gate when it was deployed, as a rollback's), then a probe through the gateway."""
        t = self.t
        down = [rt.index for rt in t.replica_targets if not unit_active(self.h, rt.unit)]
        try:
            roll(self.h, t, down, lambda rt: probe(self.h, rt), self.poll, self.log)
            if not unit_active(self.h, t.unit):
                start_gateway(self.h, t, restart=False)
            elif self.restart_gateway:
                start_gateway(self.h, t, restart=True)
                self.log(f"restarted {t.unit} ({self.restart_gateway})")
            self.probe_through_gateway()
        except (ReplicaFailed, HealthError) as exc:
            raise DeployError(f"the deployed release's replica set could not be started: {exc}") from None

    def _summary(self, steps: list[Step]) -> list[dict]:
        out = []
        for s in steps:
            doc = s.record()
            if s.index in self.gates:
                doc["gate"] = gate_record(self.gates[s.index])
            out.append(doc)
        return out

    def fail(self, steps: list[Step], reason: str, failed: ReplicaFailed | None) -> None:
        """Record the release failed and restore the last good one (only the replicas it touched,
        one at a time, when it was a rolling update); raise with what serves now."""
        rel = self.release.with_replicas(self._summary(steps)) if self.release else None
        indices = None
        if failed is not None:
            indices = [failed.index] + failed.done     # the one out of the gateway first
            indices += self.restarted_meanwhile(indices)
        outcome = Rollback(self.store, self.poll).after_failure(rel, self.t, reason, indices=indices)
        name = self.release.name if self.release else "the new release"
        raise DeployError(f"{name} ({self.r.profile.name}) failed: {reason}\n{outcome}")

    def restarted_meanwhile(self, touched: list[int]) -> list[int]:
        """Replicas the roll had not reached (not in TOUCHED) whose process is not the one the host's
        read saw: systemd restarted them (a crash) from the new release's files, which no gate
        passed; the restore takes them back too. One command."""
        rest = [rt.index for rt in self.t.replica_targets if rt.index not in touched]
        changed = restarted_since(self.h, self.t, self.pids_before, rest)
        for i in changed:
            self.log(f"{self.t.replica(i).label} restarted during the roll (from the new files, ungated): "
                     "restored with the others")
        return changed

    def record(self, steps: list[Step], summary: dict) -> None:
        """SUMMARY: the release's gate (through the gateway for a set that started together; each
        replica's own, weakest first, after a rolling update)."""
        if not self.release:
            return
        rel = self.store.go_live(self.release.with_gate(summary).with_replicas(self._summary(steps)))
        self.log(f"{rel.name} deployed: {self.r.profile.name} serves from {len(steps)} replicas "
                 f"through {self.t.unit} on {self.t.base_url}")
