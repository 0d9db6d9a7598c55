"""pyinfra inventory of a running fleet of isolated CT200 twins (docs/fleet.md).

    make fleet PROFILE=nvfp4-ctx8k                        # boots the fleet, then canary first, then batches
    python -m ct200twin up --fleet fleet --hosts 3        # the twins alone: fleet-1..fleet-3
    dsv4deploy fleet deploy nvfp4-ctx8k --inventory inventory/fleet-sim.py [--batch N]
    pyinfra -y inventory/fleet-sim.py exec -- nvidia-smi -L

The fleet is DSV4_SIM_FLEET (default `fleet`). Each twin has its own network namespace (so each
serves on its own 127.0.0.1:30000); it is named NAME-N here (reports/NAME-N/, `--limit NAME-N`)
and reached at its veth address (host data ssh_hostname), host-key checking on. NAME-1 is the
canary (host data `canary: true`; DSV4_SIM_CANARY=2,3 marks others instead). The profile is
chosen and checked as in inventory/sim.py (PROFILE, else nvfp4-ctx8k), with the same stand-ins.
It connects as the twins' `deploy` account with sudo; DSV4_SIM_USER=root as root with root's key
and no sudo (CT200's likely login).
"""

import os
import re
import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from dsv4deploy.profile.errors import EXIT_BAD_INPUT, EXIT_FAILED  # noqa: E402
from dsv4deploy.cli.inventories import profile_data, pyinfra_cli_params, refuse  # noqa: E402
from ct200twin.host import stand_ins  # noqa: E402
from ct200twin.host.machines import SimError, inventory_hosts  # noqa: E402
from ct200twin.host.layout import DEFAULT_FLEET, check_fleet  # noqa: E402

_INVENTORY = "inventory/fleet-sim.py"
_CLI = pyinfra_cli_params() is not None

try:
    _fleet = check_fleet(os.environ.get("DSV4_SIM_FLEET") or DEFAULT_FLEET)
except SimError as exc:
    refuse(_INVENTORY, [f"DSV4_SIM_FLEET: {exc}"], cli=_CLI, code=EXIT_BAD_INPUT)
if stand_ins.launch_check_problem():
    refuse(_INVENTORY, [stand_ins.launch_check_problem()], cli=_CLI, code=EXIT_BAD_INPUT)
_canary_text = os.environ.get("DSV4_SIM_CANARY") or "1"
if not re.fullmatch(r"[0-9]{1,3}(,[0-9]{1,3})*", _canary_text):
    refuse(_INVENTORY, [f"DSV4_SIM_CANARY={ascii(_canary_text)}: expected twin numbers like 1 or 2,3"], cli=_CLI,
           code=EXIT_BAD_INPUT)
_canary = {int(x) for x in _canary_text.split(",")}

_profile = profile_data(_INVENTORY, env_names=("PROFILE",), default="nvfp4-ctx8k", weights_stand_in=True)
try:
    _hosts = inventory_hosts(_fleet)
except SimError as exc:
    refuse(_INVENTORY, [str(exc)], cli=_CLI, code=EXIT_FAILED)

_weights = stand_ins.weights_source()
_stand_ins = stand_ins.host_data()              # the twin server's archive, as in inventory/sim.py
stand_ins.checkpoint_for(_profile, _weights)    # the profile's small checkpoint, when pushed over SSH
fleet = [(name, {**data, "canary": data["sim_index"] in _canary, "stand_ins": _stand_ins,
                 "weights_source": _weights, **_profile})
         for name, data in _hosts]
