"""dsv4deploy/host/op_order.py gives pyinfra's own operation order, from the same stacks."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api.util import PYINFRA_INSTALL_DIR, get_operation_order_from_stack

from dsv4deploy.host import op_order

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
        return get_operation_order_from_stack(state), op_order.order_from_stack(state)

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
    assert op_order.install() is False
    assert operation.get_operation_order_from_stack is get_operation_order_from_stack
    monkeypatch.setattr(pyinfra, "__version__", "3.10.0")
    monkeypatch.setattr(op_order, "TESTED_ON", (("3.10.0", (2, 7)),))     # that pyinfra, another Python
    assert op_order.install() is False
    monkeypatch.setattr(op_order, "TESTED_ON", (("3.10.0", sys.version_info[:2]),))
    assert op_order.install() is True
    assert operation.get_operation_order_from_stack is op_order.order_from_stack
