"""Direct host calls run as the inventory says operations run: with `_sudo` in host data, every
command and upload goes through sudo (pyinfra applies host data to operations and facts only)."""

from __future__ import annotations

from io import StringIO

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
