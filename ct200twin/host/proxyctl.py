"""Starting and stopping an isolated twin's proxy (``proxy.py``): one per twin, in its own
session, listening on this machine's end of the twin's veth; its PID, start time and argv kept in
``hosts/NAME-N/proxy.json``. It is stopped by that record only (the PID must still have the same
start time and argv): never by name.

Kept apart from ``proxy.py`` so that ``python -m ct200twin.host.proxy`` runs a module the package
has not imported already.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from ct200twin.host.errors import SimError
from ct200twin.host.files import _tail, _write
from ct200twin.host.processes import _proc_stat

PORT = 3128
MODULE = "ct200twin.host.proxy"


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


_STARTED: dict[int, subprocess.Popen] = {}


def is_ours(rec: dict[str, Any]) -> bool:
    """Whether the process RECORD names is still this proxy: same PID, start time and argv."""
    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return False
    child = _STARTED.get(pid)
    if child is not None and child.poll() is not None:
        _STARTED.pop(pid, None)
        return False
    st = _proc_stat(pid)
    return (st is not None and st[0] not in ("Z", "X") and st[1] == rec.get("starttime")
            and _cmdline(pid) == rec.get("argv"))


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def start(record: Path, log_file: Path, host: str, deny: Iterable[str], repo: Path, timeout: float = 10.0) -> int:
    """Start the proxy on HOST:PORT in its own session (stdout/stderr to LOG_FILE) unless the one
    RECORD names still runs; record its PID, start time and argv. Returns its PID."""
    rec = _read(record)
    if rec and is_ours(rec) and rec.get("listen") == f"{host}:{PORT}":
        return rec["pid"]
    if rec:
        stop(record)
    argv = [sys.executable, "-m", MODULE, "--listen", f"{host}:{PORT}", *(a for n in deny for a in ("--deny", n))]
    upstream = next((os.environ[k] for k in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")
                     if os.environ.get(k, "").startswith("http://")), None)
    if upstream:
        argv += ["--upstream", upstream]
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(argv, cwd=repo, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _STARTED[proc.pid] = proc
    st = _proc_stat(proc.pid)
    _write(record, json.dumps({"pid": proc.pid, "starttime": st[1] if st else None, "argv": argv,
                               "listen": f"{host}:{PORT}"}, indent=1) + "\n", 0o644)
    deadline = time.monotonic() + timeout
    while not _listening(host, PORT):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(record)
            raise SimError(f"the twin's proxy did not start on {host}:{PORT}; see {log_file}:\n{_tail(log_file, 10)}")
        time.sleep(0.05)
    return proc.pid


def _read(record: Path) -> dict[str, Any]:
    try:
        rec = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def stop(record: Path, timeout: float = 5.0) -> bool:
    """SIGTERM to the proxy RECORD names (only if its PID, start time and argv still match), SIGKILL
    after TIMEOUT; the record goes. True if it was running."""
    rec = _read(record)
    running = bool(rec) and is_ours(rec)
    if running:
        pid = rec["pid"]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while is_ours(rec) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_ours(rec):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(50):
                if not is_ours(rec):
                    break
                time.sleep(0.05)
        child = _STARTED.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1)
    record.unlink(missing_ok=True)
    return running
