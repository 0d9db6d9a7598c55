"""`make rollback [TO=N]`: the pyinfra step that puts an earlier release back in service. Which
release, the restore and what follows a failed one are the host's rollback (host/rollback.py);
this step decides when, with the run's release store (the one that took the lock).
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import deploy
from pyinfra.operations import python

from dsv4deploy.host.release_store import ReleaseStore, RollbackError, last_step
from dsv4deploy.host.rollback import Rollback, choose
from dsv4deploy.release import records as releases
from dsv4deploy.tasks.release import settle_pending


@deploy("Rollback")
def manual_rollback(store: ReleaseStore, to: int | str | None) -> None:
    """Restore release TO (or the last that passed before what runs now); a restore that fails
    after its files went in place puts back the release that served (Rollback.manual)."""
    records = store.records()
    live_sha, live_target = Rollback(store).cut_off_files(records)
    rec = choose(records, int(to) if to not in (None, "") else None, live_sha)
    if live_target is not None and any(r["status"] == releases.PENDING for r in records):
        # settled here as a deploy settles them, so the history says what the restore replaces
        settle_pending(store, live_target, live_sha)
    live = releases.current(records)

    def run(state, host):  # noqa: pyinfra passes (state, host) by these names
        rollback = Rollback(store, poll_s=float(host.data.get("health_poll_s", 2.0)))
        try:
            new = rollback.manual(rec, live, last=last_step(state, host))
        except RollbackError as exc:
            for line in str(exc).splitlines():
                logger.error(f"    [{host.name}] {line}")
            return False
        print(f"[{host.name}] {new.name} restores {new.restores:04d} ({rec['profile']}): serving")

    python.call(name=f"restore release {rec['release']:04d} ({rec['profile']})", function=run)
