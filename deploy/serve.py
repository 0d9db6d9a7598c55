"""Roll a profile out to the GPU host:

    pyinfra -y inventory/ct200.py deploy/serve.py --data profile=nvfp4-ctx8k

Reads top to bottom like the job. The host's state is read once, in the one command that takes
the host's deploy lock; every step below compares the profile with it and changes only what
differs. Until the switch's steps, everything only reads: a bad profile or a refused preflight
stops with nothing changed (and the lock given back). The server
restarts only for a reason this run found (dsv4deploy/release/changes.py), and then a release is
recorded `pending` before the switch, `deployed` or `failed` after its gate.

One hop from here: the unit the server runs is dsv4deploy/render/templates/sglang.service.j2
(rendered by dsv4deploy/render/unit.py), the gate's levels and floors are the profile's `gate:`
block (dsv4deploy/gate/spec.py reads it; the steps are in dsv4deploy/tasks/), and a failed gate's
rollback is dsv4deploy/host/rollback.py.
"""

from pyinfra import host

from dsv4deploy.host.dependency_patches import sessions_ahead

sessions_ahead(host)        # SSH channels open one ahead: a round trip less per command

from dsv4deploy import tasks  # noqa: E402
from dsv4deploy.release.changes import Changes  # noqa: E402
from dsv4deploy.release.rollout import rollout_for  # noqa: E402

rollout = rollout_for(host.data, host.name)           # validate the profile (with the host's calibration), render
store = tasks.release_store(rollout)                  # the host's releases and deploy lock, as this run holds them
state = tasks.read_locked(rollout, store, f"deploy {rollout.profile.name}")  # the host's state, one command,
                                                      # under the deploy lock it takes: one deploy at a time
found = tasks.preflight(rollout, state)               # OS, GPUs, driver, disk, port: refuse clearly
tasks.settle_interrupted(rollout, state, store)       # settle what a cut-off run left pending

changes = Changes()                                   # why the server restarts, if it does
tasks.host_packages(rollout, state)                   # python3-venv, curl, patch, pinned uv: what a fresh server lacks
tasks.driver(rollout, found["driver_needed"], state)  # nvidia-open held at the branch; CUDA toolkit
tasks.service_user(rollout, state)                    # service user and directories
changes.notify("venv", tasks.sglang_venv(rollout, state))   # pinned SGLang + patches, in a venv named by both
gateway_venv = changes.notify("gateway venv", tasks.gateway_venv(rollout, state))  # replicas: smg, pinned
changes.notify("secrets", tasks.secrets(rollout, state))    # 0600 root secrets: HF token; API key made on the host
changes.notify("weights", tasks.weights(rollout, state))    # pinned checkpoint, verified complete
changes.notify("release", tasks.needs_release(rollout, state))      # the deployed release renders differently
differ = tasks.files_differ(rollout, state)
changes.notify("unit files", *differ)                 # NCCL env, manifest, unit (replicas: theirs, the gateway's)

downtime = tasks.cannot_roll(rollout, state, changes.reasons)  # replicas: a change that cannot roll needs allow_downtime
gateway_restart = tasks.gateway_restart(rollout, state, differ, gateway_venv)  # replicas: why smg restarts, if it does
tasks.show_plan(rollout, state, changes, downtime, gateway_restart)  # what follows and why (make plan prints it too)
pending = None
if changes:
    tasks.launch_check(rollout, state, changes.reasons)  # the host's own SGLang parses the argv first
    tasks.nccl_probe(rollout)                         # all-reduce with the new NCCL env, bounded in time
    pending = tasks.begin_release(rollout, state, store)  # release NNNN: pending, written first by the switch
if rollout.target.is_set:                             # replicas behind the gateway: one at a time, each gated
    tasks.config_files(rollout, state, pending)       # the record, NCCL env, launch manifest, units
    tasks.switch_set(rollout, state, changes.reasons, gateway_restart, store, pending)
else:
    # one command: the record, NCCL env, launch manifest, unit, then daemon-reload + restart only with a reason
    started = tasks.switch(rollout, state, changes.reasons, pending)
    if changes or started.will_change:
        tasks.verify_and_record(rollout, store, pending)  # health, identity, gate; a failure rolls back
# the watch on what serves now (docs/watch.md); a run that changes no release reads it now and
# leaves the step out when it is already this one
settled = not changes and not tasks.pending_in(state) and (rollout.target.is_set or not started.will_change)
tasks.arm_watch(store, rollout.data, settled=settled)
