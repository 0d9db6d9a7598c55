"""dsv4deploy/host/dependency_patches.py: what it replaces in pyinfra and paramiko is still what it
was compared with (each test named for the function it guards: an upgrade that changes one fails
here, by name, before a deploy runs with a replacement that no longer fits), and the
replacements do what the originals do: pyinfra's operation order from the same stacks, and
paramiko's session channels, one opened ahead."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import threading
import time
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api.util import PYINFRA_INSTALL_DIR, get_operation_order_from_stack

from dsv4deploy.host import dependency_patches as dp

operation = importlib.import_module("pyinfra.api.operation")

DEPLOY = "/tmp/dsv4deploy-test-deploy.py"
# a deploy file's code (compiled under its own name, as pyinfra's exec_file does) calling a
# helper that adds an operation two calls deep, at different lines
SOURCE = """
def task(depth):
    if depth:
        return task(depth - 1)
    return through_pyinfra(both)


results = [task(0),
           task(2)]
"""


def run_deploy(current_deploy_filename, is_cli, monkeypatch):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=current_deploy_filename, current_op_file_number=3)

    def both():
        return get_operation_order_from_stack(state), dp.order_from_stack(state)

    # a frame of pyinfra's own between the deploy file and the operation, as there always is
    helper: dict = {}
    exec(compile("def through_pyinfra(f):\n    return f()\n", f"{PYINFRA_INSTALL_DIR}/fake_util.py", "exec"), helper)
    scope = {"both": both, "through_pyinfra": helper["through_pyinfra"]}
    exec(compile(SOURCE, DEPLOY, "exec"), scope)
    return scope["results"]


@pytest.mark.parametrize("deploy_file", [DEPLOY, None, "/elsewhere/not-on-the-stack.py"])
@pytest.mark.parametrize("is_cli", [True, False])
def test_the_order_is_pyinfras_own(deploy_file, is_cli, monkeypatch):
    results = run_deploy(deploy_file, is_cli, monkeypatch)
    for theirs, ours in results:
        assert ours == theirs
    if deploy_file != "/elsewhere/not-on-the-stack.py":
        # the two calls differ by their lines in the deploy file: told apart, and in that order
        assert results[0][1] < results[1][1]


def test_installed_only_on_the_pyinfra_and_python_it_was_compared_with(monkeypatch):
    import sys

    monkeypatch.setattr(operation, "get_operation_order_from_stack", get_operation_order_from_stack)
    monkeypatch.setattr(pyinfra, "__version__", "0.0.0-untested")
    assert dp.install_operation_order() is False
    assert operation.get_operation_order_from_stack is get_operation_order_from_stack
    monkeypatch.setattr(pyinfra, "__version__", "3.10.0")
    monkeypatch.setattr(dp, "PYINFRA_TESTED_ON", (("3.10.0", (2, 7)),))     # that pyinfra, another Python
    assert dp.install_operation_order() is False
    monkeypatch.setattr(dp, "PYINFRA_TESTED_ON", (("3.10.0", sys.version_info[:2]),))
    assert dp.install_operation_order() is True
    assert operation.get_operation_order_from_stack is dp.order_from_stack


# --- paramiko's open_session, one channel ahead ---------------------------------------------------

class FakeHost:
    def __init__(self):
        self.name, self.data = "fake", type("Data", (), {})()


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
    dp.sessions_ahead(ssh_host(t))
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
    dp.sessions_ahead(ssh_host(t))                # once per connection
    assert t.open_session().n == 3
    dp.sessions_ahead(FakeHost())                 # no connector: nothing to open


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
    dp.sessions_ahead(ssh_host(t))
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
    assert list(inspect.signature(dp.SessionsAhead.open_session).parameters) == theirs
    assert list(inspect.signature(Transport.open_session).parameters) == theirs


# --- what the patches replace: unchanged since they were compared with it -----------------------------

# sha256 of pyinfra 3.10.0's get_operation_order_from_stack source: order_from_stack returns what it
# returns (test_the_order_is_pyinfras_own); a pyinfra whose function differs must be compared again
PYINFRA_ORDER_SOURCE = "f4807f61585570e091fd453c7552d9e2b49329555f07f395a8e8f1d2a398a0b2"


def test_pyinfra_get_operation_order_from_stack_is_the_one_order_from_stack_replaces():
    import pyinfra.api.util as util

    assert (pyinfra.__version__, dp.PYINFRA_TESTED_ON[0][0]) == ("3.10.0", "3.10.0"), (
        f"pyinfra {pyinfra.__version__}: compare dsv4deploy/host/dependency_patches.py order_from_stack with its "
        "get_operation_order_from_stack, then list it in PYINFRA_TESTED_ON and pyproject.toml's pin")
    digest = hashlib.sha256(inspect.getsource(util.get_operation_order_from_stack).encode()).hexdigest()
    assert digest == PYINFRA_ORDER_SOURCE, (
        "pyinfra.api.util.get_operation_order_from_stack changed: order_from_stack may no longer return what it "
        "returns; compare them and update PYINFRA_ORDER_SOURCE")


def test_pyinfra_operation_looks_get_operation_order_from_stack_up_by_its_module_name():
    """install_operation_order replaces the module-level name pyinfra.api.operation calls: a
    pyinfra that calls it another way would keep its own without anyone noticing."""
    source = inspect.getsource(operation)
    assert hasattr(operation, "get_operation_order_from_stack")
    assert "get_operation_order_from_stack(state)" in source, (
        "pyinfra.api.operation no longer calls get_operation_order_from_stack(state): install_operation_order "
        "would replace nothing")


def test_paramiko_transport_open_session_is_what_sessions_ahead_stands_in_for():
    import paramiko

    assert paramiko.__version__ in dp.PARAMIKO_TESTED_ON, (
        f"paramiko {paramiko.__version__}: compare dsv4deploy/host/dependency_patches.py SessionsAhead with its "
        "Transport.open_session, then list it in PARAMIKO_TESTED_ON")
    assert list(inspect.signature(paramiko.Transport.open_session).parameters) == [
        "self", "window_size", "max_packet_size", "timeout"]
    # the replacement is an attribute of the transport object: every channel must be opened through it
    assert "self._transport.open_session(" in inspect.getsource(paramiko.SSHClient.exec_command), (
        "paramiko.SSHClient.exec_command no longer opens its channel with self._transport.open_session")
    assert "t.open_session(" in inspect.getsource(paramiko.SFTPClient.from_transport), (
        "paramiko.SFTPClient.from_transport no longer opens its channel with the transport's open_session")


def test_sessions_ahead_leaves_a_paramiko_it_was_not_compared_with_alone(monkeypatch):
    import paramiko

    monkeypatch.setattr(paramiko, "__version__", "0.0.0-untested")
    t = Transport()
    dp.sessions_ahead(ssh_host(t))
    assert not hasattr(t, "dsv4deploy_sessions_ahead") and t.asked == 0
