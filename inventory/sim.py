"""pyinfra inventory of the running CT200 twins (read from the .sim/ state).

    pyinfra -y inventory/sim.py deploy/serve.py            # the profile: PROFILE, else nvfp4-ctx8k
    pyinfra -y inventory/sim.py exec -- nvidia-smi -L

Start the twins first with `make sim-up` (`python -m ct200twin up [--hosts N]`).
The profile deploy/serve.py rolls out is host data `profile`: `--data profile=NAME`, else the
environment's PROFILE, else nvfp4-ctx8k; it is checked while this file loads, before pyinfra
connects. The twin holds a weights stand-in, so a placeholder revision is allowed here.
Host-key checking stays on: the twins' keys are in .sim/ssh/known_hosts.
It connects as the twins' `deploy` account with sudo; DSV4_SIM_USER=root as root with root's key
and no sudo (CT200's likely login).
"""

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from dsv4deploy.profile.errors import EXIT_FAILED  # noqa: E402
from dsv4deploy.cli.inventories import profile_data, pyinfra_cli_params, refuse  # noqa: E402
from ct200twin.host import stand_ins  # noqa: E402
from ct200twin.host.machines import SimError, inventory_hosts  # noqa: E402

_INVENTORY = "inventory/sim.py"

# What the twin cannot hold, and the stand-in it uses instead (ct200twin/host/stand_ins.py):
# the SGLang twin server for SGLang with CUDA torch, the twin's nvidia-smi for the driver, no NCCL
# probe, and a small checkpoint of the same layout (pushed over SSH, or from a local hub with
# DSV4_SIM_HUB) for 149 GiB of weights. The profiles stay identical.
WEIGHTS = stand_ins.weights_source()

if stand_ins.launch_check_problem():
    refuse(_INVENTORY, [stand_ins.launch_check_problem()], cli=pyinfra_cli_params() is not None)

# The profile first: a bad one is refused even when no twin runs.
_profile = profile_data(_INVENTORY, env_names=("PROFILE",), default="nvfp4-ctx8k", weights_stand_in=True)
try:
    _hosts = inventory_hosts()
except SimError as exc:
    refuse(_INVENTORY, [str(exc)], cli=pyinfra_cli_params() is not None, code=EXIT_FAILED)

# The stand-ins' files, made here for what the deploy reads: the twin server's archive, and the
# small checkpoint of the profile's model repo when it is pushed over SSH.
STAND_INS = stand_ins.host_data()
stand_ins.checkpoint_for(_profile, WEIGHTS)

twins = [(name, {**data, "stand_ins": STAND_INS, "weights_source": WEIGHTS, **_profile}) for name, data in _hosts]
