"""Rollback: put a release that passed back in service, from the files kept in its record. The
one owner of it on the host: which release a manual rollback restores, the restore of a single
server or of a replica set, and what follows a failed release (tasks/ only decides when).

Like Helm, a rollback is a new history entry (`kind: rollback`, `restores: N`). The restored
release's venv and weights must still be on the host (pruning keeps what kept releases use).
Instead of the full gate it gets a short probe: it passed the gate before.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import DeployError
from pyinfra.facts.files import Sha256File

from dsv4deploy.gateway import model as gateway
from dsv4deploy.host.checks import confirm, journal_tail, probe
from dsv4deploy.host.io import sh
from dsv4deploy.host.ops import stop_set_units
from dsv4deploy.host.release_store import ReleaseStore, RollbackError
from dsv4deploy.host.replicas import (ReplicaFailed, api, gateway_stale, roll, start_gateway, start_set,
                                      stop_surplus, unit_active)
from dsv4deploy.release import records as releases
from dsv4deploy.release.records import Release
from dsv4deploy.release.rollout import Target
from dsv4deploy.sglang.health import HealthError

# A checkpoint is complete when the weights step left its marker: sizes (rsync, local sources) or
# sizes and digests (hf, tasks/weights.py and weights_check.py).
CHECKPOINT_MARKERS = (".dsv4deploy-complete.json", ".dsv4deploy-verified.json")


@dataclass(frozen=True)
class Kept:
    """A release's record and the Target its kept files describe (ReleaseStore.target), read
    ahead of a restore; CHECKED: what it needs was found on the host too (Rollback.ready)."""

    record: dict
    target: Target
    checked: bool = False


def choose(records: list[dict], to: int | None, live_manifest_sha256: str | None = None) -> dict:
    """The release a manual rollback restores: `to`, or the last that passed before what runs
    now: the one before the current, or the current itself when the files in place
    (LIVE_MANIFEST_SHA256) are those of a later release a cut-off run left pending or
    unverified, which never passed its gate."""
    passed = releases.passed(records)
    if to is not None:
        match = [r for r in records if r["release"] == to]
        if not match:
            known = ", ".join(f"{r['release']:04d}" for r in records) or "none"
            raise DeployError(f"unknown release {to:04d} (releases on this host: {known})")
        if match[0] not in passed:
            raise DeployError(f"release {to:04d} is {match[0]['status']}: only a release that passed can be restored")
        return match[0]
    live = releases.current(records)
    if live is not None and live_manifest_sha256 and live_manifest_sha256 != live["manifest_sha256"] and any(
            r["release"] > live["release"] and r["status"] in (releases.PENDING, releases.UNVERIFIED)
            and r["manifest_sha256"] == live_manifest_sha256 for r in records):
        return live
    earlier = releases.before_live(records)
    if earlier is None:
        raise DeployError("there is no earlier release to roll back to")
    return earlier


class Rollback:
    """The host's rollbacks, through STORE (this run's: the records it holds, the lock it gives
    back with its last record); the restored server's health is polled every POLL_S."""

    def __init__(self, store: ReleaseStore, poll_s: float = 2.0):
        self.store = store
        self.h = store.h
        self.poll_s = poll_s

    # --- which release, and whether it can come back ------------------------------------------

    def cut_off_files(self, records: list[dict]) -> tuple[str | None, Target | None]:
        """When a cut-off run left a release pending or unverified after the live one: the sha256
        of the manifest in place and the live release's Target (its files may be that release's,
        not the live one's). (None, None) otherwise: no command."""
        live = releases.current(records)
        if live is None or not any(r["release"] > live["release"]
                                   and r["status"] in (releases.PENDING, releases.UNVERIFIED) for r in records):
            return None, None
        t = self.store.target(live)
        return self.h.get_fact(Sha256File, path=t.layout.manifest), t

    def ready(self, rec: dict | None) -> Kept | None:
        """Release REC and its Target, read and found restorable ahead of need: a deploy asks while
        its new server starts (the lock keeps anything from removing them meanwhile), so a rollback
        costs two round trips less while nothing serves. None when REC is None or not restorable
        (restore then finds why and records it). Two commands."""
        if rec is None:
            return None
        try:
            t = self.store.target(rec)
            self.missing(rec, t)
        except RollbackError:
            return None
        return Kept(rec, t, checked=True)

    def missing(self, rec: dict, t: Target) -> None:
        """Refuse, naming each, when what release REC needs is gone from the host: its venv, its
        weights, its kept files (and a replica set's gateway venv). One command."""
        marker = " || ".join(f"test -f {t.layout.model_dir}/{m}" for m in CHECKPOINT_MARKERS)
        gw = f"test -x {t.gateway_venv}/bin/python || echo 'its gateway venv'; " if t.is_set else ""
        folder = self.store.folder(rec["release"])
        ok, out = sh(self.h, f"{gw}test -x {t.layout.python} || echo 'its venv ({t.layout.venv})'; "
                             f"{{ {marker}; }} || echo 'its weights ({t.layout.model_dir})'; "
                             f"test -d {folder}/files || echo 'its kept files ({folder}/files)'")
        gone = [line for line in out.splitlines() if line.strip()]
        if gone:
            raise RollbackError(f"release {rec['release']:04d} cannot be restored: gone from the host: "
                                + ", ".join(gone))

    # --- the restore --------------------------------------------------------------------------

    def restore(self, rec: dict, cause: str, *, failed: Release | None = None, indices: list[int] | None = None,
                kept: Kept | None = None, last: bool = False) -> Release:
        """Bring release `rec` back: its files, daemon-reload, restart, health, identity, probe. The
        attempt is a history entry whatever happens: a release that cannot be restored leaves a
        `failed` rollback entry saying why. A replica set is restored one replica at a time behind
        its gateway (only INDICES, the replicas a failed rolling update touched, when given).
        KEPT: REC's Target as the caller read it (and checked, when Rollback.ready did). FAILED:
        the release that failed, its record written in the command that puts the files back (one
        round trip less while nothing serves); LAST: the run ends with this restore, and its
        record gives the lock back."""
        store = self.store
        first = (failed.record,) if failed else ()
        new = Release(releases.rollback_record(store.records(), rec, cause))
        try:
            known = kept is not None and kept.record["release"] == rec["release"]
            t = kept.target if known else store.target(rec)
            if not (known and kept.checked):
                self.missing(rec, t)
        except RollbackError as exc:
            store.save(*first, new.with_status(releases.FAILED, f"rollback failed: {exc}").record)
            raise
        try:
            if t.is_set:
                ok, out = store.put_back(rec["release"], new, then="systemctl daemon-reload", also=first)
                if not ok:
                    raise HealthError(f"could not restore the files: {out.strip()[-300:]}")
                self.restore_set(t, indices)
            else:
                ok, out = store.put_back(rec["release"], new, also=first,
                                         then=f"systemctl daemon-reload && {stop_set_units(t.layout.service)}"
                                              f"systemctl reset-failed {t.unit}; systemctl restart {t.unit} 2>&1")
                if not ok:
                    raise HealthError(f"could not restore the files or restart {t.unit}: {out.strip()[-300:]}")
                confirm(self.h, t, budget_s=t.data["service"]["health_timeout_s"], poll_s=self.poll_s)
                probe(self.h, t)
        except (HealthError, ReplicaFailed) as exc:
            store.save(*first, new.with_status(releases.FAILED, f"rollback failed: {exc}").record)
            raise RollbackError(f"rollback to release {rec['release']:04d} failed: {exc}\n--- last journal lines "
                                f"of {t.unit} ---\n{journal_tail(self.h, t)}", switched=True) from None
        return store.mark_deployed(new, last=last)

    def restore_set(self, t: Target, indices: list[int] | None) -> None:
        """Restore a replica set whose files are in place: behind a running gateway one replica at a time (each probed before
        it rejoins); with no gateway running (a switch back from the single server), all at once."""
        h = self.h
        log = lambda m: print(f"[{h.name}] {m}")  # noqa: E731
        if unit_active(h, t.unit):
            # a failed larger set's extra replicas go (start_set does it itself), and out of the
            # gateway at once: it would route users to them for the whole restore
            if stop_surplus(h, t, log):
                self._remove_strays(t, only_dead=True)
            every = [rt.index for rt in t.replica_targets]
            roll(h, t, indices if indices is not None else every, lambda rt: probe(h, rt), self.poll_s, log)
            # across a change of the replicas' addresses the gateway still lists the ones that moved
            # (they served while the restored ones came back)
            self._remove_strays(t)
            # across a change of smg itself (version, policy, launcher) the gateway runs the failed
            # release's files: the restored ones are in place, so it restarts from them
            if gateway_stale(h, t):
                start_gateway(h, t, restart=True)
                log(f"restarted {t.unit}: it ran other gateway files than the restored release's")
        else:
            sh(h, f"systemctl disable --now {t.layout.service}.service")
            start_set(h, t, lambda rt: probe(h, rt), self.poll_s, log)

    def _remove_strays(self, t: Target, only_dead: bool = False) -> None:
        """Remove from T's gateway the workers no replica of T's release is (gateway.strays); with
        ONLY_DEAD, only those that refuse connections (an instance just stopped)."""
        http, endpoint, key = api(self.h, t)
        for w in gateway.strays(gateway.list_workers(http, endpoint, key), t.plan.worker_urls):
            if only_dead and not _refuses(http, w.url):
                continue
            gateway.remove_worker(http, endpoint, key, w.id)
            print(f"[{self.h.name}] removed {w.url} from {t.unit}: no replica of the restored release listens there")

    # --- after a failure ----------------------------------------------------------------------

    def after_failure(self, failed: Release | None, failed_target: Target, reason: str, *,
                      indices: list[int] | None = None, ready: Kept | None = None, last: bool = False) -> str:
        """A release failed (health or gate): record it, restore the last good one, say what serves
        now. READY: what `ready` found before the failure (used when it names that one); LAST:
        nothing follows in this run (restore)."""
        store = self.store
        if failed:            # recorded with the restore's first write (restore), else on its own below
            failed = failed.with_status(releases.FAILED, reason)
        previous = store.current()
        if previous is None:
            if failed:
                store.save(failed.record)
            sh(self.h, f"systemctl stop {' '.join(failed_target.units)}")
            return (f"no earlier release passed, so nothing to roll back to: {', '.join(failed_target.units)} "
                    f"{'is' if len(failed_target.units) == 1 else 'are'} stopped and left stopped")
        what = failed.name if failed else "the new release"
        if ready is not None and ready.record["release"] != previous["release"]:
            ready = None
        prev_target = None
        try:
            kept = ready or Kept(previous, store.target(previous))
            prev_target = kept.target
            if prev_target.is_set != failed_target.is_set:
                indices = None      # a switch of shape: the whole previous release comes back
                sh(self.h, f"systemctl disable --now {' '.join(failed_target.units)}")
            new = self.restore(previous, f"automatic rollback: {what} failed: {reason}", failed=failed,
                               indices=indices, kept=kept, last=last)
        except RollbackError as exc:
            if failed:        # when the restore could not start, it wrote nothing yet (again: the same record)
                store.save(failed.record)
            return self._not_restored(exc, previous, failed_target, prev_target)
        return (f"rolled back: {new.name} (restores {new.restores:04d}, profile "
                f"{previous['profile']}) is serving on {prev_target.base_url}")

    def _not_restored(self, exc: RollbackError, previous: dict, failed_target: Target,
                      prev_target: Target | None) -> str:
        """What serves after a rollback that failed, and what to do: a replica set's untouched
        replicas go on serving; otherwise every unit of both releases is stopped."""
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
        sh(self.h, f"systemctl stop {' '.join(units)}")
        return (f"{exc}\nNOTHING IS SERVING ({', '.join(units)} stopped); the history records the failed "
                f"rollback. {fix}")

    # --- a manual rollback --------------------------------------------------------------------

    def manual(self, rec: dict, live: dict | None, last: bool = False) -> Release:
        """`make rollback`: restore REC. When that fails after its files went in place, LIVE (the
        release that served before) is put back (back_to_live); the RollbackError then says how
        that went too."""
        try:
            return self.restore(rec, f"manual rollback to release {rec['release']:04d}", last=last)
        except RollbackError as exc:
            if exc.switched and live is not None and live["release"] != rec["release"]:
                raise RollbackError(f"{exc}\n{self.back_to_live(live, rec)}", switched=True) from None
            raise

    def back_to_live(self, live: dict, tried: dict) -> str:
        """A manual rollback to TRIED failed after its files went in place: put back LIVE, the
        release that served before it (a new entry, probed), so the host ends where it was; if that
        fails too, stop its units and say that nothing serves."""
        try:
            back = self.restore(live, f"manual rollback to release {tried['release']:04d} failed: release "
                                      f"{live['release']:04d} put back")
        except RollbackError as exc:
            try:
                units = self.store.target(live).units
            except RollbackError:
                units = self.store.target(tried).units
            sh(self.h, f"systemctl stop {' '.join(units)}")
            return (f"{exc}\nNOTHING IS SERVING ({', '.join(units)} stopped): neither release {tried['release']:04d} "
                    f"nor {live['release']:04d}, which served before, came back; the history records both attempts. "
                    f"Fix what is named above, then deploy a profile again (make deploy PROFILE={live['profile']})")
        return (f"release {live['release']:04d} ({live['profile']}), which served before, is serving again "
                f"({back.name}); the failed rollback to release {tried['release']:04d} is in the history")


def _refuses(http, url: str) -> bool:
    """Whether nothing listens at URL (a refused connection; a timeout says nothing)."""
    try:
        http("GET", f"{url.rstrip('/')}/health", {}, None, 5)
    except OSError as exc:
        return gateway.refused(exc)
    return False
