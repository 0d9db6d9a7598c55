"""Small effects on a connected pyinfra Host, used at execution time (python.call callbacks,
the CLI's history and rollback): run a command, upload a file, write or read a JSON file (the
release store, host/release_store.py, is built on these). Every call runs as the inventory says operations run: pyinfra applies host data
like `_sudo: True` to operations and facts, but not to direct connector calls, so they go
through here.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import socket
import uuid

from pyinfra.api import DeployError, FileUploadCommand


PRIVILEGE_ARGS = ("_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env", "_su_user")


def privileged(h) -> dict:
    """The inventory's privilege arguments (`_sudo`, ...) for a direct connector call."""
    out = {}
    for key in PRIVILEGE_ARGS:
        value = getattr(h.data, key, None)
        if value not in (None, False, ""):
            out[key] = value
    return out


def no_delay(h) -> None:
    """Send each SSH packet of H's connection at once (TCP_NODELAY). paramiko leaves Nagle's
    algorithm on, and a command's small packets then wait for the host's delayed ACK: about 40 ms
    of every command (50 ms for `true` on the twin, 6-10 ms without). dependency_patches.sessions_ahead (the deploy
    files' first call) and every command through here set it, for pyinfra's own commands too; a
    connection that is not a TCP socket (a local one, a ProxyCommand) is left as it is."""
    with contextlib.suppress(AttributeError, OSError):
        ssh_transport(h).sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def ssh_transport(h):
    """H's paramiko transport (None: not an SSH connection, or not connected)."""
    client = getattr(getattr(h, "connector", None), "client", None)
    return client.get_transport() if client is not None else None


def run(h, command: str, timeout: float | None = None):
    """(ok, CommandOutput) of one shell command, with the inventory's privileges."""
    no_delay(h)
    kwargs = privileged(h)
    if timeout:
        kwargs["_timeout"] = timeout
    return h.run_shell_command(command, **kwargs)


def sh(h, command: str, timeout: float | None = None) -> tuple[bool, str]:
    ok, out = run(h, command, timeout)
    return ok, out.stdout


def put(h, src, dest: str) -> bool:
    """Upload a local path or file object to `dest` (through a private staging file and sudo when
    the inventory connects unprivileged: staged()); False when the upload failed."""
    return bool(h.put_file(src, dest, remote_temp_filename=staged(h, dest), **privileged(h)))


# Where an upload waits for sudo's copy, under the SSH user's home (made 0700 by that user).
STAGING_DIR = ".cache/dsv4deploy-upload"
STAGING_COMMAND = ('umask 077 && d="$HOME/' + STAGING_DIR + '" && mkdir -p "$d" && chmod 700 "$d" && '
                   'test ! -L "$d" && test "$(stat -c %u:%a "$d")" = "$(id -u):700" && printf \'%s\\n\' "$d"')
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,200}")
_staging: dict[str, str] = {}


def staging_dir(h) -> str | None:
    """The folder an upload is staged in before sudo copies it into place, or None when the
    inventory connects as root (an upload then goes straight to its destination).

    pyinfra stages a sudo upload as /tmp/pyinfra-<sha1 of the destination>: a name every local
    user can compute, written with the SFTP server's umask (readable by all), then copied by
    root. The HF token would be readable there, and a user who made that name first would own
    the file root copies (nccl_probe.py, which root runs). So uploads wait in a 0700 folder of
    the SSH user's own, made and checked once per run by that user, without sudo."""
    if not privileged(h):
        return None
    if h.name not in _staging:
        ok, out = h.run_shell_command(STAGING_COMMAND)
        where = out.stdout.strip() if ok else ""
        if not _SAFE_PATH.fullmatch(where):
            raise DeployError(f"cannot make a private folder to stage uploads in (~/{STAGING_DIR}, 0700, owned by "
                              f"the SSH user): {(out.stderr or out.stdout).strip()[-300:] or 'no answer'}")
        _staging[h.name] = where
    return _staging[h.name]


def staged(h, dest: str) -> str | None:
    """A fresh staging file name for an upload to DEST (None: no staging: connected as root)."""
    folder = staging_dir(h)
    return f"{folder}/{uuid.uuid4().hex}-{dest.rsplit('/', 1)[-1][:40]}" if folder else None


class PrivateUpload(FileUploadCommand):
    """An operation's upload, staged as `put` stages it (staged()), decided when it runs."""

    def execute(self, state, host, connector_arguments):
        self.remote_temp_filename = staged(host, self.dest)
        return super().execute(state, host, connector_arguments)


def json_write_command(path: str, doc: dict) -> str:
    """One command that writes DOC to PATH atomically (records and owner files: no secrets, small)."""
    q = shlex.quote
    text = json.dumps(doc, indent=2, sort_keys=True)
    return (f"mkdir -p {q(path.rsplit('/', 1)[0])} && printf '%s\\n' {q(text)} > {q(path)}.tmp "
            f"&& mv {q(path)}.tmp {q(path)}")


def read_json(h, path: str) -> dict | None:
    ok, out = sh(h, f"cat {shlex.quote(path)} 2>/dev/null")
    return json.loads(out) if ok and out.strip() else None
