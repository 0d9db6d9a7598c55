"""One twin, ``SimHost(N)``: where its files are, whether its nspawn is running, ssh into it (host
keys checked), what its nvidia-smi reports, its status and its pyinfra inventory entry; and
the twins that exist or run (``existing_hosts``, ``running_hosts``).

``SimHost(N, fleet="NAME")`` is twin N of an isolated fleet (docs/fleet.md): NAME-N, in its own
network namespace, at the address its network record holds (``netns.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from ct200twin.host.errors import SimError
from ct200twin.host.files import _write
from ct200twin.host.gpu_settings import GPU_DEFAULTS, NVIDIA_SMI_SCRIPT, TWIN_NVIDIA_SMI_LIB, _apply_gpus, _read_gpus
from ct200twin.host.layout import (check_fleet, client_key, deploy_key, fleet_tag, hosts_dir,
                                   known_hosts_file, ssh_dir, twin_address, twin_name)
from ct200twin.host.netns import read_record
from ct200twin.host.proxyctl import PORT as PROXY_PORT
from ct200twin.host.processes import _is_nspawn_of

DEPLOY_USER = "deploy"          # the inventory's account on the twins (sudo), like an operator's


@dataclass(frozen=True)
class SimHost:
    """One twin: ``SimHost(1)`` is twin-1 at 127.0.0.2; ``SimHost(1, "fleet")`` is fleet-1, isolated."""

    index: int
    fleet: str | None = None

    def __post_init__(self) -> None:
        if self.fleet is not None:
            check_fleet(self.fleet)
            if not 1 <= self.index <= 253:
                raise SimError(f"twin index must be 1..253, got {self.index}", 2)

    @property
    def isolated(self) -> bool:
        return self.fleet is not None

    @property
    def name(self) -> str:
        return twin_name(self.index) if self.fleet is None else f"{self.fleet}-{self.index}"

    @property
    def machine(self) -> str:
        """systemd-nspawn's machine name (-M): unique on this machine, also across checkouts."""
        return self.name if self.fleet is None else f"{self.name}-{fleet_tag(self.fleet)}"

    @property
    def net_file(self) -> Path:
        return self.dir / "net.json"

    @property
    def proxy_file(self) -> Path:
        return self.dir / "proxy.json"

    @property
    def proxy_log(self) -> Path:
        return self.dir / "proxy.log"

    def net(self) -> dict[str, Any]:
        """An isolated twin's network record ({} until its first `up`)."""
        return read_record(self.net_file) if self.isolated else {}

    @property
    def address(self) -> str:
        if self.fleet is None:
            return twin_address(self.index)
        net = self.net()
        if not net:
            raise SimError(f"{self.name} has no address yet: run `python -m ct200twin up --fleet {self.fleet} "
                           f"--hosts {self.index}` first")
        return net["twin_ip"]

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
        return pid is not None and _is_nspawn_of(pid, self.machine, self._state().get("starttime"))

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

    def shared_ssh_options(self) -> list[str]:
        """One connection for the test bench's commands to this twin (ssh's ControlMaster): make
        test runs about 900 of them, and a new connection each cost 76 ms of this machine's CPU
        and 200 ms of wall time against 6.5 ms and 15 ms through a kept one (measured on an
        isolated twin). Host keys are checked when the connection is made; the socket is in the
        sim's ssh folder (root's, 0700); an idle connection ends after 30 s, and a twin that
        stops ends its own. ssh_argv stays one connection per command (`ct200twin ssh`, and
        what is checked of host-key checking)."""
        path = ssh_dir() / "cm-%C"
        if len(str(path)) + 40 > 100:          # a unix socket's path: 108 bytes at most
            return []
        return ["-o", "ControlMaster=auto", "-o", f"ControlPath={path}", "-o", "ControlPersist=30"]

    def run(self, command: str | Sequence[str], check: bool = True, timeout: float | None = 120,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run COMMAND (a shell string, or argv that gets quoted) in the twin over ssh (the
        connection shared: shared_ssh_options; a new one where ssh could not share it)."""
        argv = self.ssh_argv(command)
        shared = ["ssh", *self.shared_ssh_options(), *argv[1:]]
        stdin = None if input is not None else subprocess.DEVNULL
        proc = subprocess.run(shared, capture_output=True, text=True, timeout=timeout, input=input, stdin=stdin)
        if proc.returncode == 255 and re.search(r"mux_client|[Cc]ontrol ?[Ss]ocket|[Ss]ession request failed",
                                                proc.stderr or ""):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input, stdin=stdin)
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
        Under this twin's own lock, not the twins' state lock: `up` holds that one through a
        whole boot, and a test resetting its twin's GPUs waited for other processes' twins.
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
            raise SimError(f"{self.name} does not exist; run `python -m ct200twin up --hosts {self.index}` first")
        with self._gpus_locked():
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

    @contextlib.contextmanager
    def _gpus_locked(self) -> Iterator[None]:
        """One read-modify-write of this twin's GPU settings at a time (its files are replaced whole:
        files._write). `up` writes them too (twin_setup), but only for a twin it boots, which no
        other process uses meanwhile."""
        with open(self.dir / "gpus.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- status
    def status(self, check_ssh: bool = True) -> dict[str, Any]:
        running = self.running()
        extra = {}
        if self.isolated:
            net = self.net()
            extra = {"fleet": self.fleet, "netns": net.get("netns"),
                     "proxy": f"{net['host_ip']}:{PROXY_PORT}" if net else None}
        return {"name": self.name, "index": self.index,
                "address": self.address if not self.isolated or self.net() else None,
                "pid": self.pid if running else None, "running": running,
                "ssh": bool(running and check_ssh and self.ssh_ok(timeout=8)),
                "root": str(self.root), "console_log": str(self.console_log), **extra}

    def inventory_entry(self) -> tuple[str, dict[str, Any]]:
        """As an operator connects: the `deploy` account with sudo (DSV4_SIM_USER=root: as root
        with root's key and no sudo, as CT200 is most likely reached); another value is refused."""
        user = os.environ.get("DSV4_SIM_USER") or DEPLOY_USER
        if user not in ("root", DEPLOY_USER):
            raise SimError(f"DSV4_SIM_USER={ascii(user)}: expected root (as root, no sudo) or {DEPLOY_USER} "
                           "(the default: with sudo)", 2)
        as_root = user == "root"
        # a fleet twin is named (reports/<name>/, --limit NAME), reached at its veth address
        where = {"ssh_hostname": self.address, "sim_fleet": self.fleet} if self.isolated else {}
        return (self.name if self.isolated else self.address, {
            **where,
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


def existing_hosts(fleet: str | None = None) -> list[SimHost]:
    """The default twins (twin-N), or FLEET's (NAME-N)."""
    prefix = "twin" if fleet is None else check_fleet(fleet)
    out = []
    for d in hosts_dir().glob(f"{prefix}-*"):
        m = re.fullmatch(rf"{prefix}-(\d+)", d.name)
        if m and d.is_dir() and 1 <= int(m.group(1)) <= 253:
            out.append(SimHost(int(m.group(1)), fleet))
    return sorted(out, key=lambda h: h.index)


def running_hosts(fleet: str | None = None) -> list[SimHost]:
    return [h for h in existing_hosts(fleet) if h.running()]
