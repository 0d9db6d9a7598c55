"""pyinfra inventory of the running CT200 twins (read from the .sim/ state).

    pyinfra -y inventory/sim.py deploy/serve.py            # the profile: PROFILE, else nvfp4-ctx8k
    pyinfra -y inventory/sim.py exec -- nvidia-smi -L

Start the twins first with `make sim-up` (`dsv4deploy sim up [--hosts N]`).
The profile deploy/serve.py rolls out is host data `profile`: `--data profile=NAME`, else the
environment's PROFILE, else nvfp4-ctx8k; it is checked while this file loads, before pyinfra
connects. The twin holds a weights stand-in, so a placeholder revision is allowed here.
Host-key checking stays on: the twins' keys are in .sim/ssh/known_hosts.
"""

import os
import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from dsv4deploy.errors import EXIT_FAILED  # noqa: E402
from dsv4deploy.inventories import profile_data, pyinfra_cli_params, refuse  # noqa: E402
from dsv4deploy.sim.host import SimError, inventory_hosts  # noqa: E402

_INVENTORY = "inventory/sim.py"

# What the twin cannot hold, and the stand-in it uses instead. The profiles stay identical.
STAND_INS = {
    # SGLang with CUDA torch -> this project's twin server (same argv, same HTTP API).
    "server_module": "dsv4deploy.twin.server",
    "launch_check_module": "dsv4deploy.twin.args",
    # (and huggingface_hub for `hf download`, which SGLang's own requirements bring on a real host)
    "sglang": {"requirements": ["aiohttp==3.14.5", "pyyaml==6.0.3", "huggingface_hub==2.4.0"]},
    # NVIDIA's apt repository and kernel modules -> the twin's nvidia-smi at the profile's branch.
    "driver": True,
    # GPUs for an NCCL all-reduce -> none: the probe is skipped with a note (it ran on real GPUs,
    # see docs/preflight.md).
    "skip_nccl_probe": "the twin has no GPUs (the probe is proven on real GPUs: docs/preflight.md)",
}
# 149 GiB of weights -> a small checkpoint of the same layout, made once under .sim/checkpoints,
# pushed over SSH; or, with DSV4_SIM_HUB=http://127.0.0.1:PORT (`dsv4deploy sim hub` serving
# .sim/checkpoints), downloaded by the real `hf download` from that local hub (source: hf; pin
# the profile against it first: HF_ENDPOINT=... dsv4deploy pin PROFILE).
WEIGHTS = {"type": "rsync", "path": ".sim/checkpoints/{repo}", "size_gib": 0.01}
if os.environ.get("DSV4_SIM_HUB"):
    WEIGHTS = {"type": "hf", "endpoint": os.environ["DSV4_SIM_HUB"], "size_gib": 0.01}
    os.environ.setdefault("HF_ENDPOINT", os.environ["DSV4_SIM_HUB"])   # huggingface_hub's own calls too

# The profile first: a bad one is refused even when no twin runs.
_profile = profile_data(_INVENTORY, env_names=("PROFILE",), default="nvfp4-ctx8k", weights_stand_in=True)
try:
    _hosts = inventory_hosts()
except SimError as exc:
    refuse(_INVENTORY, [str(exc)], cli=pyinfra_cli_params() is not None, code=EXIT_FAILED)

twins = [(name, {**data, "stand_ins": STAND_INS, "weights_source": WEIGHTS, **_profile}) for name, data in _hosts]
