"""Direct host calls run as the inventory says operations run: with `_sudo` in host data, every
command and upload goes through sudo (pyinfra applies host data to operations and facts only)."""

from __future__ import annotations

from io import StringIO
import threading
import time

import pytest
from pyinfra.api import DeployError

from dsv4deploy.host import io as hostio


class Out:
    def __init__(self, stdout="ok\n", stderr=""):
        self.stdout, self.stderr = stdout, stderr


class FakeHost:
    names = iter(range(10**6))

    def __init__(self, staging="/home/deploy/.cache/dsv4deploy-upload\n", **data):
        self.name = f"fake-{next(self.names)}"        # the staging folder is found once per host and run
        self.data = type("Data", (), data)()
        self.calls: list[tuple] = []
        self.upload_ok = True
        self.run_ok = True
        self.staging = staging

    def run_shell_command(self, command, **kwargs):
        self.calls.append(("run", command, kwargs))
        if command == hostio.STAGING_COMMAND:
            return bool(self.staging), Out(self.staging, "" if self.staging else "mkdir: Permission denied")
        return self.run_ok, Out()

    def put_file(self, src, dest, **kwargs):
        self.calls.append(("put", dest, kwargs))
        return self.upload_ok


def test_sudo_from_host_data_reaches_every_direct_call():
    h = FakeHost(_sudo=True, _sudo_user=None, ssh_user="deploy")
    assert hostio.sh(h, "mkdir -p /var/lib/x", timeout=5) == (True, "ok\n")
    assert hostio.put(h, StringIO("{}"), "/var/lib/x/a.json")
    hostio.sh(h, hostio.json_write_command("/var/lib/x/b.json", {"a": 1}))
    staging, upload = h.calls[1], h.calls[2]
    assert staging == ("run", hostio.STAGING_COMMAND, {})          # as the SSH user itself, no sudo
    assert upload[2].pop("remote_temp_filename").startswith("/home/deploy/.cache/dsv4deploy-upload/")
    assert [c[2] for c in h.calls] == [{"_sudo": True, "_timeout": 5}, {}, {"_sudo": True}, {"_sudo": True}]
    assert h.calls[3][1].endswith("&& mv /var/lib/x/b.json.tmp /var/lib/x/b.json")  # a JSON write is one command


def test_a_sudo_upload_is_staged_in_the_ssh_users_private_folder_found_once():
    """pyinfra's own staging file is /tmp/pyinfra-<sha1 of the destination>, readable by all."""
    h = FakeHost(_sudo=True)
    first, second = hostio.staged(h, "/etc/dsv4deploy/secrets/hf-token"), hostio.staged(h, "/etc/x")
    assert first.startswith("/home/deploy/.cache/dsv4deploy-upload/") and first.endswith("-hf-token")
    assert second != first and not first.startswith("/tmp")
    assert sum(c[1] == hostio.STAGING_COMMAND for c in h.calls) == 1
    assert "chmod 700" in hostio.STAGING_COMMAND and 'test ! -L "$d"' in hostio.STAGING_COMMAND
    assert hostio.staged(FakeHost(ssh_user="root"), "/etc/x") is None     # as root: straight to the destination


@pytest.mark.parametrize("answer", ["", "/home/a b/.cache/dsv4deploy-upload\n", "relative/dir\n",
                                    "/home/x/.cache/dsv4deploy-upload\n/etc\n"])
def test_no_private_staging_folder_stops_the_upload_with_a_message(answer):
    h = FakeHost(_sudo=True, staging=answer)
    with pytest.raises(DeployError, match="cannot make a private folder to stage uploads in"):
        hostio.put(h, StringIO("secret"), "/etc/dsv4deploy/secrets/hf-token")
    assert not any(c[0] == "put" for c in h.calls)


def test_the_staging_command_makes_a_private_folder_here(tmp_path):
    """STAGING_COMMAND run with sh: a 0700 folder under HOME, its path printed; a link refused."""
    import os
    import subprocess
    run = lambda: subprocess.run(["sh", "-c", hostio.STAGING_COMMAND], capture_output=True, text=True,  # noqa: E731
                                 env={**os.environ, "HOME": str(tmp_path)})
    out = run()
    folder = tmp_path / hostio.STAGING_DIR
    assert out.returncode == 0 and out.stdout == f"{folder}\n"
    assert (folder.stat().st_mode & 0o777) == 0o700
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir()
    folder.symlink_to(tmp_path / "elsewhere")
    assert run().returncode != 0


def test_as_root_nothing_is_added():
    h = FakeHost(ssh_user="root")
    hostio.sh(h, "true")
    assert h.calls == [("run", "true", {})]


def test_a_failed_upload_is_reported_not_a_silent_skip():
    h = FakeHost(_sudo=True)
    h.upload_ok = False
    assert hostio.put(h, StringIO("x"), "/etc/x") is False


def test_the_json_write_command_runs_here_and_writes_exactly_the_document(tmp_path):
    """The one command, run with sh -c: quotes, newlines and non-ASCII survive."""
    import json
    import subprocess

    class LocalHost(FakeHost):
        def run_shell_command(self, command, **kwargs):
            out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
            o = Out()
            o.stdout = out.stdout
            return out.returncode == 0, o

    doc = {"reason": "it's \"quoted\"\nand $HOME `x` \\ é", "n": 3}
    assert hostio.sh(LocalHost(), hostio.json_write_command(str(tmp_path / "d" / "s.json"), doc))[0]
    assert json.loads((tmp_path / "d" / "s.json").read_text()) == doc
    assert not (tmp_path / "d" / "s.json.tmp").exists()


def test_the_first_command_turns_nagle_off_on_the_hosts_ssh_socket():
    """paramiko leaves Nagle's algorithm on: each command's small packets would wait ~40 ms for
    the host's delayed ACK. A loopback TCP pair stands in for the SSH connection's socket."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    sock = socket.create_connection(server.getsockname())
    try:
        transport = type("Transport", (), {"sock": sock})()
        client = type("Client", (), {"get_transport": lambda self: transport})()
        h = FakeHost()
        h.connector = type("Connector", (), {"client": client})()
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        hostio.run(h, "true")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        hostio.run(FakeHost(), "true")          # no SSH connection (a fake, a local one): left alone
    finally:
        sock.close()
        server.close()


class Channel:
    def __init__(self, n):
        self.n, self.active, self.closed = n, True, False


class Transport:
    """A paramiko transport that opens channel n on the n-th request, each answered when the test
    says (RELEASE), or failing when told to."""
    sock = None

    def __init__(self):
        self.asked, self.answer = 0, threading.Event()
        self.fail: set[int] = set()       # the requests that fail
        self.calls: list[dict] = []

    def open_session(self, window_size=None, max_packet_size=None, timeout=None):
        self.asked += 1
        n = self.asked
        self.calls.append({"window_size": window_size, "max_packet_size": max_packet_size})
        self.answer.wait(10)
        if n in self.fail:
            raise EOFError("no channel")
        return Channel(n)


def ssh_host(transport):
    h = FakeHost()
    h.connector = type("Connector", (), {"client": type("Client", (), {"get_transport": lambda self: transport})()})()
    return h


def test_a_channel_is_asked_for_at_once_without_waiting_for_the_host():
    """The deploy files call sessions_ahead first: sshd sets the session up (52 ms on the twin)
    while the deploy loads; the call does not wait for it."""
    t = Transport()
    hostio.sessions_ahead(ssh_host(t))
    assert not t.dsv4deploy_sessions_ahead._spare[0].is_set()     # returned before the host answered
    deadline = time.monotonic() + 10
    while t.asked == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.asked == 1                               # asked for, not answered yet
    t.answer.set()
    assert t.open_session().n == 1                    # the command takes the channel opened ahead ...
    deadline = time.monotonic() + 10
    while t.asked < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.open_session().n == 2                    # ... and the next one was asked for meanwhile
    hostio.sessions_ahead(ssh_host(t))                # once per connection
    assert t.open_session().n == 3
    hostio.sessions_ahead(FakeHost())                 # no connector: nothing to open


def spare_opened(t, n):
    deadline = time.monotonic() + 10
    while t.asked < n and time.monotonic() < deadline:
        time.sleep(0.01)
    ahead = t.dsv4deploy_sessions_ahead
    ahead._spare[0].wait(10)
    return ahead._spare[1]


def test_a_spare_that_failed_or_closed_is_replaced_and_sftp_opens_its_own():
    t = Transport()
    t.answer.set()
    t.fail = {1, 2}                    # the spare fails, and so does the channel opened instead
    hostio.sessions_ahead(ssh_host(t))
    with pytest.raises(EOFError):      # the command meets the failure as it would with paramiko's own
        t.open_session()
    assert spare_opened(t, 3) and t.open_session().n == 3          # the spare asked for after the failure
    box = spare_opened(t, 4)
    box[0].closed = True                                            # the host closed the spare meanwhile
    assert t.open_session().n == 5                                  # not handed out: a channel opened now
    spare_opened(t, 6)
    sftp = t.open_session(window_size=2 ** 21, max_packet_size=2 ** 15)
    assert sftp.n == 7 and t.calls[-1]["window_size"] == 2 ** 21    # SFTP's own sizes: opened as paramiko does
    assert t.open_session().n == 6                                  # the spare still waits for the next command


def test_the_stand_in_transport_and_the_pool_take_paramikos_arguments():
    """SessionsAhead stands in for paramiko's Transport.open_session: the same parameters."""
    import inspect

    import paramiko

    theirs = list(inspect.signature(paramiko.Transport.open_session).parameters)
    assert theirs == ["self", "window_size", "max_packet_size", "timeout"]
    assert list(inspect.signature(hostio.SessionsAhead.open_session).parameters) == theirs
    assert list(inspect.signature(Transport.open_session).parameters) == theirs
