"""The deploy lock, and the release records around the switch: `pending` before it,
`deployed` after health, identity and the smoke gate, or `failed` followed by
an automatic rollback to the last release that passed. The host side of both is the release
store (host/release_store.py) and the rollback (host/rollback.py); these steps decide when.
The run's store (release_store) goes to each step that reads or writes a record, and the
release begin_release records pending goes to the steps after the switch: no step learns
either from another through shared state.

The lock is taken while pyinfra prepares (before any change) and given back when the last
operation ends or one fails, so a run that changes nothing reports no changed operation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyinfra import host, logger
from pyinfra.api import DeployError, deploy
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Sha256File
from pyinfra.operations import python

from dsv4deploy.cli.settings import settings_of
from dsv4deploy.release import records as releases
from dsv4deploy.release.records import Release
from dsv4deploy.host.state import HostState, read_state
from dsv4deploy.sglang.health import HealthError
from dsv4deploy.host.release_store import ReleaseStore, last_step
from dsv4deploy.host.rollback import Rollback
from dsv4deploy.release.rollout import Rollout, Target
from dsv4deploy.render.layout import RELEASES
from dsv4deploy.host.gate import (carry_reports, gate_record, keep_reports, prepare_release_gate, previous_report,
                                  run_release_gate, warm_plotting)
from dsv4deploy.tasks.venv import launch_check_key
from dsv4deploy.host.checks import confirm, journal_memory, journal_tail, observer
from dsv4deploy.profile import calibration
from dsv4deploy.release import startup_log


def release_store(r: Rollout | None = None) -> ReleaseStore:
    """This run's release store on the host being prepared (R's releases, else the default
    folder): the one that takes the lock, and then keeps the records the run holds under it."""
    # the real Host, not the proxy: the callback that gives the lock back compares hosts
    return ReleaseStore(ctx_host.get(), r.layout.releases_dir if r else RELEASES)


def read_locked(r: Rollout, store: ReleaseStore, label: str) -> HostState:
    """The host's state, read in the command that takes the deploy lock (LABEL) through STORE, so
    that what the run decides from cannot change under it and the lock costs no round trip of
    its own; refused with the holder's PID and start. A dry run (`--dry`, `make plan`) reads,
    unlocked."""
    if settings_of(host.data).dry_run:
        return read_state(store.h, r)
    return store.read_locked(label, lambda first: read_state(store.h, r, first=first),
                             break_lock=host.data.get("break_lock"), state=ctx_state.get())


def deploy_lock(store: ReleaseStore, label: str) -> None:
    """Take the host's deploy lock through STORE now (prepare stage), in one command; refuse with
    the holder's PID and start. A dry run (`--dry`, `make plan`) changes nothing, so it takes no
    lock."""
    if settings_of(host.data).dry_run:
        return
    store.take_lock(label, break_lock=host.data.get("break_lock"), state=ctx_state.get())


# --- releases ---------------------------------------------------------------------------------

def _lost_connection() -> tuple[type[BaseException], ...]:
    from paramiko.ssh_exception import SSHException
    from pyinfra.api.exceptions import ConnectError, PyinfraError
    # PyinfraError: a fact the step reads failed on the host ("No hosts remaining!")
    return (EOFError, ConnectionError, TimeoutError, SSHException, ConnectError, PyinfraError)


LOST_CONNECTION = _lost_connection()


def reported(callback):
    """A python.call callback that fails the operation with its message instead of a traceback
    (pyinfra fails an operation whose (state, host) callback returns False)."""

    def wrapper(state, host):  # noqa: pyinfra passes (state, host) by these names
        try:
            return callback(state, host)
        except DeployError as exc:
            for line in str(exc).splitlines():
                logger.error(f"    [{host.name}] {line}")
            return False
        except LOST_CONNECTION as exc:   # the host rebooted or the link dropped mid-step: no traceback
            logger.error(f"    [{host.name}] lost the connection to the host ({type(exc).__name__}: "
                         f"{str(exc) or 'the link closed'}): it rebooted, or the network dropped, or it stopped "
                         "answering")
            return False
    wrapper.__name__ = callback.__name__
    return wrapper


def pending_in(state: HostState) -> bool:
    """The host holds a `pending` release left by a cut-off run (settle_interrupted settles it)."""
    return any(rec["status"] == releases.PENDING for rec in state["releases"] or [])


def settle_interrupted(r: Rollout, state: HostState, store: ReleaseStore) -> None:
    """A `pending` release left by a cut-off run is settled before anything else happens."""
    if pending_in(state):
        settle_pending(store, r.target)


def settle_pending(store: ReleaseStore, live: Target, live_sha: str | None = None) -> None:
    """Settle the pending records in STORE (never deployed: unverified if its files are in place,
    else failed), from whether LIVE, the service whose files are in place, answers, and the
    sha256 of its manifest (LIVE_SHA; read in the step when not given)."""

    def settle(state, host):  # noqa: pyinfra passes (state, host) by these names
        sha = live_sha if live_sha is not None else host.get_fact(Sha256File, path=live.layout.manifest)
        healthy = observer(host, live)().http == 200
        for doc in store.settle_interrupted(sha, healthy):
            print(f"[{host.name}] release {doc['release']:04d}: {doc['status']} ({doc['reason']})")

    python.call(name="settle releases left pending by an interrupted run", function=reported(settle))


def needs_release(r: Rollout, state: HostState) -> str | None:
    """Why the deployed release is not this one (None: it is): its manifest differs, or none is."""
    live = releases.current(state["releases"] or [])
    if live is None:
        return "no release is deployed"
    if live["manifest_sha256"] != r.manifest_sha256:
        return f"release {live['release']:04d} renders differently"
    return None


@dataclass(frozen=True)
class Pending:
    """Release NNNN as `pending`: the command that writes its record and folder, which the
    switch's command carries first (nothing changes unless it was written), and DONE, which the
    switch's operation calls once all its commands succeeded (the restart included)."""

    release: Release
    command: str
    done: Callable


def begin_release(r: Rollout, state: HostState, store: ReleaseStore) -> Pending:
    """Release NNNN as pending, with the resolved profile, the rendered files and the venv's
    `pip freeze`, numbered after the records the read found (the run holds the lock: nobody else
    adds one). Nothing is written here: the switch's command writes it first (tasks/service.py),
    then STORE knows it. Its `created` time is this run's plan, taken while the lock is taken, as
    the lock's own. The steps after the switch get the returned Pending."""
    profile_doc = {"name": r.profile.name, "files": list(r.profile.files), "data": r.profile.data}
    rel, command = store.pending(
        state["releases"] or [], files=r.rendered.files, profile_doc=profile_doc, venv=r.layout.venv,
        profile=r.profile.name, content_hash=r.profile.content_hash, manifest_sha256=r.manifest_sha256,
        sglang_version=r.data["sglang"]["version"], launch_check=launch_check_key(r))

    def written(state, host):  # noqa: pyinfra passes (state, host) by these names
        store.begun(rel)
        print(f"[{host.name}] {rel.name} ({r.profile.name}) recorded pending before the switch")

    return Pending(rel, command, written)


def startup_memory(h, r: Rollout, rel: Release | None, started: bool) -> Release | None:
    """REL with what SGLang logged about GPU memory while it started (STARTED: it came up; else
    the out-of-memory message, if that is why it did not), and the host's calibration on the
    control node (reports/<host>/calibration.json) remade from it. A replica set's servers are
    not read yet; nor is a start that logged no memory line."""
    if rel is None or r.target.is_set:
        return rel
    figures = startup_log.parse(journal_memory(h, r.target))
    if not figures:
        return rel
    rel = rel.with_startup(calibration.startup_entry(r.data, r.report.budget, figures, started))
    print(f"[{h.name}] {rel.name}: SGLang at start: {startup_log.summary(figures)}")
    path = calibration.path_for(r.settings.reports, h.name)
    try:
        previous = calibration.read(path)
    except calibration.CalibrationError as exc:
        print(f"[{h.name}] warning: {exc}; made anew")
        previous = None
    doc = calibration.derive(h.name, [rel.record], previous)
    calibration.write(path, doc)
    if (e := calibration.evidence(rel.record)) is not None:
        print(f"[{h.name}] calibration {path}: {e['text']}")
    return rel


@deploy("Verify")
def verify_and_record(r: Rollout, store: ReleaseStore, pending: Pending | None) -> None:
    """Health within the profile's budget, identity, the smoke gate; then PENDING's release
    deployed, or failed and rolled back to the last release that passed. Without PENDING (a
    stopped unit started, no new release) only the checks run, and a failure rolls back too."""

    def verify(state, host):  # noqa: pyinfra passes (state, host) by these names
        rel = pending.release if pending else None
        rollback = Rollback(store, poll_s=float(host.data.get("health_poll_s", 2.0)))
        name = rel.name if rel else "the running release"
        previous = store.current()
        # while the server starts: plotting imported, the report to compare with read, the gate's
        # runner chosen and its client in place, and the release a failure would roll back to
        # read and checked (no round trip of it while nothing serves)
        warm_plotting()
        before = previous_report(host, r.target, previous["release"] if previous else None)
        prepared = prepare_release_gate(host, r.target)
        survey = store.prune_survey() if rel else None
        ready = rollback.ready(previous)
        try:
            confirm(host, r.target, budget_s=r.data["service"]["health_timeout_s"], poll_s=rollback.poll_s)
        except HealthError as exc:
            tail = journal_tail(host, r.target)
            rel = startup_memory(host, r, rel, started=False)
            outcome = rollback.after_failure(rel, r.target, str(exc), ready=ready, last=last_step(state, host))
            raise DeployError(f"{name} ({r.profile.name}) failed: {exc}\n--- last journal lines of "
                              f"{r.target.unit} ---\n{tail}\n{outcome}") from None
        rel = startup_memory(host, r, rel, started=True)
        reports: list[tuple] = []         # kept on the host with the record that follows the gate
        gate = run_release_gate(host, r.target, rel.number if rel else None, before, r.profile.name,
                                keep=lambda *where: reports.append(where), prepared=prepared)
        if rel:
            rel = rel.with_gate(gate_record(gate))
        if not gate.passed:
            for where in reports:
                keep_reports(host, *where)
            outcome = rollback.after_failure(rel, r.target, f"smoke gate failed: {gate.verdict.message}",
                                             ready=ready, last=last_step(state, host))
            raise DeployError(f"{name} ({r.profile.name}) failed the smoke gate: {gate.verdict.message}\n{outcome}")
        if rel:
            # the records, the reports, the prune's removal and (when nothing follows) the lock: one command
            store.go_live(rel, also=carry_reports(host, reports), survey=survey, last=last_step(state, host))
            print(f"[{host.name}] {rel.name} deployed: {r.profile.name} is serving on "
                  f"{r.target.base_url} ({gate.summary})")

    python.call(name="health, identity, smoke gate, record", function=reported(verify))

