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

    def run_shell_command(self, command, **kwargs):
        self.calls.append(("run", command, kwargs))
        return True, Out()

    def put_file(self, src, dest, **kwargs):
        self.calls.append(("put", dest, kwargs))
        return self.upload_ok


def test_sudo_from_host_data_reaches_every_direct_call():
    h = FakeHost(_sudo=True, _sudo_user=None, ssh_user="deploy")
    assert hostio.sh(h, "mkdir -p /var/lib/x", timeout=5) == (True, "ok\n")
    assert hostio.put(h, StringIO("{}"), "/var/lib/x/a.json")
    hostio.write_json(h, "/var/lib/x/b.json", {"a": 1})
    assert [c[2] for c in h.calls] == [{"_sudo": True, "_timeout": 5}, {"_sudo": True}, {"_sudo": True},
                                       {"_sudo": True}, {"_sudo": True}]


def test_as_root_nothing_is_added():
    h = FakeHost(ssh_user="root")
    hostio.sh(h, "true")
    assert h.calls == [("run", "true", {})]


def test_a_failed_upload_is_an_error_not_a_silent_skip():
    h = FakeHost(_sudo=True)
    h.upload_ok = False
    assert hostio.put(h, StringIO("x"), "/etc/x") is False
    with pytest.raises(DeployError, match="cannot write /var/lib/x/c.json"):
        hostio.write_json(h, "/var/lib/x/c.json", {})
