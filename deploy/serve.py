"""Roll a profile out to the GPU host:

    pyinfra -y inventory/ct200.py deploy/serve.py --data profile=nvfp4-ctx8k

Reads top to bottom like the job. Until the lock, everything only reads: a bad profile or a
refused preflight stops with nothing changed. Restart happens only when this run changed
something (or the deployed release renders differently), and a release is recorded `pending`
before the switch, `deployed` or `failed` after it.
"""

from pyinfra import host
from pyinfra.operations.util import any_changed

from dsv4deploy import tasks
from dsv4deploy.rollout import rollout_for

rollout = rollout_for(host.data)                      # validate the profile, render its files
found = tasks.preflight(rollout)                      # OS, GPUs, driver, disk, port: refuse clearly
tasks.deploy_lock(f"deploy {rollout.profile.name}")  # one deploy at a time on this host
tasks.settle_interrupted(rollout)                     # settle what a cut-off run left pending

tasks.host_packages(rollout)                          # python3-venv, curl, patch: what a fresh server lacks
tasks.driver(rollout, needed=found["driver_needed"])  # nvidia-open at the profile's branch; no surprise reboot
tasks.service_user(rollout)                           # service user and directories
venv = tasks.sglang_venv(rollout)                     # pinned SGLang + patches, in a venv named by both
keys = tasks.secrets(rollout)                         # 0600 root secrets: HF token; API key made on the host
model = tasks.weights(rollout)                        # pinned checkpoint, verified complete

redeploy = tasks.needs_release(rollout)               # the deployed release renders differently
changed = lambda: redeploy or any_changed(*venv, *model, *keys)()  # noqa: E731 (evaluated at execution)
tasks.launch_check(rollout, when=changed)             # the host's own SGLang parses the argv first
tasks.nccl_probe(rollout, when=changed)               # all-reduce with the new NCCL env, bounded in time
tasks.begin_release(rollout, when=changed)            # release NNNN: pending, before the switch
unit_files = tasks.config_files(rollout)              # NCCL env, launch manifest, unit
switch = lambda: changed() or any_changed(*unit_files)()  # noqa: E731
started = tasks.restart_if_changed(rollout, when=switch)  # daemon-reload + restart only on change
tasks.verify_and_record(rollout, when=lambda: switch() or started.did_change())  # health, identity, gate
#   (verify also runs the smoke-benchmark gate; a failure rolls back to the last good release)
