"""Put an earlier release back in service:

    pyinfra -y inventory/ct200.py deploy/rollback.py            # the release before the current
    pyinfra -y inventory/ct200.py deploy/rollback.py --data to=3
    make rollback [TO=3]

The restore uses the files kept in the release record, with its venv and weights; the new
history entry points at the release it restored. An unknown release is refused.
"""

from pyinfra import host

from dsv4deploy.host.dependency_patches import sessions_ahead

sessions_ahead(host)        # SSH channels open one ahead: a round trip less per command

from dsv4deploy import tasks  # noqa: E402

store = tasks.release_store()             # the host's releases and deploy lock, as this run holds them
tasks.deploy_lock(store, "rollback")
tasks.manual_rollback(store, host.data.get("to"))
tasks.arm_watch(store)                    # the watch, for the release restored (docs/watch.md)
