"""What runs behind a twin, read from /proc: whether a PID is still the systemd-nspawn of twin N
(same start time, so a reused PID does not fool it), the container inits that outlived their
nspawn, how a child nspawn ended; and whether something holds a twin's address:22.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

_CHILDREN: dict[int, subprocess.Popen] = {}


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _cmdline(pid: int) -> list[bytes] | None:
    """PID's argv from /proc, None if it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None


def _reap(pid: int) -> None:
    """Collect PID's exit if it is an nspawn this process started (so it reads as gone, not as a
    zombie). Never waits on any other PID: the scans below pass every PID in /proc, and a
    waitpid on one would steal the exit status of a child the caller is waiting for (a deploy
    run by the fault lab then read exit 0 after it had exited 1)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)


def _is_nspawn_of(pid: int, name: str, starttime: int | None = None) -> bool:
    """True if PID is alive and is the systemd-nspawn that runs twin NAME."""
    _reap(pid)
    st = _proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    if starttime is not None and st[1] != starttime:
        return False
    argv = _cmdline(pid)
    if not argv or not argv[0].endswith(b"systemd-nspawn"):
        return False
    return any(a == b"-M" and b == name.encode() for a, b in zip(argv, argv[1:]))


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _container_inits(root: Path) -> list[int]:
    """PIDs of the init processes (PID 1 of another PID namespace) whose root directory is ROOT.

    A container is found by what it runs in, not by a name: an nspawn that died (SIGKILL) leaves
    its init and everything under it running, holding the twin's address.
    """
    try:
        want = os.stat(root)
    except OSError:
        return []
    mine = _pidns(os.getpid())
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            st = os.stat(f"/proc/{pid}/root")
            if (st.st_dev, st.st_ino) != (want.st_dev, want.st_ino) or _pidns(pid) in (None, mine):
                continue
            nspid = next((ln.split()[1:] for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ln.startswith("NSpid:")), [])
        except OSError:
            continue
        if nspid and nspid[-1] == "1":
            found.append(pid)
    return found


def _nspawn_exit(pid: int) -> str:
    """How our nspawn child PID ended, for an error message ("" if unknown or still running)."""
    child = _CHILDREN.get(pid)
    rc = child.poll() if child is not None else None
    if rc is None:
        return ""
    return f" (killed by {signal.Signals(-rc).name})" if rc < 0 else f" (exit status {rc})"


def _port_in_use(address: str, port: int = 22) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return True
    return False
