"""Direct host calls run as the inventory says operations run: with `_sudo` in host data, every
command and upload goes through sudo (pyinfra applies host data to operations and facts only)."""

from __future__ import annotations

from io import StringIO

import pytest
from pyinfra.api import DeployError

from dsv4deploy.host import io as hostio


class Out:
    stdout = "ok\n"


class FakeHost:
    def __init__(self, **data):
        self.data = type("Data", (), data)()
        self.calls: list[tuple] = []
        self.upload_ok = True
        self.run_ok = True

    def run_shell_command(self, command, **kwargs):
        self.calls.append(("run", command, kwargs))
        return self.run_ok, Out()

    def put_file(self, src, dest, **kwargs):
        self.calls.append(("put", dest, kwargs))
        return self.upload_ok


def test_sudo_from_host_data_reaches_every_direct_call():
    h = FakeHost(_sudo=True, _sudo_user=None, ssh_user="deploy")
    assert hostio.sh(h, "mkdir -p /var/lib/x", timeout=5) == (True, "ok\n")
    assert hostio.put(h, StringIO("{}"), "/var/lib/x/a.json")
    hostio.write_json(h, "/var/lib/x/b.json", {"a": 1})
    assert [c[2] for c in h.calls] == [{"_sudo": True, "_timeout": 5}, {"_sudo": True}, {"_sudo": True}]
    assert h.calls[2][1].endswith("&& mv /var/lib/x/b.json.tmp /var/lib/x/b.json")  # a JSON write is one command


def test_as_root_nothing_is_added():
    h = FakeHost(ssh_user="root")
    hostio.sh(h, "true")
    assert h.calls == [("run", "true", {})]


def test_a_failed_upload_or_write_is_an_error_not_a_silent_skip():
    h = FakeHost(_sudo=True)
    h.upload_ok = False
    assert hostio.put(h, StringIO("x"), "/etc/x") is False
    h.run_ok = False
    with pytest.raises(DeployError, match="cannot write /var/lib/x/c.json"):
        hostio.write_json(h, "/var/lib/x/c.json", {})


def test_write_json_runs_here_and_writes_exactly_the_document(tmp_path):
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
    hostio.write_json(LocalHost(), str(tmp_path / "d" / "s.json"), doc)
    assert json.loads((tmp_path / "d" / "s.json").read_text()) == doc
    assert not (tmp_path / "d" / "s.json.tmp").exists()
