"""weights_source.py: what a deploy expects of the checkpoint, from the hub or a local folder."""

from __future__ import annotations

import socket

import pytest
from pyinfra.api import DeployError

from dsv4deploy.cli.settings import Settings
from dsv4deploy.weights.source import hub_expectation


def test_an_unreachable_hub_is_a_message_naming_it_not_a_traceback(tmp_path):
    with socket.socket() as s:               # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.raises(DeployError, match=rf"cannot read org/model@aaaaaaaaaaaa's file list from {endpoint}: "
                                          r".*(refused|connect)"):
        hub_expectation({"endpoint": endpoint}, "org/model", "a" * 40, Settings.from_environment({}, tmp_path))
