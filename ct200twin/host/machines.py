"""The CT200 twins' lifecycle: ``up`` (root built once, each twin copied, configured, booted
with systemd-nspawn, then reached over ssh), ``down`` (by recorded PID only: SIGTERM to the
nspawn, SIGKILL after a timeout), ``status`` and the pyinfra ``inventory_hosts``.

It is also where the rest of the project imports the sim from (``from ct200twin.host.machines
import ...``, ``ct200twin.host``): its parts live in ``layout`` (state dir, names, addresses,
lock), ``rootfs`` (the cached Debian root), ``twin_host`` (``SimHost``), ``twin_setup``,
``host_env``, ``gpu_settings``, ``processes``, ``files`` and ``errors``; an isolated fleet's
network and proxy in ``netns``, ``proxy`` and ``proxyctl`` (``up``/``down``/``status`` with
``fleet=NAME``).  Stdlib only at module level, like every part: ``prebuild_root`` runs with a
bare python3.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shlex
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

from ct200twin.host import netns, proxyctl
from ct200twin.host.errors import SimError
from ct200twin.host.files import _safe_rmtree, _tail, _write
from ct200twin.host.host_env import bind_mounts
from ct200twin.host.layout import (DEFAULT_FLEET, REPO_ROOT, _locked, check_fleet, client_key, fleet_tag, hosts_dir,
                                   known_hosts_file, sim_dir, twin_address)
from ct200twin.host.processes import (_CHILDREN, _cmdline, _container_inits, _is_nspawn_of, _nspawn_exit,
                                      _port_in_use, _proc_stat)
from ct200twin.host.rootfs import ensure_rootfs, prebuild_root, rootfs_dir, rootfs_ready
from ct200twin.host.twin_host import SimHost, existing_hosts, running_hosts
from ct200twin.host.twin_setup import _configure_twin, _create_twin, ensure_client_key
from ct200twin.server.faults import DEFAULT_PATH as TWIN_FAULTS

# What the project imports from here (ct200twin.host, sim/cli.py, inventory/sim.py, bench/, tests/,
# the Makefile's prebuild_root).  The tests also reach for helpers this module uses itself
# (_locked, _port_in_use, _proc_stat, _is_nspawn_of, _container_inits).
__all__ = ["SSH_WAIT_S", "STOP_WAIT_S", "SimError", "SimHost", "client_key", "down", "ensure_rootfs",
           "existing_hosts", "inventory_hosts", "known_hosts_file", "prebuild_root", "rootfs_dir",
           "rootfs_ready", "running_hosts", "set_gpus", "sim_dir", "status", "twin_address", "up"]

log = logging.getLogger("ct200twin.host")

SSH_WAIT_S = 120.0
STOP_WAIT_S = 60.0


# ------------------------------------------------------------------ checks

def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise SimError(f"`sim {action}` needs root (mmdebstrap and systemd-nspawn do); run it as root or with sudo")


def require_tools() -> None:
    missing = [t for t in ("mmdebstrap", "systemd-nspawn", "ssh", "ssh-keygen") if not shutil.which(t)]
    if missing:
        pkgs = {"mmdebstrap": "mmdebstrap", "systemd-nspawn": "systemd-container",
                "ssh": "openssh-client", "ssh-keygen": "openssh-client"}
        need = sorted({pkgs[m] for m in missing})
        raise SimError(f"missing {', '.join(missing)}: install the Debian packages {' '.join(need)} "
                       f"(apt-get install -y {' '.join(need)}; `make` does this)")


# ------------------------------------------------------------------- up

def _address_busy(host: SimHost) -> bool:
    """Whether something on this machine holds the twin's address:22. An isolated twin gets a new
    network namespace at every boot, so nothing can hold its address but its own container."""
    return False if host.isolated else _port_in_use(host.address)


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
    # the namespace's processes (sshd on the twin's address among them) go after their init
    deadline = time.monotonic() + 10
    while inits and (_container_inits(host.root) or _address_busy(host)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(inits)


def _clear_address(host: SimHost, wait_s: float = 30) -> None:
    """Before a boot: orphaned containers of HOST are killed, a halting one gets WAIT_S to let go
    of the twin's address."""
    deadline = time.monotonic() + wait_s
    while (_kill_orphans(host) or _address_busy(host)) and time.monotonic() < deadline:
        time.sleep(0.5)


def _isolate(host: SimHost) -> list[str]:
    """An isolated twin's network for this boot (a fresh namespace and veth pair) and its proxy on
    this machine's end; the nspawn arguments that put the container in that namespace."""
    _other_machine(host)
    net = host.net()
    path = netns.setup(net)
    pool = netns.pool()
    own = [f"{a}/{a.max_prefixlen}" for a in _local_addresses() if a not in pool]   # this machine's own
    proxyctl.start(host.proxy_file, host.proxy_log, net["host_ip"], [str(pool), *own], REPO_ROOT)
    return [f"--network-namespace-path={path}", f"--hostname={host.name}"]


def _local_addresses() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """This machine's addresses (loopback and link-local aside: the proxy refuses those anyway)."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    found = []
    for words in (ln.split() for ln in out.splitlines()):
        for kind, value in zip(words, words[1:]):
            if kind in ("inet", "inet6"):
                with contextlib.suppress(ValueError):
                    a = ipaddress.ip_interface(value).ip
                    if not (a.is_loopback or a.is_link_local):
                        found.append(a)
    return found


def _other_machine(host: SimHost) -> None:
    """Refuse to boot when another systemd-nspawn on this machine runs a container of the same
    machine name (nspawn keeps runtime state by that name)."""
    me = host._state().get("pid")
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me and _is_nspawn_of(int(name), host.machine):
            raise SimError(f"another systemd-nspawn (pid {name}) runs a machine named {host.machine}; "
                           "stop it first")


def _unisolate(host: SimHost) -> None:
    """The isolated twin's proxy stopped and its network removed (by its records only)."""
    if not host.isolated:
        return
    proxyctl.stop(host.proxy_file)
    with contextlib.suppress(SimError):
        net = host.net()
        if net:
            netns.teardown(net)


PROPAGATE = Path("/run/systemd/nspawn/propagate")


def _clear_propagate(host: SimHost) -> None:
    """systemd-nspawn's mount-propagation folder of HOST's machine, left behind when /run is not a
    tmpfs (nspawn refuses to remove it on a disk file system: "we can't allow that"); a boot that
    finds the last one's still there was seen to halt at once. Only ours, only when it is not running."""
    folder = PROPAGATE / host.machine
    if folder.is_dir() and not host.running():
        shutil.rmtree(folder, ignore_errors=True)


def _boot(host: SimHost) -> int:
    _clear_propagate(host)
    if _address_busy(host):
        raise SimError(f"{host.address}:22 is already in use on this machine; "
                       f"{host.name} cannot listen there (stop what holds it)")
    argv = ["systemd-nspawn", "--keep-unit", "--register=no", "-D", str(host.root), "-b",
            "-M", host.machine, "--console=read-only", "--setenv=SYSTEMD_COLORS=0", "--resolv-conf=off",
            "--timezone=off",
            # bpf(): systemd installs IPAddressDeny=/IPAddressAllow= as cgroup BPF programs; nspawn's
            # seccomp filter would refuse them and systemd silently drop the units' IP rules
            "--system-call-filter=bpf"]
    if host.isolated:
        argv += _isolate(host)
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
             **({"fleet": host.fleet, "machine": host.machine, "netns": host.net()["netns"]}
                if host.isolated else {}),
             "starttime": st[1] if st else None, "started": time.time(), "argv": argv}
    _write(host.state_file, json.dumps(state, indent=1))
    _write(host.pid_file, f"{proc.pid}\n")
    return proc.pid


class _NotYet(Exception):
    pass


def _wait_ssh(host: SimHost, timeout: float) -> None:
    warned: list[int] = []

    def attempt() -> None:
        if not host.running():
            pid = host.pid
            child = _CHILDREN.get(pid) if pid else None
            if child is not None and child.poll() is None:
                # our nspawn has not exited: the check read it mid-change (seen once on a loaded
                # machine, 2026-12-02: the retry below then found the live container on the address)
                if not warned:
                    warned.append(pid)
                    log.warning("%s: nspawn pid %s is alive but did not read as this twin's (%s, %s)",
                                host.name, pid, _proc_stat(pid), (_cmdline(pid) or [])[:8])
            else:
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


def _allocate(h: SimHost) -> None:
    """An isolated twin's /30: the one it had while still free, else a free one (under the lock)."""
    taken = [netns.subnet_of(o.net()) for fl in _fleets() for o in existing_hosts(fl)
             if o != h and o.net_file.exists() and o.net()]
    h.dir.mkdir(parents=True, exist_ok=True)
    netns.allocate(h.net_file, h.fleet, h.index, fleet_tag(h.fleet), taken)


def _fleets() -> list[str]:
    """The names of the fleets this checkout has (from their twins' network records)."""
    found = set()
    for f in hosts_dir().glob("*-*/net.json"):
        name = f.parent.name.rsplit("-", 1)[0]
        with contextlib.suppress(SimError):
            found.add(check_fleet(name))
    return sorted(found)


def up(hosts: int = 1, timeout: float = SSH_WAIT_S, rebuild: bool = False, fleet: str | None = None) -> list[SimHost]:
    """Make sure twins 1..HOSTS are running and reachable over ssh; returns them.
    FLEET: the isolated twins FLEET-1..FLEET-HOSTS instead (docs/fleet.md).

    Idempotent: running twins are left alone; stopped ones reuse their root.
    """
    if hosts < 1 or hosts > 253:
        raise SimError(f"--hosts must be 1..253, got {hosts}", 2)
    if fleet is not None:
        check_fleet(fleet)
    require_root("up")
    require_tools()
    if fleet is not None:
        netns.require_ip()
        netns.pool()
    twins = [SimHost(i, fleet) for i in range(1, hosts + 1)]
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
            if h.isolated:
                _allocate(h)
            _configure_twin(h)
            _clear_address(h, wait_s=10)
            log.info("%s: booting at %s%s", h.name, h.address, " (own network namespace)" if h.isolated else "")
            try:
                _boot(h)
            except BaseException:
                _unisolate(h)                   # an isolated twin's proxy and network, if it got that far
                raise
            booted.append(h)
    # The boots' waits outside the lock: each twin's systemd comes up beside the others' (make
    # test boots about ten twins at once; one after the other, the last waited about 2 minutes).
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
                time.sleep(2)           # let the halted one's nspawn finish its clean-up first
                with _locked():
                    _clear_address(h)
                    _boot(h)
                _wait_ssh(h, timeout)
            log.info("%s: ssh root@%s ready", h.name, h.address)
    except BaseException:
        for h in booted:
            _stop(h, 20)
        raise
    for h in twins:
        _warn_faults(h)
    return twins


def _warn_faults(h: SimHost) -> None:
    """Say so when the twin's server starts with a fault file (a test, the fault lab or a bench
    that was cut off leaves one): its start and serving then differ from the calibrated twin's.
    The twin's root is written by code running in it as root: a link there is not followed (it
    could name a file of this machine), and a FIFO or device is not read."""
    text = _twin_file_head(h.root, TWIN_FAULTS)
    if text is not None:
        log.warning("%s: %s sets %s: its server starts and serves with them, not as calibrated "
                    "(remove the file for the calibrated twin)", h.name, TWIN_FAULTS,
                    " ".join(text.split()) or "nothing")


def _twin_file_head(root: Path, name: str, limit: int = 200) -> str | None:
    """The first LIMIT bytes of the regular file NAME inside the twin ROOT, as text, or None when
    it is absent, is a link, lies outside the root through a linked folder, or is not a file."""
    path = root / name.lstrip("/")
    try:
        if path.parent.resolve() != root.resolve() / Path(name.lstrip("/")).parent:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


# ------------------------------------------------------------------- down

def _stop(host: SimHost, timeout: float) -> bool:
    """Stop HOST by its recorded nspawn PID; True if it was running."""
    pid = host.pid
    state = host._state()
    was_running = pid is not None and _is_nspawn_of(pid, host.machine, state.get("starttime"))
    if was_running:
        assert pid is not None
        log.info("%s: stopping (SIGTERM to nspawn pid %d)", host.name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _is_nspawn_of(pid, host.machine, state.get("starttime")):
            time.sleep(0.2)
        if _is_nspawn_of(pid, host.machine, state.get("starttime")):
            log.warning("%s: no clean shutdown after %.0f s; SIGKILL to pid %d", host.name, timeout, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(50):
                if not _is_nspawn_of(pid, host.machine, state.get("starttime")):
                    break
                time.sleep(0.1)
    was_running = _kill_orphans(host) or was_running     # an init that outlived a killed nspawn
    host.pid_file.unlink(missing_ok=True)
    _unisolate(host)
    return was_running


def down(indexes: Iterable[int] | None = None, timeout: float = STOP_WAIT_S,
         purge: bool = False, fleet: str | None = None) -> list[str]:
    """Stop twins (all by default) by their recorded PIDs; PURGE also deletes their roots.
    FLEET: that fleet's twins (their proxies and networks go too; by their records).

    Returns the names of the twins that were running.
    """
    if fleet is not None:
        check_fleet(fleet)
    require_root("down")
    with _locked():
        targets = existing_hosts(fleet) if indexes is None else [SimHost(i, fleet) for i in indexes]
        stopped = []
        for h in targets:
            if _stop(h, timeout):
                stopped.append(h.name)
            if purge and h.dir.exists():
                address = h.address if not h.isolated or h.net() else None
                _safe_rmtree(h.dir)
                kh = known_hosts_file()
                if kh.exists() and address:
                    _write(kh, "".join(ln + "\n" for ln in kh.read_text().splitlines()
                                       if ln.strip() and ln.split()[0] != address), 0o644)
    return stopped


# ----------------------------------------------------------------- status

def status(check_ssh: bool = True, fleet: str | None = None) -> list[dict[str, Any]]:
    return [h.status(check_ssh=check_ssh) for h in existing_hosts(fleet)]


def set_gpus(index: int = 1, **settings: Any) -> dict[str, Any]:
    """``SimHost(index).set_gpus(**settings)``."""
    return SimHost(index).set_gpus(**settings)


def inventory_hosts(fleet: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """pyinfra host entries of the running twins (of FLEET); SimError if none runs."""
    hosts = running_hosts(fleet)
    if not hosts:
        if fleet is not None:
            make = "make fleet-up" + ("" if fleet == DEFAULT_FLEET else f" FLEET={fleet}")
            raise SimError(f"no twin of fleet {fleet} is running (state in {hosts_dir()}); start them with "
                           f"`{make}` (or `python -m ct200twin up --fleet {fleet} --hosts 3`)")
        raise SimError(f"no CT200 twin is running (state in {hosts_dir()}); "
                       "start one with `make sim-up` (or `python -m ct200twin up`)")
    return [h.inventory_entry() for h in hosts]
