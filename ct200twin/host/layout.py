"""Where the CT200 twins keep their state on this machine, what a twin is called and where it
listens, and the lock that serializes changes to them.

State layout (``sim_dir()``, by default ``<repo>/.sim``, env ``DSV4_SIM_DIR``)::

    .sim/
      .lock                      flock taken by up/down/gpus and the root's prebuild
      rootfs/bookworm/           Debian root (mmdebstrap), built once (marker .dsv4deploy-rootfs.json)
      rootfs/mmdebstrap.log      log of the last build
      ssh/id_ed25519[.pub]       root's key pair (root's authorized_keys in every twin)
      ssh/deploy_ed25519[.pub]   the deploy account's key pair (what the inventory uses)
      ssh/known_hosts            the twins' host keys (host-key checking stays on)
      hosts/twin-N/root/         twin N's own copy of the root
      hosts/twin-N/console.log   nspawn + boot console
      hosts/twin-N/nspawn.pid    PID of the systemd-nspawn process (only while running)
      hosts/twin-N/host.json     name, address, PID start time of the nspawn

Twin N listens on 127.0.0.(N+1):22 (twin-1 -> 127.0.0.2).  The container shares
this machine's network namespace, so sshd is pinned with ListenAddress.

A fleet (``sim up --fleet NAME``, docs/fleet.md) is a set of isolated twins NAME-1..NAME-N kept
beside them (``hosts/NAME-N/``, plus ``net.json``, ``proxy.json`` and ``proxy.log``): each in its
own network namespace, reached over a veth pair (``netns.py``), so each has its own loopback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from pathlib import Path

from ct200twin.host.errors import SimError

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]


def sim_dir() -> Path:
    env = os.environ.get("DSV4_SIM_DIR")
    return Path(env).resolve() if env else REPO_ROOT / ".sim"


def ssh_dir() -> Path:
    return sim_dir() / "ssh"


def client_key() -> Path:
    return ssh_dir() / "id_ed25519"


def deploy_key() -> Path:
    return ssh_dir() / "deploy_ed25519"


def known_hosts_file() -> Path:
    return ssh_dir() / "known_hosts"


def hosts_dir() -> Path:
    return sim_dir() / "hosts"


def twin_name(index: int) -> str:
    return f"twin-{index}"


# A fleet's name: short (it goes into machine, netns and file names), and never "twin" (the
# default twins' prefix).
FLEET_PATTERN = r"[a-z][a-z0-9]{0,9}"
DEFAULT_FLEET = "fleet"


def check_fleet(name) -> str:
    """NAME if it is a usable fleet name, else SimError (exit 2)."""
    if not isinstance(name, str) or not re.fullmatch(FLEET_PATTERN, name) or name == "twin":
        raise SimError(f"fleet name {ascii(name)}: 1-10 lower-case letters and digits, starting with a "
                       "letter, not 'twin'", 2)
    return name


def fleet_tag(fleet: str) -> str:
    """6 hex digits that tell this checkout's fleet NAME from another checkout's (they go into
    the names of network interfaces, namespaces and nspawn machines, which the whole machine shares)."""
    return hashlib.sha256(f"{sim_dir()}\0{fleet}".encode()).hexdigest()[:6]


def twin_address(index: int) -> str:
    if not 1 <= index <= 253:
        raise SimError(f"twin index must be 1..253, got {index}", 2)
    return f"127.0.0.{index + 1}"


@contextlib.contextmanager
def _locked():
    sim_dir().mkdir(parents=True, exist_ok=True)
    with open(sim_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
