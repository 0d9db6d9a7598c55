"""Making a twin before it boots: its root, a copy of the cached one with its own machine-id and
host key (``_create_twin``); at every boot its sshd configuration, root's and the deploy
account's keys and sudo, /etc/hosts, this machine's environment, the GPU tools, the kernel
log's stand-in and this machine's uv cache linked into the twin's (``_configure_twin``); and on
this side, the client keys and the twins' host keys in known_hosts (host-key checking stays on).
"""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from pathlib import Path

from ct200twin.host.files import _mkdir, _safe_rmtree, _write
from ct200twin.host.gpu_settings import _install_twin_tools
from ct200twin.host.host_env import _isolated_environment, _sync_host_environment
from ct200twin.host.layout import client_key, deploy_key, known_hosts_file, ssh_dir
from ct200twin.host.netns import LAN_NAME
from ct200twin.host.proxyctl import PORT as PROXY_PORT
from ct200twin.host.rootfs import ROOTFS_MARKER
from ct200twin.host.twin_host import DEPLOY_USER, SimHost
from ct200twin.host.uv_cache import share as share_uv_cache

log = logging.getLogger("ct200twin.host")


def ensure_client_key() -> Path:
    """root's key (the sim's own checks) and the deploy user's key (what the inventory uses)."""
    for key, comment in ((client_key(), "dsv4deploy-sim"), (deploy_key(), "dsv4deploy-sim-deploy")):
        if not key.exists() or not key.with_suffix(".pub").exists():
            ssh_dir().mkdir(parents=True, exist_ok=True)
            os.chmod(ssh_dir(), 0o700)
            for p in (key, key.with_suffix(".pub")):
                p.unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                           check=True)
    return client_key()


def _ensure_deploy_user(root: Path) -> None:
    """The operator's account on the twin, as on a real host: `deploy`, its own key, and
    passwordless sudo (the deploy runs every host effect through sudo)."""
    passwd = (root / "etc/passwd").read_text()
    if not any(line.split(":", 1)[0] == DEPLOY_USER for line in passwd.splitlines()):
        subprocess.run(["useradd", "--root", str(root), "--create-home", "--shell", "/bin/bash",
                        "--user-group", DEPLOY_USER], check=True, capture_output=True)
        passwd = (root / "etc/passwd").read_text()
    entry = next(line.split(":") for line in passwd.splitlines() if line.split(":", 1)[0] == DEPLOY_USER)
    uid, gid, home = int(entry[2]), int(entry[3]), entry[5]
    ssh = root / home.lstrip("/") / ".ssh"
    _mkdir(ssh)
    _write(ssh / "authorized_keys", deploy_key().with_suffix(".pub").read_text(), 0o600)
    for path in (ssh, ssh / "authorized_keys"):
        os.lchown(path, uid, gid)
    os.chmod(ssh, 0o700)
    _write(root / "etc/sudoers.d/dsv4deploy-twin", f"# written by dsv4deploy sim\n{DEPLOY_USER} ALL=(ALL) NOPASSWD:ALL\n",
           0o440)


def _record_host_key(address: str, pubkey_line: str) -> None:
    kh = known_hosts_file()
    keytype, keydata = pubkey_line.split()[:2]
    lines = []
    if kh.exists():
        lines = [ln for ln in kh.read_text().splitlines()
                 if ln.strip() and ln.split()[0] != address]
    lines.append(f"{address} {keytype} {keydata}")
    _write(kh, "\n".join(sorted(lines)) + "\n", 0o644)


def _create_twin(host: SimHost, cache: Path) -> None:
    host.dir.mkdir(parents=True, exist_ok=True)
    tmp = host.dir / "root.tmp"
    _safe_rmtree(tmp)
    if host.root.exists():                      # incomplete copy from an interrupted run
        _safe_rmtree(host.root)
    log.info("%s: copying the root", host.name)
    subprocess.run(["cp", "-a", "--reflink=auto", str(cache), str(tmp)], check=True)
    (tmp / ROOTFS_MARKER).unlink(missing_ok=True)
    _write(tmp / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    _write(tmp / "etc/hostname", host.name + "\n", 0o644)
    key = tmp / "etc/ssh/ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}",
                    "-f", str(key)], check=True)
    os.chmod(tmp, 0o755)
    os.rename(tmp, host.root)


# The kernel log's stand-in. A container has no /dev/kmsg; systemd-nspawn bind-mounts a FIFO on
# /proc/kmsg and keeps it open at both ends for the container's life, so opening it never waits
# for a partner. /dev/kmsg as a link to it, made before journald starts, gives journald a kernel
# log to read (`journalctl -k` as on a host) and ct200twin.host.sick a place to write a driver's
# lines. A FIFO of our own there instead deadlocks the twin: journald logs its own start to
# /dev/kmsg, and a FIFO without a reader blocks that open() for good. Unlike the kernel's ring
# buffer, writes block once 64 KiB are unread, which only a long-stopped journald would allow.
KMSG_DROPIN = "etc/systemd/system/systemd-journald.service.d/dsv4deploy-twin-kmsg.conf"
KMSG_LINK = "[ -p /proc/kmsg ] && ln -sfn /proc/kmsg /dev/kmsg || true"


def _kernel_log_stand_in(root: Path) -> None:
    _write(root / KMSG_DROPIN, "# written by dsv4deploy sim: the kernel log's stand-in (twin_setup.py)\n"
                               f"[Service]\nExecStartPre=-/bin/sh -c '{KMSG_LINK}'\n", 0o644)


def _configure_twin(host: SimHost) -> None:
    """Per-boot sync: sshd config and keys, host environment, twin tools, the kernel log."""
    root = host.root
    _write(root / "etc/ssh/sshd_config.d/00-dsv4deploy-twin.conf",
           f"# written by dsv4deploy sim: twin {host.name}\n"
           f"ListenAddress {host.address}\n"
           "Port 22\n"
           "HostKey /etc/ssh/ssh_host_ed25519_key\n"
           "PermitRootLogin prohibit-password\n"
           "PasswordAuthentication no\n"
           "KbdInteractiveAuthentication no\n"
           "UseDNS no\n", 0o644)
    auth = root / "root/.ssh/authorized_keys"
    _mkdir(auth.parent)
    os.chmod(auth.parent, 0o700)
    _write(auth, client_key().with_suffix(".pub").read_text(), 0o600)
    _ensure_deploy_user(root)
    # an isolated twin knows this machine's end of its veth by name, as a host knows its LAN
    lan = f"{host.net()['host_ip']}\t{LAN_NAME}\n" if host.isolated else ""
    _write(root / "etc/hosts", f"127.0.0.1\tlocalhost\n{host.address}\t{host.name}\n{lan}"
                               "::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644)
    _sync_host_environment(root)
    if host.isolated:
        _isolated_environment(root, f"http://{host.net()['host_ip']}:{PROXY_PORT}",
                              direct=(host.net()["host_ip"], LAN_NAME))
    _install_twin_tools(root, host.name)
    _kernel_log_stand_in(root)
    share_uv_cache(root)                  # a host that installed before: its uv cache warm (uv_cache.py)
    _record_host_key(host.address, (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text())
