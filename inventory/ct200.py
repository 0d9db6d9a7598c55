"""pyinfra inventory of the real CT200 host.

    CT200_HOST=10.0.0.5 CT200_PROFILE=nvfp4-ctx8k pyinfra inventory/ct200.py deploy/serve.py
    make deploy PROFILE=nvfp4-ctx8k INVENTORY=inventory/ct200.py     # CT200_HOST=... as well

Settings come from the environment; pyinfra's own flags (--user, --port, --key) and
`--data ssh_hostname=... / ssh_user=... / ssh_port=...` override them:
  CT200_HOST         address or name (required, or --data ssh_hostname=...)
  CT200_PROFILE      the profile deploy/serve.py rolls out (host data `profile`; PROFILE is read
                     when CT200_PROFILE is unset; --data profile=NAME overrides both)
  CT200_USER         SSH user (default root; a non-root user needs passwordless sudo: CT200_SUDO=1,
                     and is refused without it)
  CT200_SSH_KEY      private key file (default: the SSH agent / ~/.ssh defaults)
  CT200_KNOWN_HOSTS  known_hosts file holding CT200's host key (default ~/.ssh/known_hosts)
  CT200_PORT         SSH port (default 22)
A profile deploy is checked while this file loads, before pyinfra connects: no profile, a bad
one, or one whose model revision is still the placeholder stops the run with exit code 2. (pyinfra
loads group_data/ only after this file, so a `profile` set there is not seen by that check: use
CT200_PROFILE or --data.)
Host-key checking stays on: add the host key first (ssh-keyscan, then verify its fingerprint).
"""

import os
import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from dsv4deploy.cli.inventories import cli_data, pyinfra_cli_params, profile_data, refuse  # noqa: E402
from dsv4deploy.host.accounts import login_problem  # noqa: E402

_INVENTORY = "inventory/ct200.py"
_cli = pyinfra_cli_params()
_address = str(cli_data(_cli).get("ssh_hostname") or os.environ.get("CT200_HOST", "")).strip()
if not _address:
    refuse(_INVENTORY, ["set CT200_HOST to CT200's address (e.g. CT200_HOST=10.0.0.5 make deploy "
                        "PROFILE=nvfp4-ctx8k INVENTORY=inventory/ct200.py), or pass --data ssh_hostname=ADDRESS"],
           cli=_cli is not None)
try:
    _port = int(os.environ.get("CT200_PORT", "22"))
except ValueError:
    refuse(_INVENTORY, [f"CT200_PORT={os.environ['CT200_PORT']!r}: not a port number"], cli=_cli is not None)

_data = {
    "ssh_user": os.environ.get("CT200_USER") or "root",
    "ssh_port": _port,
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": os.path.expanduser(os.environ.get("CT200_KNOWN_HOSTS", "~/.ssh/known_hosts")),
}
if os.environ.get("CT200_SSH_KEY"):
    _data["ssh_key"] = str(Path(os.environ["CT200_SSH_KEY"]).expanduser())
if os.environ.get("CT200_SUDO", "") not in ("", "0", "1"):
    refuse(_INVENTORY, [f"CT200_SUDO={os.environ['CT200_SUDO']!r}: expected 1 (through sudo) or unset"],
           cli=_cli is not None)
if os.environ.get("CT200_SUDO") == "1":
    _data["_sudo"] = True
# A login that is neither root nor through sudo cannot write what a deploy file (deploy/serve.py,
# deploy/rollback.py) writes: said here, before connecting (the host's read says it too, for an
# inventory of one's own). `exec` and `fact` run as the login is.
_login = str((_cli or {}).get("ssh_user") or cli_data(_cli).get("ssh_user") or _data["ssh_user"])
_through_sudo = bool(_data.get("_sudo") or (_cli or {}).get("sudo") or cli_data(_cli).get("_sudo"))
_deploy_file = any(str(op).endswith(".py") for op in (_cli or {}).get("operations") or ())
if _deploy_file and (_problem := login_problem(_login, None, _through_sudo)):
    refuse(_INVENTORY, [_problem], cli=True)
# No weights stand-in here: the real checkpoint at a pinned revision, so a placeholder is refused.
_data.update(profile_data(_INVENTORY, env_names=("CT200_PROFILE", "PROFILE"), default=None,
                          weights_stand_in=False, ssh_user=_data["ssh_user"]))

ct200 = [(_address, _data)]
