"""Rollback: put a release that passed back in service, from the files kept in its record.

Like Helm, a rollback is a new history entry (`kind: rollback`, `restores: N`). The restored
release's venv and weights must still be on the host (pruning keeps what kept releases use).
Instead of the full gate it gets a short probe: it passed the gate before.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import DeployError, deploy
from pyinfra.facts.files import Sha256File
from pyinfra.operations import python

from dsv4deploy.gateway import model as gateway
from dsv4deploy.release import records as releases
from dsv4deploy.sglang.health import HealthError
from dsv4deploy.host.io import sh
from dsv4deploy.host.release_store import ReleaseStore, RollbackError, last_step
from dsv4deploy.release.records import Release
from dsv4deploy.release.rollout import Target
from dsv4deploy.host.checks import confirm, journal_tail, observer, probe
from dsv4deploy.host.replicas import (ReplicaFailed, api, gateway_stale, roll, start_gateway, start_set,
                                      stop_surplus, unit_active)


# A checkpoint is complete when the weights step left its marker: sizes (rsync, local sources) or
# sizes and digests (hf, tasks/weights.py and weights_check.py).
CHECKPOINT_MARKERS = (".dsv4deploy-complete.json", ".dsv4deploy-verified.json")


def restore(h, rec: dict, *, cause: str, poll_s: float = 2.0, indices: list[int] | None = None,
            target: Target | None = None, checked: bool = False, failed: Release | None = None,
            last: bool = False) -> Release:
    """Bring release `rec` back: its files, daemon-reload, restart, health, identity, probe. The
    attempt is a history entry whatever happens: a release that cannot be restored leaves a
    `failed` rollback entry saying why. A replica set is restored one replica at a time behind
    its gateway (only INDICES, the replicas a failed rolling update touched, when given). TARGET:
    the service REC ran, when the caller has read it already (store.target); CHECKED: and found
    what it needs on the host (ready_to_restore). FAILED: the release that failed, its record
    written in the command that puts the files back (one round trip less while nothing serves);
    LAST: the run ends with this restore, and its record gives the lock back."""
    store = ReleaseStore(h)
    first = (failed.record,) if failed else ()
    new = Release(releases.rollback_record(store.records(), rec, cause))
    try:
        t = target or store.target(rec)
        if not checked:
            missing_for_restore(h, store, rec, t)
    except RollbackError as exc:
        store.save(*first, new.with_status(releases.FAILED, f"rollback failed: {exc}").record)
        raise
    try:
        if t.is_set:
            ok, out = store.put_back(rec["release"], new, then="systemctl daemon-reload", also=first)
            if not ok:
                raise HealthError(f"could not restore the files: {out.strip()[-300:]}")
            restore_set(h, t, indices, poll_s)
        else:
            ok, out = store.put_back(rec["release"], new, then=f"systemctl daemon-reload && {stop_set_units(t)}"
                                                               f"systemctl reset-failed {t.unit}; systemctl restart {t.unit} 2>&1",
                                     also=first)
            if not ok:
                raise HealthError(f"could not restore the files or restart {t.unit}: {out.strip()[-300:]}")
            confirm(h, t, budget_s=t.data["service"]["health_timeout_s"], poll_s=poll_s)
            probe(h, t)
    except (HealthError, ReplicaFailed) as exc:
        store.save(*first, new.with_status(releases.FAILED, f"rollback failed: {exc}").record)
        raise RollbackError(f"rollback to release {rec['release']:04d} failed: {exc}\n--- last journal lines of "
                            f"{t.unit} ---\n{journal_tail(h, t)}", switched=True) from None
    return store.mark_deployed(new, last=last)


def ready_to_restore(h, rec: dict | None) -> tuple[dict, Target] | None:
    """Release REC and its Target, read and found restorable ahead of need: a deploy asks while
    its new server starts (the lock keeps anything from removing them meanwhile), so a rollback
    costs two round trips less while nothing serves. None when REC is None or not restorable
    (restore then finds why and records it). Two commands."""
    if rec is None:
        return None
    store = ReleaseStore(h)
    try:
        t = store.target(rec)
        missing_for_restore(h, store, rec, t)
    except RollbackError:
        return None
    return rec, t


def missing_for_restore(h, store: ReleaseStore, rec: dict, t: Target) -> None:
    """Refuse, naming each, when what release REC needs is gone from the host: its venv, its
    weights, its kept files (and a replica set's gateway venv). One command."""
    marker = " || ".join(f"test -f {t.layout.model_dir}/{m}" for m in CHECKPOINT_MARKERS)
    gw = f"test -x {t.gateway_venv}/bin/python || echo 'its gateway venv'; " if t.is_set else ""
    folder = store.folder(rec["release"])
    ok, out = sh(h, f"{gw}test -x {t.layout.python} || echo 'its venv ({t.layout.venv})'; "
                    f"{{ {marker}; }} || echo 'its weights ({t.layout.model_dir})'; "
                    f"test -d {folder}/files || echo 'its kept files ({folder}/files)'")
    gone = [line for line in out.splitlines() if line.strip()]
    if gone:
        raise RollbackError(f"release {rec['release']:04d} cannot be restored: gone from the host: " + ", ".join(gone))


def stop_set_units(t: Target) -> str:
    """A command prefix that stops and disables a replica set of T's service, if one runs (the
    single server takes its port and GPUs back)."""
    s = t.layout.service
    return (f"systemctl disable --now $(systemctl list-units --all --plain --no-legend --type=service "
            f"'{s}@*' '{s}-gateway.service' | cut -d' ' -f1) >/dev/null 2>&1; ")


def restore_set(h, t: Target, indices: list[int] | None, poll_s: float) -> None:
    """Restore a replica set: behind a running gateway one replica at a time (each probed before it
    rejoins); with no gateway running (a switch back from the single server), all at once."""
    log = lambda m: print(f"[{h.name}] {m}")  # noqa: E731
    if unit_active(h, t.unit):
        # a failed larger set's extra replicas go (start_set does it itself), and out of the
        # gateway at once: it would route users to them for the whole restore
        if stop_surplus(h, t, log):
            remove_strays(h, t, only_dead=True)
        every = [rt.index for rt in t.replica_targets]
        roll(h, t, indices if indices is not None else every, lambda rt: probe(h, rt), poll_s, log)
        # across a change of the replicas' addresses the gateway still lists the ones that moved
        # (they served while the restored ones came back)
        remove_strays(h, t)
        # across a change of smg itself (version, policy, launcher) the gateway runs the failed
        # release's files: the restored ones are in place, so it restarts from them
        if gateway_stale(h, t):
            start_gateway(h, t, restart=True)
            log(f"restarted {t.unit}: it ran other gateway files than the restored release's")
    else:
        sh(h, f"systemctl disable --now {t.layout.service}.service")
        start_set(h, t, lambda rt: probe(h, rt), poll_s, log)


def remove_strays(h, t: Target, only_dead: bool = False) -> None:
    """Remove from T's gateway the workers no replica of T's release is (gateway.strays); with
    ONLY_DEAD, only those that refuse connections (an instance just stopped)."""
    http, endpoint, key = api(h, t)
    for w in gateway.strays(gateway.list_workers(http, endpoint, key), t.plan.worker_urls):
        if only_dead and not _refuses(http, w.url):
            continue
        gateway.remove_worker(http, endpoint, key, w.id)
        print(f"[{h.name}] removed {w.url} from {t.unit}: no replica of the restored release listens there")


def _refuses(http, url: str) -> bool:
    """Whether nothing listens at URL (a refused connection; a timeout says nothing)."""
    try:
        http("GET", f"{url.rstrip('/')}/health", {}, None, 5)
    except OSError as exc:
        return gateway.refused(exc)
    return False


def after_failure(h, failed: Release | None, failed_target: Target, reason: str, poll_s: float = 2.0,
                  indices: list[int] | None = None, ready: tuple[dict, Target] | None = None,
                  last: bool = False) -> str:
    """A release failed (health or gate): record it, restore the last good one, say what serves
    now. READY: what ready_to_restore found before the failure (used when it names that one);
    LAST: nothing follows in this run (restore)."""
    store = ReleaseStore(h)
    if failed:            # recorded with the restore's first write (restore), else on its own below
        failed = failed.with_status(releases.FAILED, reason)
    previous = store.current()
    if previous is None:
        if failed:
            store.save(failed.record)
        sh(h, f"systemctl stop {' '.join(failed_target.units)}")
        return (f"no earlier release passed, so nothing to roll back to: {', '.join(failed_target.units)} "
                f"{'is' if len(failed_target.units) == 1 else 'are'} stopped and left stopped")
    what = failed.name if failed else "the new release"
    checked = ready is not None and ready[0]["release"] == previous["release"]
    prev_target = None
    try:
        prev_target = ready[1] if checked else store.target(previous)
        if prev_target.is_set != failed_target.is_set:
            indices = None      # a switch of shape: the whole previous release comes back
            sh(h, f"systemctl disable --now {' '.join(failed_target.units)}")
        new = restore(h, previous, cause=f"automatic rollback: {what} failed: {reason}", poll_s=poll_s,
                      indices=indices, target=prev_target, checked=checked, failed=failed, last=last)
    except RollbackError as exc:
        if failed:        # when the restore could not start, it wrote nothing yet (again: the same record)
            store.save(failed.record)
        fix = (f"Fix what is named above, then deploy a profile again (make deploy PROFILE={previous['profile']}: "
               f"it rebuilds what is missing and gates it)")
        if failed_target.is_set and (prev_target is None or prev_target.is_set):
            # a rolling update's restore: the replicas it never touched still serve through the gateway
            return (f"{exc}\nTHE REPLICA SET IS NOT FULLY RESTORED: the gateway serves the replicas still in it "
                    f"(systemctl status '{failed_target.layout.service}@*'); the history records the failed "
                    f"rollback. {fix}")
        # a failed release that answers (its gate failed, not its health) or a restored one that
        # crash-loops would go on under no record that passed: stop them, so that what the
        # history and this message say is what runs
        units = sorted({*failed_target.units, *(prev_target.units if prev_target else ())})
        sh(h, f"systemctl stop {' '.join(units)}")
        return (f"{exc}\nNOTHING IS SERVING ({', '.join(units)} stopped); the history records the failed "
                f"rollback. {fix}")
    return (f"rolled back: {new.name} (restores {new.restores:04d}, profile "
            f"{previous['profile']}) is serving on {prev_target.base_url}")


def back_to_live(h, live: dict, tried: dict, poll_s: float) -> str:
    """A manual rollback to TRIED failed after its files went in place: put back LIVE, the release
    that served before it (a new entry, probed), so the host ends where it was; if that fails too,
    stop its units and say that nothing serves."""
    try:
        back = restore(h, live, cause=f"manual rollback to release {tried['release']:04d} failed: release "
                                      f"{live['release']:04d} put back", poll_s=poll_s)
    except RollbackError as exc:
        try:
            units = ReleaseStore(h).target(live).units
        except RollbackError:
            units = ReleaseStore(h).target(tried).units
        sh(h, f"systemctl stop {' '.join(units)}")
        return (f"{exc}\nNOTHING IS SERVING ({', '.join(units)} stopped): neither release {tried['release']:04d} "
                f"nor {live['release']:04d}, which served before, came back; the history records both attempts. "
                f"Fix what is named above, then deploy a profile again (make deploy PROFILE={live['profile']})")
    return (f"release {live['release']:04d} ({live['profile']}), which served before, is serving again "
            f"({back.name}); the failed rollback to release {tried['release']:04d} is in the history")


def choose(records_: list[dict], to: int | None, live_manifest_sha256: str | None = None) -> dict:
    """The release a manual rollback restores: `to`, or the last that passed before what runs
    now: the one before the current, or the current itself when the files in place
    (LIVE_MANIFEST_SHA256) are those of a later release a cut-off run left pending or
    unverified, which never passed its gate."""
    passed = releases.passed(records_)
    if to is not None:
        match = [r for r in records_ if r["release"] == to]
        if not match:
            known = ", ".join(f"{r['release']:04d}" for r in records_) or "none"
            raise DeployError(f"unknown release {to:04d} (releases on this host: {known})")
        if match[0] not in passed:
            raise DeployError(f"release {to:04d} is {match[0]['status']}: only a release that passed can be restored")
        return match[0]
    live = releases.current(records_)
    if live is not None and live_manifest_sha256 and live_manifest_sha256 != live["manifest_sha256"] and any(
            r["release"] > live["release"] and r["status"] in (releases.PENDING, releases.UNVERIFIED)
            and r["manifest_sha256"] == live_manifest_sha256 for r in records_):
        return live
    earlier = releases.before_live(records_)
    if earlier is None:
        raise DeployError("there is no earlier release to roll back to")
    return earlier


def cut_off_files(store: ReleaseStore, records_: list[dict]) -> tuple[str | None, Target | None]:
    """When a cut-off run left a release pending or unverified after the live one: the sha256 of
    the manifest in place and the live release's Target (its files may be that release's, not
    the live one's). (None, None) otherwise: no command."""
    live = releases.current(records_)
    if live is None or not any(r["release"] > live["release"] and r["status"] in (releases.PENDING, releases.UNVERIFIED)
                               for r in records_):
        return None, None
    t = store.target(live)
    return host.get_fact(Sha256File, path=t.layout.manifest), t


@deploy("Rollback")
def manual_rollback(to: int | None) -> None:
    store = ReleaseStore(host)
    records_ = store.records()
    live_sha, live_target = cut_off_files(store, records_)
    rec = choose(records_, int(to) if to not in (None, "") else None, live_sha)
    if live_target is not None and any(r["status"] == releases.PENDING for r in records_):
        # settled here as a deploy settles them (never deployed: unverified if its files are in
        # place, else failed), so the history says what the restore replaces
        def settle(state, host):  # noqa: pyinfra passes (state, host) by these names
            healthy = observer(host, live_target)().http == 200
            for doc in ReleaseStore(host).settle_interrupted(live_sha, healthy):
                print(f"[{host.name}] release {doc['release']:04d}: {doc['status']} ({doc['reason']})")

        from dsv4deploy.tasks.release import reported  # tasks/release imports this module
        python.call(name="settle releases left pending by an interrupted run", function=reported(settle))

    live = releases.current(records_)

    def run(state, host):  # noqa: pyinfra passes (state, host) by these names
        poll = float(host.data.get("health_poll_s", 2.0))
        try:
            new = restore(host, rec, cause=f"manual rollback to release {rec['release']:04d}", poll_s=poll,
                          last=last_step(state, host))
        except RollbackError as exc:
            for line in str(exc).splitlines():
                logger.error(f"    [{host.name}] {line}")
            if exc.switched and live is not None and live["release"] != rec["release"]:
                for line in back_to_live(host, live, rec, poll).splitlines():
                    logger.error(f"    [{host.name}] {line}")
            return False
        print(f"[{host.name}] {new.name} restores {new.restores:04d} ({rec['profile']}): serving")

    python.call(name=f"restore release {rec['release']:04d} ({rec['profile']})", function=run)
