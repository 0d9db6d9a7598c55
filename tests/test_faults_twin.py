"""The fault matrix (issue 12) on the CT200 twin: each fault of bench/faults.py that
tests/test_deploy_twin.py does not already cover (crash at start, never healthy, error rate,
crash mid-gate, stale server, too few GPUs are there), one test each, from a good release serving.

Every test asserts what an operator sees: the exit and the message, the release serving after the
same deploy is run again, a history with nothing pending and nothing `deployed` that did not pass
its gate, earlier releases' files intact, and no process of ours left on the host
(ct200twin/faultlab/recovered.py judges all of it: `Row.recovered`, `Row.why_not`).

They run on an isolated twin (`sim up --fleet lab`, its own network namespace, shared with the
replica tests) in `make test`'s isolated-twin process; the reboot (fault 12) last, as it boots the
lab twin anew. Two more rows run on the rollbacks' twin (tests/test_faults_rollback_twin.py), and
fault 15 (replica sets) on a twin of its own (tests/test_faults_converge_twin.py), so that the
isolated-twin processes of `make test` take about as long as each other.
"""

from __future__ import annotations

import pytest

from ct200twin import faultlab
from ct200twin.host import machines as simhost
from sim_fixtures import LAB_ENV, LAB_FLEET, fault_lab, lab_twin, recovered  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]
LAUNCH_CHECK = "Launch check | the twin's parser"      # its step (tool.step_key) with LAB_ENV's parser


@pytest.fixture(scope="module")
def lab(lab_twin, tmp_path_factory):  # noqa: F811
    yield from fault_lab(lab_twin, tmp_path_factory.mktemp("profiles"), LAB_ENV)


def test_a_control_process_killed_mid_gate_leaves_no_gate_client_running(lab):
    """The bug seen on the twin: SIGKILL to pyinfra during the gate left the gate client on the host,
    still sending load. It now sees its SSH session go and exits; the re-run settles the release the
    cut run left pending and converges."""
    t0, before = faultlab.start(lab)
    first, state, rerun = faultlab.cut_at(lab, "f6gate", None, mid_gate=True)
    assert first.rc == -9 and first.struck == faultlab.VERIFY_STEP
    serving_after_cut, left = state
    assert left == [], left                       # nothing of ours outlived the cut run
    assert "interrupted after the switch, before its gate passed" in rerun.output
    row = lab.judge(faultlab.Row("6", "cut mid-gate"), first, state, t0=t0, before=before, rerun=rerun)
    recovered(row)
    recs = faultlab.releases(lab.twin)
    assert [r["status"] for r in recs[-2:]] == ["unverified", "deployed"]
    assert recs[-1]["profile"] == "f6gate"


def test_a_cut_at_the_launch_check_strikes_and_the_rerun_converges(lab):
    """Fault 6 cuts at the launch check too: each cut deploys a profile no release on the host had
    (f6cut-N), so the check (run only for an argv no release passed) comes, and is cut; the re-run
    checks again and converges. At 4bb5d99 the cut run skipped the check and the cut never struck."""
    fresh = faultlab.fresh_variants(lab.profiles, {r["profile"] for r in faultlab.releases(lab.twin)}, "f6cut",
                                    faultlab.F6_CUT_CONTEXT)
    t0, before = faultlab.start(lab)
    first, state, rerun = faultlab.cut_at(lab, next(fresh), LAUNCH_CHECK)
    assert first.rc == -9 and faultlab.step_key(first.struck) == LAUNCH_CHECK, first.output[-2500:]
    assert "parses the rendered argv" in "\n".join(faultlab.operations(rerun.output))   # checked again
    recovered(lab.judge(faultlab.Row("6", "cut at the launch check"), first, state, t0=t0, before=before,
                        rerun=rerun))


def test_two_deploys_at_once_one_refuses_with_the_holders_pid(lab):
    row = faultlab.fault_7(lab)
    recovered(row)
    assert "another deploy holds the lock on this host: PID" in row.outputs["refused"]
    assert "break_lock=true" in row.outputs["refused"]     # what to do if the holder is gone


def test_the_release_a_rollback_restores_is_broken(lab):
    """Its kept files are gone (the restored release crashing at start is fault 10's second half):
    a clear error that says what to do, and the failed rollback is in the history."""
    row = faultlab.fault_8(lab, cases=("files",))
    recovered(row)
    gone = row.outputs["restored release's files removed"]
    assert "cannot be restored: gone from the host: its kept files" in gone
    assert "NOTHING IS SERVING" in gone and "make deploy PROFILE=" in gone
    recs = faultlab.releases(lab.twin)
    failed_rollbacks = [r for r in recs if r["kind"] == "rollback" and r["status"] == "failed"]
    assert failed_rollbacks and "cannot be restored" in failed_rollbacks[-1]["reason"]


def test_a_corrupted_shard_is_pushed_again_and_verified(lab):
    """Corrupted with its size kept (a truncated one is found by its size as before): the deploy
    finds it by sha256 against the rsync source, pushes it again and restarts on good weights."""
    row = faultlab.fault_9(lab, cases=("corrupted",))
    recovered(row)
    text = row.outputs["corrupted"]
    assert "Weights | push" in text and "restart sglang.service (weights changed" in text


def test_gpus_that_vanish_after_the_deploy_started_end_in_a_clear_error(lab):
    """The restored release crashes at start too: the rollback fails, clearly, and says what to do."""
    row = faultlab.fault_10(lab, cases=("vanish",))
    recovered(row)
    text = row.outputs["6 of 8 GPUs vanish after the preflight"]
    assert "4 needed)" in text and "NOTHING IS SERVING" in text


def test_the_disk_filling_during_the_weights_step_stops_before_any_restart(lab):
    row = faultlab.fault_11(lab)
    recovered(row)
    assert "Restart | restart" not in row.outputs["first"]


def test_the_host_rebooting_mid_deploy_is_settled_by_the_rerun(lab):
    """Fault 12: the host reboots at the verify step (the lab twin's container is stopped and booted
    again); the run exits non-zero with a message, and the same deploy run again settles the release
    the cut run left pending and converges. Last in this module: the lab twin boots anew."""
    def reboot():
        simhost.down([1], fleet=LAB_FLEET)
        simhost.up(1, fleet=LAB_FLEET)
    row = faultlab.fault_12(lab, reboot=reboot)
    recovered(row)
    assert row.outputs["first"] and "interrupted" in row.outputs["rerun"]
    assert row.did.startswith("exit 1;") and "lost the connection to the host" in row.outputs["first"]
