"""The deploy lock, and the release records around the switch: `pending` before it,
`deployed` after health, identity and the smoke gate, or `failed` followed by
an automatic rollback to the last release that passed. The host side of both is the release
store (host/release_store.py); these steps decide when.

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
from dsv4deploy.release.rollout import Rollout
from dsv4deploy.host.gate import (carry_reports, gate_record, keep_reports, prepare_release_gate, previous_report,
                                  run_release_gate, warm_plotting)
from dsv4deploy.tasks.rollback import after_failure, ready_to_restore
from dsv4deploy.tasks.venv import launch_check_key
from dsv4deploy.host.checks import confirm, journal_tail, observer


def read_locked(r: Rollout, label: str) -> HostState:
    """The host's state, read in the command that takes the deploy lock (LABEL), so that what
    the run decides from cannot change under it and the lock costs no round trip of its own;
    refused with the holder's PID and start. A dry run (`--dry`, `make plan`) reads, unlocked."""
    h = ctx_host.get()          # the real Host, not the proxy: the callback that gives the lock back compares hosts
    if settings_of(host.data).dry_run:
        return read_state(h, r)
    return ReleaseStore(h, r.layout.releases_dir).read_locked(
        label, lambda first: read_state(h, r, first=first), break_lock=host.data.get("break_lock"),
        state=ctx_state.get())


def deploy_lock(label: str) -> None:
    """Take the host's deploy lock now (prepare stage), in one command; refuse with the holder's
    PID and start. A dry run (`--dry`, `make plan`) changes nothing, so it takes no lock."""
    if settings_of(host.data).dry_run:
        return
    # the real Host, not the proxy: the callback that gives the lock back compares hosts
    ReleaseStore(ctx_host.get()).take_lock(label, break_lock=host.data.get("break_lock"), state=ctx_state.get())


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


def settle_interrupted(r: Rollout, state: HostState) -> None:
    """A `pending` release left by a cut-off run is settled before anything else happens."""
    if not any(rec["status"] == releases.PENDING for rec in state["releases"] or []):
        return

    def settle(state, host):  # noqa: pyinfra passes (state, host) by these names
        live_sha = host.get_fact(Sha256File, path=r.layout.manifest)
        healthy = observer(host, r.target)().http == 200
        for doc in ReleaseStore(host, r.layout.releases_dir).settle_interrupted(live_sha, healthy):
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


def begin_release(r: Rollout, state: HostState) -> Pending:
    """Release NNNN as pending, with the resolved profile, the rendered files and the venv's
    `pip freeze`, numbered after the records the read found (the run holds the lock: nobody else
    adds one). Nothing is written here: the switch's command writes it first (tasks/service.py).
    Its `created` time is this run's plan, taken while the lock is taken, as the lock's own."""
    profile_doc = {"name": r.profile.name, "files": list(r.profile.files), "data": r.profile.data}
    store = ReleaseStore(host, r.layout.releases_dir)
    rel, command = store.pending(
        state["releases"] or [], files=r.rendered.files, profile_doc=profile_doc, venv=r.layout.venv,
        profile=r.profile.name, content_hash=r.profile.content_hash, manifest_sha256=r.manifest_sha256,
        sglang_version=r.data["sglang"]["version"], launch_check=launch_check_key(r))

    def written(state, host):  # noqa: pyinfra passes (state, host) by these names
        ReleaseStore(host, r.layout.releases_dir).begun(rel)
        r.run.release = rel
        print(f"[{host.name}] {rel.name} ({r.profile.name}) recorded pending before the switch")

    return Pending(rel, command, written)


@deploy("Verify")
def verify_and_record(r: Rollout) -> None:
    """Health within the profile's budget, identity, the smoke gate; then deployed, or failed
    and rolled back to the last release that passed."""

    def verify(state, host):  # noqa: pyinfra passes (state, host) by these names
        rel = r.run.release
        store = ReleaseStore(host, r.layout.releases_dir)
        poll = float(host.data.get("health_poll_s", 2.0))
        name = rel.name if rel else "the running release"
        previous = store.current()
        # while the server starts: plotting imported, the report to compare with read, the gate's
        # runner chosen and its client in place, and the release a failure would roll back to
        # read and checked (no round trip of it while nothing serves)
        warm_plotting()
        before = previous_report(host, r.target, previous["release"] if previous else None)
        prepared = prepare_release_gate(host, r.target)
        survey = store.prune_survey() if rel else None
        ready = ready_to_restore(host, previous)
        try:
            confirm(host, r.target, budget_s=r.data["service"]["health_timeout_s"], poll_s=poll)
        except HealthError as exc:
            tail = journal_tail(host, r.target)
            outcome = after_failure(host, rel, r.target, str(exc), poll_s=poll, ready=ready, last=last_step(state, host))
            raise DeployError(f"{name} ({r.profile.name}) failed: {exc}\n--- last journal lines of "
                              f"{r.target.unit} ---\n{tail}\n{outcome}") from None
        reports: list[tuple] = []         # kept on the host with the record that follows the gate
        gate = run_release_gate(host, r.target, rel.number if rel else None,
                                previous["release"] if previous else None, r.profile.name,
                                keep=lambda *where: reports.append(where), previous_doc=before, prepared=prepared)
        if rel:
            rel = r.run.release = rel.with_gate(gate_record(gate))
        if not gate.passed:
            for where in reports:
                keep_reports(host, *where)
            outcome = after_failure(host, rel, r.target, f"smoke gate failed: {gate.verdict.message}", poll_s=poll,
                                    ready=ready, last=last_step(state, host))
            raise DeployError(f"{name} ({r.profile.name}) failed the smoke gate: {gate.verdict.message}\n{outcome}")
        if rel:
            # the records, the reports, the prune's removal and (when nothing follows) the lock: one command
            store.go_live(rel, also=carry_reports(host, reports), survey=survey, last=last_step(state, host))
            print(f"[{host.name}] {rel.name} deployed: {r.profile.name} is serving on "
                  f"{r.target.base_url} ({gate.summary})")

    python.call(name="health, identity, smoke gate, record", function=reported(verify))

