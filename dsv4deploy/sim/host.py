"""The CT200 twin host: Debian bookworm booted with systemd-nspawn, reached over SSH.

State layout (``sim_dir()``, by default ``<repo>/.sim``, env ``DSV4_SIM_DIR``)::

    .sim/
      .lock                      flock taken by up/down/gpus
      rootfs/bookworm/           debootstrap root, built once (marker .dsv4deploy-rootfs.json)
      rootfs/debootstrap.log     log of the last build
      ssh/id_ed25519[.pub]       client key pair (root's authorized_keys in every twin)
      ssh/known_hosts            the twins' host keys (host-key checking stays on)
      hosts/twin-N/root/         twin N's own copy of the root
      hosts/twin-N/console.log   nspawn + boot console
      hosts/twin-N/nspawn.pid    PID of the systemd-nspawn process (only while running)
      hosts/twin-N/host.json     name, address, PID start time of the nspawn

Twin N listens on 127.0.0.(N+1):22 (twin-1 -> 127.0.0.2).  The container shares
this machine's network namespace, so sshd is pinned with ListenAddress.
Stopping is by recorded PID only (SIGTERM to nspawn, SIGKILL after a timeout).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import SimError
from .files import _mkdir, _safe_rmtree, _tail, _write
from .gpu_settings import GPU_DEFAULTS, NVIDIA_SMI_SCRIPT, TWIN_NVIDIA_SMI_LIB, _apply_gpus, _install_twin_tools, _read_gpus
from .host_env import _sync_host_environment, bind_mounts
from .layout import (_locked, client_key, deploy_key, hosts_dir, known_hosts_file, sim_dir,
                     ssh_dir, twin_address, twin_name)
from .processes import _CHILDREN, _container_inits, _is_nspawn_of, _nspawn_exit, _port_in_use, _proc_stat
from .rootfs import ROOTFS_MARKER, ensure_rootfs, prebuild_root, rootfs_dir, rootfs_ready

log = logging.getLogger("dsv4deploy.sim")


SSH_WAIT_S = 120.0
DEPLOY_USER = "deploy"          # the inventory's account on the twins (sudo), like an operator's
STOP_WAIT_S = 60.0


# ------------------------------------------------------------------ checks

def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise SimError(f"`sim {action}` needs root (debootstrap and systemd-nspawn do); run it as root or with sudo")


def require_tools() -> None:
    missing = [t for t in ("debootstrap", "systemd-nspawn", "ssh", "ssh-keygen") if not shutil.which(t)]
    if missing:
        pkgs = {"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container",
                "ssh": "openssh-client", "ssh-keygen": "openssh-client"}
        need = sorted({pkgs[m] for m in missing})
        raise SimError(f"missing {', '.join(missing)}: install the Debian packages {' '.join(need)} "
                       f"(apt-get install -y {' '.join(need)}; `make` does this)")


# ------------------------------------------------------------- ssh client

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


# ------------------------------------------------------------------ twins

@dataclass(frozen=True)
class SimHost:
    """One twin: ``SimHost(1)`` is twin-1 at 127.0.0.2."""

    index: int

    @property
    def name(self) -> str:
        return twin_name(self.index)

    @property
    def address(self) -> str:
        return twin_address(self.index)

    @property
    def dir(self) -> Path:
        return hosts_dir() / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "nspawn.pid"

    @property
    def state_file(self) -> Path:
        return self.dir / "host.json"

    # -- state
    def _state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    @property
    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        pid = self.pid
        return pid is not None and _is_nspawn_of(pid, self.name, self._state().get("starttime"))

    def exists(self) -> bool:
        return (self.root / "usr/sbin/sshd").exists()

    # -- ssh
    def ssh_options(self) -> list[str]:
        return ["-F", "/dev/null",
                "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={known_hosts_file()}",
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes",
                "-o", "ConnectTimeout=5",
                "-o", "LogLevel=ERROR",
                "-i", str(client_key())]

    def ssh_argv(self, command: str | Sequence[str] | None = None) -> list[str]:
        """argv for ``ssh root@ADDRESS [command]`` with the sim key and known_hosts."""
        argv = ["ssh", *self.ssh_options(), f"root@{self.address}"]
        if command is not None:
            argv.append(command if isinstance(command, str) else shlex.join(command))
        return argv

    def run(self, command: str | Sequence[str], check: bool = True, timeout: float | None = 120,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run COMMAND (a shell string, or argv that gets quoted) in the twin over ssh."""
        proc = subprocess.run(self.ssh_argv(command), capture_output=True, text=True,
                              timeout=timeout, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise SimError(f"{self.name}: `{command}` exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        return proc

    def write_file(self, path: str, text: str, mode: int | None = None) -> None:
        """Write TEXT to PATH in the twin over ssh (parent directories created)."""
        cmd = f"mkdir -p {shlex.quote(os.path.dirname(path) or '/')} && cat > {shlex.quote(path)}"
        if mode is not None:
            cmd += f" && chmod {mode:o} {shlex.quote(path)}"
        self.run(cmd, input=text)

    def read_file(self, path: str) -> str:
        return self.run(["cat", path]).stdout

    def ssh_ok(self, timeout: float = 10) -> bool:
        try:
            return subprocess.run(self.ssh_argv("true"), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    # -- GPUs
    def gpus(self) -> dict[str, Any]:
        """The twin's nvidia-smi settings (defaults filled in)."""
        return dict(GPU_DEFAULTS, uuid_seed=self.name) | _read_gpus(self.root)

    def set_gpus(self, *, count: int | None = None, memory_mib: int | None = None,
                 memory_used_mib: int | list[int] | None = None, driver_version: str | None = None,
                 driver_installed: bool | None = None, name: str | None = None,
                 compute_cap: str | None = None, reset: bool = False) -> dict[str, Any]:
        """Change what nvidia-smi reports in this twin (effective at once; running or not).

        ``driver_installed=False`` removes /usr/bin/nvidia-smi, True (or a
        ``driver_version``) puts it back.  ``reset`` starts from CT200's defaults.
        """
        if count is not None and not 0 <= count <= 64:
            raise SimError(f"--count must be 0..64, got {count}", 2)
        if memory_mib is not None and memory_mib <= 0:
            raise SimError(f"--memory-mib must be positive, got {memory_mib}", 2)
        if compute_cap is not None and not re.fullmatch(r"\d+\.\d+", compute_cap):
            raise SimError(f"--compute-cap must look like 12.0, got {compute_cap!r}", 2)
        if driver_version is not None and not re.fullmatch(r"\d+(\.\d+){1,2}", driver_version):
            raise SimError(f"--driver must look like 580.95.05, got {driver_version!r}", 2)
        if not self.exists():
            raise SimError(f"{self.name} does not exist; run `dsv4deploy sim up --hosts {self.index}` first")
        with _locked():
            settings = dict(GPU_DEFAULTS, uuid_seed=self.name)
            if not reset:
                settings.update(_read_gpus(self.root))
            changes = {"count": count, "memory_mib": memory_mib, "memory_used_mib": memory_used_mib,
                       "driver_version": driver_version, "name": name, "compute_cap": compute_cap}
            settings.update({k: v for k, v in changes.items() if v is not None})
            if driver_version is not None:
                settings["driver_installed"] = True
            if driver_installed is not None:
                settings["driver_installed"] = bool(driver_installed)
            if not (self.root / TWIN_NVIDIA_SMI_LIB).exists():
                _write(self.root / TWIN_NVIDIA_SMI_LIB, NVIDIA_SMI_SCRIPT.read_bytes(), 0o755)
            _apply_gpus(self.root, settings)
        return settings

    # -- status
    def status(self, check_ssh: bool = True) -> dict[str, Any]:
        running = self.running()
        return {"name": self.name, "index": self.index, "address": self.address,
                "pid": self.pid if running else None, "running": running,
                "ssh": bool(running and check_ssh and self.ssh_ok(timeout=8)),
                "root": str(self.root), "console_log": str(self.console_log)}

    def inventory_entry(self) -> tuple[str, dict[str, Any]]:
        """As an operator connects: the `deploy` account with sudo (DSV4_SIM_USER=root: as root)."""
        user = os.environ.get("DSV4_SIM_USER", DEPLOY_USER)
        as_root = user == "root"
        return (self.address, {
            "ssh_user": "root" if as_root else DEPLOY_USER,
            **({} if as_root else {"_sudo": True}),
            "ssh_port": 22,
            "ssh_key": str(client_key() if as_root else deploy_key()),
            "ssh_known_hosts_file": str(known_hosts_file()),
            "ssh_strict_host_key_checking": "yes",
            "ssh_allow_agent": False,
            "ssh_look_for_keys": False,
            "sim": True,
            "sim_name": self.name,
            "sim_index": self.index,
            "sim_root": str(self.root),
        })


def existing_hosts() -> list[SimHost]:
    out = []
    for d in hosts_dir().glob("twin-*"):
        m = re.fullmatch(r"twin-(\d+)", d.name)
        if m and d.is_dir():
            out.append(SimHost(int(m.group(1))))
    return sorted(out, key=lambda h: h.index)


def running_hosts() -> list[SimHost]:
    return [h for h in existing_hosts() if h.running()]


# ------------------------------------------------------------------- up

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


def _configure_twin(host: SimHost) -> None:
    """Per-boot sync: sshd config and keys, host environment, twin tools."""
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
    _write(root / "etc/hosts", f"127.0.0.1\tlocalhost\n{host.address}\t{host.name}\n"
                               "::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644)
    _sync_host_environment(root)
    _install_twin_tools(root, host.name)
    _record_host_key(host.address, (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text())


def _kill_orphans(host: SimHost) -> bool:
    """SIGKILL the init of a container of HOST whose nspawn is gone (nothing else would ever stop
    it, and it holds the twin's address); the kernel then ends everything in it. True if any."""
    if host.running():
        return False
    inits = _container_inits(host.root)
    for pid in inits:
        log.warning("%s: container init pid %d outlived its nspawn; SIGKILL", host.name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while inits and _container_inits(host.root) and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(inits)


def _clear_address(host: SimHost, wait_s: float = 30) -> None:
    """Before a boot: orphaned containers of HOST are killed, a halting one gets WAIT_S to let go
    of the twin's address."""
    deadline = time.monotonic() + wait_s
    while (_kill_orphans(host) or _port_in_use(host.address)) and time.monotonic() < deadline:
        time.sleep(0.5)


def _boot(host: SimHost) -> int:
    if _port_in_use(host.address):
        raise SimError(f"{host.address}:22 is already in use on this machine; "
                       f"{host.name} cannot listen there (stop what holds it)")
    argv = ["systemd-nspawn", "--keep-unit", "--register=no", "-D", str(host.root), "-b",
            "-M", host.name, "--console=read-only", "--setenv=SYSTEMD_COLORS=0", "--resolv-conf=off", "--timezone=off"]
    argv += [f"--bind-ro={d}" for d in bind_mounts()]
    if host.console_log.exists() and host.console_log.stat().st_size > 4 << 20:
        os.replace(host.console_log, host.console_log.with_suffix(".log.1"))
    with open(host.console_log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _CHILDREN[proc.pid] = proc
    st = _proc_stat(proc.pid)
    state = {"name": host.name, "index": host.index, "address": host.address, "pid": proc.pid,
             "starttime": st[1] if st else None, "started": time.time(), "argv": argv}
    _write(host.state_file, json.dumps(state, indent=1))
    _write(host.pid_file, f"{proc.pid}\n")
    return proc.pid


class _NotYet(Exception):
    pass


def _wait_ssh(host: SimHost, timeout: float) -> None:
    def attempt() -> None:
        if not host.running():
            raise SimError(f"{host.name}: systemd-nspawn exited during boot"
                           f"{_nspawn_exit(host.pid) if host.pid else ''}; see {host.console_log}:\n"
                           f"{_tail(host.console_log)}")
        if not host.ssh_ok(timeout=6):
            raise _NotYet()

    # imported here, not at the top: the root can be built with a bare python3 (prebuild_root)
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

    try:
        for att in Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.5),
                            retry=retry_if_exception_type(_NotYet), reraise=True):
            with att:
                attempt()
    except _NotYet:
        detail = host.run("true", check=False, timeout=10).stderr.strip() if host.running() else ""
        raise SimError(f"{host.name}: ssh root@{host.address} did not answer within {timeout:.0f} s"
                       f"{' (' + detail + ')' if detail else ''}; see {host.console_log}:\n"
                       f"{_tail(host.console_log)}") from None


def up(hosts: int = 1, timeout: float = SSH_WAIT_S, rebuild: bool = False) -> list[SimHost]:
    """Make sure twins 1..HOSTS are running and reachable over ssh; returns them.

    Idempotent: running twins are left alone; stopped ones reuse their root.
    """
    if hosts < 1 or hosts > 253:
        raise SimError(f"--hosts must be 1..253, got {hosts}", 2)
    require_root("up")
    require_tools()
    twins = [SimHost(i) for i in range(1, hosts + 1)]
    booted: list[SimHost] = []
    with _locked():
        ensure_client_key()
        cache = None
        if rebuild or any(not h.exists() for h in twins):
            cache = ensure_rootfs(rebuild=rebuild)
        for h in twins:
            if h.running():
                log.info("%s: already running (pid %s) at %s", h.name, h.pid, h.address)
                continue
            if not h.exists():
                _create_twin(h, cache or ensure_rootfs())
            _configure_twin(h)
            _clear_address(h, wait_s=10)
            log.info("%s: booting at %s", h.name, h.address)
            _boot(h)
            booted.append(h)
        try:
            for h in booted:
                try:
                    _wait_ssh(h, timeout)
                except SimError as exc:
                    # A container of the same name that was just stopped can still hold nspawn's
                    # runtime state for a moment: boot once more before giving up.
                    if "exited during boot" not in str(exc):
                        raise
                    log.warning("%s: %s; booting once more", h.name, str(exc).splitlines()[0])
                    _clear_address(h)
                    _boot(h)
                    _wait_ssh(h, timeout)
                log.info("%s: ssh root@%s ready", h.name, h.address)
        except BaseException:
            for h in booted:
                _stop(h, 20)
            raise
    return twins


# ------------------------------------------------------------------- down

def _stop(host: SimHost, timeout: float) -> bool:
    """Stop HOST by its recorded nspawn PID; True if it was running."""
    pid = host.pid
    state = host._state()
    was_running = pid is not None and _is_nspawn_of(pid, host.name, state.get("starttime"))
    if was_running:
        assert pid is not None
        log.info("%s: stopping (SIGTERM to nspawn pid %d)", host.name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _is_nspawn_of(pid, host.name, state.get("starttime")):
            time.sleep(0.2)
        if _is_nspawn_of(pid, host.name, state.get("starttime")):
            log.warning("%s: no clean shutdown after %.0f s; SIGKILL to pid %d", host.name, timeout, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(50):
                if not _is_nspawn_of(pid, host.name, state.get("starttime")):
                    break
                time.sleep(0.1)
    was_running = _kill_orphans(host) or was_running     # an init that outlived a killed nspawn
    host.pid_file.unlink(missing_ok=True)
    return was_running


def down(indexes: Iterable[int] | None = None, timeout: float = STOP_WAIT_S,
         purge: bool = False) -> list[str]:
    """Stop twins (all by default) by their recorded PIDs; PURGE also deletes their roots.

    Returns the names of the twins that were running.
    """
    require_root("down")
    with _locked():
        targets = existing_hosts() if indexes is None else [SimHost(i) for i in indexes]
        stopped = []
        for h in targets:
            if _stop(h, timeout):
                stopped.append(h.name)
            if purge and h.dir.exists():
                _safe_rmtree(h.dir)
                kh = known_hosts_file()
                if kh.exists():
                    _write(kh, "".join(ln + "\n" for ln in kh.read_text().splitlines()
                                       if ln.strip() and ln.split()[0] != h.address), 0o644)
    return stopped


# ----------------------------------------------------------------- status

def status(check_ssh: bool = True) -> list[dict[str, Any]]:
    return [h.status(check_ssh=check_ssh) for h in existing_hosts()]


def set_gpus(index: int = 1, **settings: Any) -> dict[str, Any]:
    """``SimHost(index).set_gpus(**settings)``."""
    return SimHost(index).set_gpus(**settings)


def inventory_hosts() -> list[tuple[str, dict[str, Any]]]:
    """pyinfra host entries of the running twins; SimError if none runs."""
    hosts = running_hosts()
    if not hosts:
        raise SimError(f"no CT200 twin is running (state in {hosts_dir()}); "
                       "start one with `make sim-up` (or `dsv4deploy sim up`)")
    return [h.inventory_entry() for h in hosts]
