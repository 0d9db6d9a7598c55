"""Fault 12 of the matrix on the default twin: the host reboots in the middle of a deploy (its
container is stopped and booted again at the verify step); the run ends with a message, and the
same deploy run again settles the release the cut run left pending and converges.

It runs on the default twin (the other faults run on an isolated one, tests/test_faults_twin.py)
to keep make test's two twin processes balanced; the container's stop ends the deploy's SSH session
as a real reboot does, and the run exits 1 on either kind of twin (docs/faults.md).
"""

from __future__ import annotations

import pytest

from dsv4deploy.sim import faultlab
from dsv4deploy.sim import host as simhost
from sim_fixtures import sim_twin  # noqa: F401

pytestmark = pytest.mark.slow
BASE = "fbase"


@pytest.fixture(scope="module")
def lab(sim_twin, tmp_path_factory):  # noqa: F811
    profiles = faultlab.write_profiles(tmp_path_factory.mktemp("profiles"),
                                       {**faultlab.VARIANTS, BASE: faultlab.variant(7680)})
    lab = faultlab.Lab(sim_twin, profiles, baseline=BASE, any_good=True, rerun=False)
    lab.baseline()
    yield lab
    lab.reset_host()
    sim_twin.run(f"rm -f {faultlab.FAULTS}", check=False)


def test_the_host_rebooting_mid_deploy_is_settled_by_the_rerun(lab):
    def reboot():
        simhost.down([1])
        simhost.up(1)
    row = faultlab.fault_12(lab, reboot=reboot)
    tails = "\n".join(f"--- {k} ---\n{v[-2500:]}" for k, v in row.outputs.items())
    assert row.recovered, "; ".join(row.why_not) + "\n" + tails
    assert row.outputs["first"] and "interrupted" in row.outputs["rerun"]
