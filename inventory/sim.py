"""pyinfra inventory of the running CT200 twins (read from the .sim/ state).

    pyinfra -y inventory/sim.py exec -- nvidia-smi -L

Start the twins first with `make sim-up` (`dsv4deploy sim up [--hosts N]`).
Host-key checking stays on: the twins' keys are in .sim/ssh/known_hosts.
"""

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from dsv4deploy.sim.host import inventory_hosts  # noqa: E402

twins = inventory_hosts()

# What the twin cannot hold, and the stand-in it uses instead. The profiles stay identical.
STAND_INS = {
    # SGLang with CUDA torch -> this project's twin server (same argv, same HTTP API).
    "server_module": "dsv4deploy.twin.server",
    "launch_check_module": "dsv4deploy.twin.args",
    "sglang": {"requirements": ["aiohttp==3.14.5", "pyyaml==6.0.3"]},
    # NVIDIA's apt repository and kernel modules -> the twin's nvidia-smi at the profile's branch.
    "driver": True,
    # GPUs for an NCCL all-reduce -> none: the probe is skipped with a note (it ran on real GPUs,
    # see docs/preflight.md).
    "skip_nccl_probe": "the twin has no GPUs (the probe is proven on real GPUs: docs/preflight.md)",
}
# 149 GiB of weights -> a small checkpoint of the same layout, made once under .sim/checkpoints.
WEIGHTS = {"type": "rsync", "path": ".sim/checkpoints/{repo}", "size_gib": 0.01}

twins = [(name, {**data, "stand_ins": STAND_INS, "weights_source": WEIGHTS}) for name, data in twins]
