"""Small effects on a connected pyinfra Host, used at execution time (python.call callbacks,
the CLI's history and rollback): run a command, upload a file, write or read a JSON file (the
release store, host/release_store.py, is built on these). Every call runs as the inventory says operations run: pyinfra applies host data
like `_sudo: True` to operations and facts, but not to direct connector calls, so they go
through here.
"""

from __future__ import annotations

import json
import shlex

from pyinfra.api import DeployError


PRIVILEGE_ARGS = ("_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env", "_su_user")


def privileged(h) -> dict:
    """The inventory's privilege arguments (`_sudo`, ...) for a direct connector call."""
    out = {}
    for key in PRIVILEGE_ARGS:
        value = getattr(h.data, key, None)
        if value not in (None, False, ""):
            out[key] = value
    return out


def run(h, command: str, timeout: float | None = None):
    """(ok, CommandOutput) of one shell command, with the inventory's privileges."""
    kwargs = privileged(h)
    if timeout:
        kwargs["_timeout"] = timeout
    return h.run_shell_command(command, **kwargs)


def sh(h, command: str, timeout: float | None = None) -> tuple[bool, str]:
    ok, out = run(h, command, timeout)
    return ok, out.stdout


def put(h, src, dest: str) -> bool:
    """Upload a local path or file object to `dest` (through a temp file and sudo when the
    inventory connects unprivileged); False when the upload failed."""
    return bool(h.put_file(src, dest, **privileged(h)))


def json_write_command(path: str, doc: dict) -> str:
    """One command that writes DOC to PATH atomically (records and owner files: no secrets, small)."""
    q = shlex.quote
    text = json.dumps(doc, indent=2, sort_keys=True)
    return (f"mkdir -p {q(path.rsplit('/', 1)[0])} && printf '%s\\n' {q(text)} > {q(path)}.tmp "
            f"&& mv {q(path)}.tmp {q(path)}")


def write_json(h, path: str, doc: dict) -> None:
    """Write DOC to PATH atomically, in one command."""
    ok, _ = sh(h, json_write_command(path, doc))
    if not ok:
        raise DeployError(f"cannot write {path}")


def read_json(h, path: str) -> dict | None:
    ok, out = sh(h, f"cat {shlex.quote(path)} 2>/dev/null")
    return json.loads(out) if ok and out.strip() else None
