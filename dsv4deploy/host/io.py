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
import threading
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
    of every command (50 ms for `true` on the twin, 6-10 ms without). sessions_ahead (the deploy
    files' first call) and every command through here set it, for pyinfra's own commands too; a
    connection that is not a TCP socket (a local one, a ProxyCommand) is left as it is."""
    with contextlib.suppress(AttributeError, OSError):
        _transport(h).sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _transport(h):
    """H's paramiko transport (None: not an SSH connection, or not connected)."""
    client = getattr(getattr(h, "connector", None), "client", None)
    return client.get_transport() if client is not None else None


class SessionsAhead:
    """A paramiko transport's session channels, one opened ahead of the command that takes it.

    Every command pyinfra runs opens a channel first (paramiko's exec_command): a round trip
    before the command itself is sent, 30 ms on a link 30 ms away. Here the next channel is
    asked for as soon as one is taken, while the command runs, so the next command's channel is
    open when it is sent: one round trip per command. The first is asked for at once: sshd sets
    up a connection's session (PAM, logind, motd: 52 ms on the twin) when its first channel
    opens, and that now overlaps the deploy's loading instead of delaying the host's read. A
    spare that did not open, or closed, is replaced by a channel opened then; a call with its
    own window or packet size is opened as paramiko does. The spare opens with paramiko's own
    timeout, and a caller waits for it as long as its own timeout says (None: as paramiko
    would). One spare at most: never near sshd's MaxSessions (10); one nobody takes is closed
    with the connection."""

    def __init__(self, transport):
        self._open = transport.open_session       # paramiko's own
        self._spare: tuple[threading.Event, list] | None = None
        self._ask()

    def _ask(self) -> None:
        if self._spare is not None:         # one is on its way already
            return
        done, box = threading.Event(), []

        def opener() -> None:
            try:
                box.append(self._open())
            except Exception:  # noqa: BLE001 - a spare that did not open: the command opens its own
                pass
            finally:
                done.set()

        self._spare = (done, box)
        # under pyinfra's gevent, start() runs the opener until it waits for the host's answer:
        # the request is on its way before this returns
        threading.Thread(target=opener, name="ssh-session-ahead", daemon=True).start()

    def open_session(self, window_size=None, max_packet_size=None, timeout=None):
        if window_size is not None or max_packet_size is not None:      # its own sizes: as asked
            return self._open(window_size=window_size, max_packet_size=max_packet_size, timeout=timeout)
        spare, self._spare = self._spare, None
        channel = None
        if spare is not None:
            done, box = spare
            done.wait(timeout)
            channel = box[0] if box and box[0].active and not box[0].closed else None
        try:
            return channel or self._open(timeout=timeout)
        finally:
            self._ask()


def sessions_ahead(h) -> None:
    """Open H's SSH session channels one ahead of its commands (SessionsAhead) from now on; the
    deploy files call it first. Once per connection; not an SSH connection (a fake, a local
    one): nothing."""
    no_delay(h)
    transport = _transport(h)
    if transport is None or getattr(transport, "dsv4deploy_sessions_ahead", None) is not None:
        return
    ahead = SessionsAhead(transport)
    transport.dsv4deploy_sessions_ahead = ahead
    transport.open_session = ahead.open_session


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
