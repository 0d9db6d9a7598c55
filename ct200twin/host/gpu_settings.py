"""What nvidia-smi reports in a twin: the settings file (``gpus.json``, CT200's eight GPUs by
default), the fake nvidia-smi (``sim/nvidia_smi.py``, installed as /usr/bin/nvidia-smi while
the "driver" is installed), the stand-in driver tool that installs or removes it, and the folder
where the twin's servers say what GPU memory they hold (made at every boot by systemd-tmpfiles:
ct200twin/server/gpu_hold.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ct200twin.host.files import _guard, _write
from ct200twin.host.layout import PACKAGE_DIR
from ct200twin.host.nvidia_smi import DEFAULTS as NVIDIA_SMI_DEFAULTS, HOLDS_DIR

NVIDIA_SMI_SCRIPT = PACKAGE_DIR / "nvidia_smi.py"

TWIN_SETTINGS_DIR = "etc/dsv4deploy-twin"          # inside the twin root
TWIN_GPUS_FILE = TWIN_SETTINGS_DIR + "/gpus.json"
TWIN_NVIDIA_SMI_LIB = "usr/lib/dsv4deploy-twin/nvidia-smi"
TWIN_NVIDIA_SMI = "usr/bin/nvidia-smi"
TWIN_DRIVER_TOOL = "usr/local/sbin/dsv4deploy-twin-driver"
TWIN_HOLDS_TMPFILES = "etc/tmpfiles.d/dsv4deploy-twin-gpu.conf"
# /dev/shm is the container's own tmpfs, empty at every boot; any user's server writes its own file
# there (sticky: none removes another's), as any process may allocate on a GPU on the host
HOLDS_TMPFILES = ("# written by dsv4deploy sim: where the twin's servers say what GPU memory they hold,\n"
                  "# the stand-in for the driver's accounting (ct200twin/server/gpu_hold.py)\n"
                  f"d {HOLDS_DIR} 1777 root root -\n")

# the twin's settings file starts from the fake nvidia-smi's own CT200 defaults (one table): the
# settings `sim gpus` can change
GPU_DEFAULTS: dict[str, Any] = {k: NVIDIA_SMI_DEFAULTS[k] for k in (
    "count", "memory_mib", "driver_version", "name", "compute_cap", "memory_used_mib", "driver_installed")}

_DRIVER_TOOL = r"""#!/bin/sh
# dsv4deploy CT200 twin: stand-in for installing/removing the NVIDIA driver.
#   dsv4deploy-twin-driver install [VERSION] | remove | status
set -e
SETTINGS="${DSV4_TWIN_GPUS:-/etc/dsv4deploy-twin/gpus.json}"
update() {
  python3 - "$SETTINGS" "$1" "$2" <<'EOF'
import json, sys
path, installed, version = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
try:
    data = json.load(open(path))
except FileNotFoundError:
    data = {}
data["driver_installed"] = installed
if version:
    data["driver_version"] = version
open(path + ".tmp", "w").write(json.dumps(data, indent=1, sort_keys=True) + "\n")
import os; os.replace(path + ".tmp", path)
EOF
}
case "$1" in
  install) update 1 "${2:-}"; install -m 0755 /usr/lib/dsv4deploy-twin/nvidia-smi /usr/bin/nvidia-smi ;;
  remove) update 0 ""; rm -f /usr/bin/nvidia-smi ;;
  status) cat "$SETTINGS" ;;
  *) echo "usage: $0 install [VERSION] | remove | status" >&2; exit 2 ;;
esac
"""


def _read_gpus(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / TWIN_GPUS_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _apply_gpus(root: Path, settings: dict[str, Any]) -> None:
    _write(root / TWIN_GPUS_FILE, json.dumps(settings, indent=1, sort_keys=True) + "\n", 0o644)
    smi = _guard(root / TWIN_NVIDIA_SMI)
    if settings.get("driver_installed", True):
        _write(smi, (root / TWIN_NVIDIA_SMI_LIB).read_bytes(), 0o755)
    else:
        smi.unlink(missing_ok=True)


def _install_twin_tools(root: Path, name: str) -> None:
    _write(root / TWIN_NVIDIA_SMI_LIB, NVIDIA_SMI_SCRIPT.read_bytes(), 0o755)
    _write(root / TWIN_DRIVER_TOOL, _DRIVER_TOOL, 0o755)
    _write(root / TWIN_HOLDS_TMPFILES, HOLDS_TMPFILES, 0o644)
    settings = dict(GPU_DEFAULTS, uuid_seed=name)
    settings.update(_read_gpus(root))
    _apply_gpus(root, settings)
