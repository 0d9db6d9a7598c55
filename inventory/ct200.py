"""pyinfra inventory of the real CT200 host.

    CT200_HOST=10.0.0.5 pyinfra -y inventory/ct200.py deploy/serve.py --data profile=nvfp4-ctx8k
    make deploy PROFILE=nvfp4-ctx8k INVENTORY=inventory/ct200.py

Settings come from the environment (or `--data ssh_hostname=...` etc.):
  CT200_HOST         address or name (required)
  CT200_USER         SSH user (default root; a non-root user needs passwordless sudo: CT200_SUDO=1)
  CT200_SSH_KEY      private key file (default: the SSH agent / ~/.ssh defaults)
  CT200_KNOWN_HOSTS  known_hosts file holding CT200's host key (default ~/.ssh/known_hosts)
  CT200_PORT         SSH port (default 22)
Host-key checking stays on: add the host key first (ssh-keyscan, then verify its fingerprint).
"""

import os
from pathlib import Path

from pyinfra.api import InventoryError

_address = os.environ.get("CT200_HOST", "").strip()
if not _address:
    raise InventoryError("inventory/ct200.py: set CT200_HOST to CT200's address (e.g. CT200_HOST=10.0.0.5 make "
                         "deploy PROFILE=nvfp4-ctx8k INVENTORY=inventory/ct200.py)")

_data = {
    "ssh_user": os.environ.get("CT200_USER", "root"),
    "ssh_port": int(os.environ.get("CT200_PORT", "22")),
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": os.path.expanduser(os.environ.get("CT200_KNOWN_HOSTS", "~/.ssh/known_hosts")),
}
if os.environ.get("CT200_SSH_KEY"):
    _data["ssh_key"] = str(Path(os.environ["CT200_SSH_KEY"]).expanduser())
if os.environ.get("CT200_SUDO") == "1":
    _data["_sudo"] = True

ct200 = [(_address, _data)]
