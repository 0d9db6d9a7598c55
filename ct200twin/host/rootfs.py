"""The cached Debian root that every twin starts as a copy of: bookworm's minbase and what a fresh
server install has, built once by mmdebstrap into a temporary dir and renamed into place, rebuilt
when its recipe changes.

mmdebstrap, not debootstrap: the same packages (merged /usr the way debootstrap makes it, with
usr-is-merged, not the usrmerge package and its perl), in about 25 s instead of about 80 s here
(120 s while make test's other work runs), and every twin waits for this root.

Stdlib only at module level (and so are the modules it imports): `make test` runs
``prebuild_root`` with a bare python3 while the venv installs.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ct200twin.host.errors import SimError
from ct200twin.host.files import _mkdir, _safe_rmtree, _tail, _write
from ct200twin.host.layout import _locked, sim_dir

log = logging.getLogger("ct200twin.host")

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What a fresh server install has, nothing more: systemd, sshd, python3 for pyinfra, sudo for the
# operator's account, and iproute2/procps (priority "important" in Debian, in every Ubuntu server).
# Everything else the deploy uses (python3-venv, curl, patch, ...) it installs itself.
ROOTFS_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "sudo", "iproute2", "procps",
)
ROOTFS_RECIPE_VERSION = 3
ROOTFS_MARKER = ".dsv4deploy-rootfs.json"
MERGED_USR_HOOK = "/usr/share/mmdebstrap/hooks/merged-usr"


def rootfs_dir() -> Path:
    return sim_dir() / "rootfs" / SUITE


def _recipe() -> dict[str, Any]:
    return {"suite": SUITE, "variant": "minbase", "packages": list(ROOTFS_PACKAGES), "builder": "mmdebstrap",
            "version": ROOTFS_RECIPE_VERSION}


def rootfs_ready() -> bool:
    marker = rootfs_dir() / ROOTFS_MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return data.get("recipe") == _recipe() and (rootfs_dir() / "usr/sbin/sshd").exists()


def _mirror() -> str:
    return os.environ.get("DSV4_SIM_MIRROR", DEFAULT_MIRROR)


def ensure_rootfs(rebuild: bool = False) -> Path:
    """Build the cached Debian root once (into a temp dir, renamed atomically)."""
    final = rootfs_dir()
    if not rebuild and rootfs_ready():
        return final
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{SUITE}.*"):
        _safe_rmtree(stale)
    build = Path(tempfile.mkdtemp(prefix=f".{SUITE}.build-", dir=parent))
    os.chmod(build, 0o755)          # mkdtemp makes 0700: that would be the twin's "/"
    logfile = parent / "mmdebstrap.log"
    cmd = build_command(build)
    log.info("building the twin root (mmdebstrap %s, under a minute, once): log in %s", SUITE, logfile)
    t0 = time.monotonic()
    with open(logfile, "w") as out:
        out.write("$ " + shlex.join(cmd) + "\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        _safe_rmtree(build)
        raise SimError(f"mmdebstrap failed (exit {rc}); see {logfile}:\n{_tail(logfile, 15)}")
    _prepare_rootfs(build)
    _write(build / ROOTFS_MARKER, json.dumps({"recipe": _recipe(), "built": time.time(),
                                               "seconds": round(time.monotonic() - t0, 1)}, indent=1))
    if final.exists() or final.is_symlink():
        old = parent / f".{SUITE}.old-{os.getpid()}"
        os.rename(final, old)
        _safe_rmtree(old)
    os.rename(build, final)
    log.info("twin root built in %.0f s", time.monotonic() - t0)
    return final


def build_command(target: Path) -> list[str]:
    """mmdebstrap as root into TARGET, with debootstrap's merged /usr (its hook) and the package lists
    kept (a freshly installed server has them; mmdebstrap removes them by default)."""
    return ["mmdebstrap", "--mode=root", "--variant=minbase", f"--hook-dir={MERGED_USR_HOOK}",
            "--skip=cleanup/apt/lists", "--include=" + ",".join(ROOTFS_PACKAGES), SUITE, str(target), _mirror()]


def prebuild_root() -> None:
    """Build the cached root now if it is missing (as root; under the sim lock, so `up` waits for
    it). Stdlib only: `make test` runs it with a bare python3 while the venv installs."""
    if os.geteuid() != 0:
        return
    with _locked():
        ensure_rootfs()


def _prepare_rootfs(root: Path) -> None:
    """One-time edits of the cached root, shared by all twins."""
    # host keys are per twin
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # no unattended apt runs racing the deploy for the dpkg lock; no console login
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "console-getty.service",
                 "systemd-networkd-wait-online.service"):
        link = root / "etc/systemd/system" / unit
        _mkdir(link.parent)
        if not link.is_symlink():
            link.symlink_to("/dev/null")
    # drop downloaded .debs
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    _write(root / "etc/machine-id", "")
