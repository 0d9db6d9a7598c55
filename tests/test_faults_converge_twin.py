"""Fault 15 of the matrix (issue 40) on the CT200 twin: a replica set converges to its release
after each of six faults (ct200twin/faultlab/converge.py). It runs on a twin of its own with the
tuner's test through the gateway (`sim up --fleet sets`, DSV4_SIM_SETS_FLEET names it), so that
`make test` can run it in a pytest process beside the lab's (tests/test_faults_twin.py): the two
take about as long, and both mostly wait on smg and the twin servers.

The lab starts from the three-replica set the fault deploys first (its baseline), not from a
single server: it is what the fault starts from, and nothing after it in this module needs the
single server back.
"""

from __future__ import annotations

import pytest

from ct200twin.faultlab.converge import F15_SET3, fault_15
from sim_fixtures import SETS_ENV, fault_lab, recovered, sets_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]


@pytest.fixture(scope="module")
def lab(sets_twin, tmp_path_factory):  # noqa: F811
    yield from fault_lab(sets_twin, tmp_path_factory.mktemp("profiles"), SETS_ENV, baseline=F15_SET3)


def test_a_replica_set_converges_to_its_release_after_each_fault(lab):
    """Fault 15 (issue 40), six cases on three TP2 replicas: a replica crashing mid-roll leaves
    the gateway until its turn; count 3 -> 2 rolls and stops the surplus replica, its GPUs free; a
    rollback across an smg change restarts the gateway; a cut before the gateway's restart is
    settled by the re-run; a tampered kept profile is refused; an instance started by hand and a
    replica restarted from other files are named by make plan and converged by the next run. Each
    ends with the instances, the gateway's workers and its policy those of the release serving."""
    row = fault_15(lab)
    recovered(row)
    assert "taken out of sglang-gateway.service" in row.outputs["15a"]
    assert "holds a value no profile may" in row.outputs["15e"]
    assert "runs other files than those in place" in row.outputs["15f-plan"]
    assert "runs other files than the release's" in row.outputs["15f-status"]      # dsv4deploy status says it too
