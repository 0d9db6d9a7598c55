"""Small effects on a connected pyinfra Host, used at execution time (python.call callbacks,
the CLI's history and rollback): run a command, write a JSON file atomically, read releases.
"""

from __future__ import annotations

import json
import shlex
from io import StringIO

from pyinfra.api import DeployError

from . import releases
from .facts import Releases


def sh(h, command: str, timeout: float | None = None) -> tuple[bool, str]:
    kwargs = {"_timeout": timeout} if timeout else {}
    ok, out = h.run_shell_command(command, **kwargs)
    return ok, out.stdout


def write_json(h, path: str, doc: dict) -> None:
    sh(h, f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}")
    h.put_file(StringIO(json.dumps(doc, indent=2, sort_keys=True) + "\n"), f"{path}.tmp")
    ok, _ = sh(h, f"mv {shlex.quote(path)}.tmp {shlex.quote(path)}")
    if not ok:
        raise DeployError(f"cannot write {path}")


def read_json(h, path: str) -> dict | None:
    ok, out = sh(h, f"cat {shlex.quote(path)} 2>/dev/null")
    return json.loads(out) if ok and out.strip() else None


def records(h, releases_dir: str) -> list[dict]:
    return h.get_fact(Releases, releases_dir=releases_dir)


def save_record(h, releases_dir: str, doc: dict) -> None:
    write_json(h, f"{releases.release_dir(releases_dir, doc['release'])}/status.json", doc)
