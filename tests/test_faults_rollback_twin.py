"""Two rows of the fault matrix on the rollbacks' twin rather than the lab's (tests/test_faults_twin.py
has the others): the gate's budget running out mid-gate (fault 13), and the serving unit's own
process reaching loopback and nothing else (issue 37, item 5). Here they run after
tests/test_rollbacks_twin.py, in the same `make test` process, from the good release it leaves
serving, so that the isolated-twin processes take about as long as each other.
"""

from __future__ import annotations

import time

import pytest

from ct200twin import faultlab
from sim_fixtures import ROLLBACK_ENV, fault_lab, recovered, rollback_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]


@pytest.fixture(scope="module")
def lab(rollback_twin, tmp_path_factory):  # noqa: F811
    yield from fault_lab(rollback_twin, tmp_path_factory.mktemp("profiles"), ROLLBACK_ENV)


def test_the_servers_own_unit_reaches_loopback_and_nothing_else(lab):
    """Issue 37, item 5, from inside the real unit: the serving sglang.service's own process (its
    cgroup, its IPAddressDeny=any/IPAddressAllow=localhost) connects to its own port on 127.0.0.1
    and fails to reach the twin's proxy on this machine's end of the veth, which answers any other
    process of the twin. Needs the twin's nspawn to let systemd load BPF (machines.py)."""
    lab.baseline()
    twin, port = lab.twin, 30000
    host_ip = twin.net()["host_ip"]
    proxy = f"{host_ip}:3128"
    connect = f"python3 -c 'import socket; socket.create_connection((\"{host_ip}\", 3128), 2)'"
    assert twin.run(connect, check=False).returncode == 0          # outside the unit: it answers
    lab.faults(connect_probe=[f"127.0.0.1:{port}", proxy])
    try:
        since = twin.run("date +%s").stdout.strip()
        twin.run("systemctl restart sglang.service")
        lines: list[str] = []
        deadline = time.monotonic() + 30     # by the clock: a command to the twin takes ~15 ms
        while time.monotonic() < deadline:
            lines = twin.run(f"journalctl -u sglang.service --since @{since} -o cat | grep 'twin: connect_probe'",
                             check=False).stdout.splitlines()
            if len(lines) == 2:
                break
            time.sleep(0.25)
        assert any(line.endswith(f"127.0.0.1:{port}: connected") for line in lines), lines
        assert any(f"{proxy}: " in line and not line.endswith("connected") for line in lines), lines
    finally:
        lab.reset_host()


def test_the_gate_budget_running_out_mid_gate_rolls_back(lab):
    row = faultlab.fault_13(lab)
    recovered(row)
    assert "exhausted during C=4" in row.outputs["first"]
