"""host/state.py and the plan: which facts a deploy reads (pure), and what the plan says for a
given host state. No host: the state is a fixture."""

from __future__ import annotations

import hashlib

from checkout import settings
from dsv4deploy.release.changes import Changes
from dsv4deploy.host.state import HostState, managed_paths, queries
from dsv4deploy.release.rollout import rollout_for
from dsv4deploy.tasks.plan import plan_lines
from dsv4deploy.tasks.service import files_differ, unit_files

SIM = {"profile": "nvfp4-ctx8k", "weights_source": {"type": "local", "path": "/srv/x", "size_gib": 1},
       "settings": settings()}


def _rollout():
    return rollout_for(SIM)


def _deployed_state(r, **over) -> HostState:
    files = {path: {"type": "file", "mode": "644", "user": "root", "group": "root",
                    "sha256": hashlib.sha256(content).hexdigest()} for _, path, content in unit_files(r)}
    values = {"files": files, "unit": {"ActiveState": "active", "UnitFileState": "enabled", "MainPID": 42},
              "releases": [{"release": 3, "status": "deployed", "profile": "nvfp4-ctx8k",
                            "manifest_sha256": r.manifest_sha256}],
              "checkpoint": {"complete": True, "marker": True}}
    values.update(over)
    return HostState(values=values)


def test_one_read_covers_every_file_a_step_compares():
    r = _rollout()
    q = queries(r)
    paths = q["files"][1]["paths"]
    for _, path, _ in unit_files(r):
        assert path in paths
    assert r.layout.hf_token_file in paths and f"{r.layout.venv}/bin/python" in paths
    assert any(p.endswith(".patch") for p in paths)          # the mask patch of the base profile
    assert {"basics", "gpus", "unit", "port", "releases", "lock", "packages", "accounts", "venv",
            "checkpoint", "api_key", "patches"} <= set(q)
    assert len(managed_paths(r)) == len(set(managed_paths(r)))


def test_a_deployed_release_on_an_unchanged_host_plans_nothing():
    r = _rollout()
    state = _deployed_state(r)
    assert files_differ(r, state) == []
    lines = plan_lines(r, state, [])
    assert lines == ["nothing to change: release 0003 (nvfp4-ctx8k) is deployed and sglang.service is active"]


def test_an_edited_unit_plans_the_restart_with_its_reason_the_release_the_gate_and_the_rollback():
    r = _rollout()
    state = _deployed_state(r)
    state.values["files"][r.layout.unit]["sha256"] = "0" * 64
    changes = Changes()
    changes.notify("unit files", *files_differ(r, state))
    assert changes.reasons == ["unit files: unit sglang.service"]
    lines = plan_lines(r, state, changes.reasons)
    assert lines[0] == "restart sglang.service because: unit files: unit sglang.service"
    assert lines[1] == ("launch check before the switch: SGLang 0.5.23's own parser with its ServerArgs checks "
                        "parses the rendered argv "
                        "(from the table it captured in this venv, when it has one)")
    assert "record release 0004 (nvfp4-ctx8k) as pending" in lines[2]
    assert "C=64 >= 400 tok/s, C=16 >= 120 tok/s, C=1 >= 10 tok/s" in lines[3]
    assert "roll back to release 0003 (nvfp4-ctx8k)" in lines[4]


def test_the_plan_skips_the_launch_check_the_serving_release_passed_with_the_same_argv_and_venv():
    from dsv4deploy.tasks.venv import launch_check_key
    r = _rollout()
    state = _deployed_state(r)
    state.values["releases"][0]["launch_check"] = launch_check_key(r)
    state.values["files"][r.layout.unit]["sha256"] = "0" * 64     # the unit alone differs
    lines = plan_lines(r, state, ["unit files: unit sglang.service"])
    assert lines[1] == ("launch check: release 0003, the last deployed, passed it with this argv and venv "
                        "(SGLang 0.5.23's own parser with its ServerArgs checks); not run again")
    refilled = plan_lines(r, state, ["venv changed", "unit files: unit sglang.service"])   # the venv is redone
    assert refilled[1].startswith("launch check before the switch")
    state.values["releases"][0]["launch_check"] = "0" * 16      # another argv or venv passed there
    assert plan_lines(r, state, ["unit files: unit sglang.service"])[1].startswith("launch check before the switch")


def test_an_argv_an_earlier_release_passed_on_this_venv_is_not_parsed_again():
    """A release that crashed at start or failed its gate had passed the launch check first (its
    record is written after it): deploying its argv again skips the import of SGLang."""
    from dsv4deploy.tasks.venv import launch_check_key
    r = _rollout()
    state = _deployed_state(r)
    live = state.values["releases"][0]
    live["launch_check"] = "0" * 16                               # the serving release: another argv
    state.values["releases"].append({**live, "release": live["release"] + 1, "status": "failed",
                                     "launch_check": launch_check_key(r)})
    state.values["files"][r.layout.unit]["sha256"] = "0" * 64
    lines = plan_lines(r, state, ["unit files: unit sglang.service"])
    assert lines[1] == (f"launch check: release {live['release'] + 1:04d} (failed) passed it with this argv and venv "
                        "(SGLang 0.5.23's own parser with its ServerArgs checks); not run again")
    assert plan_lines(r, state, ["venv changed", "unit files: unit sglang.service"])[1].startswith(
        "launch check before the switch")                        # a venv this run redoes is checked again


def test_a_replica_set_that_cannot_roll_plans_its_replacement_at_once():
    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    state = HostState(values={"files": {}, "unit": {"ActiveState": "active"},
                              "releases": [{"release": 3, "status": "deployed", "profile": "nvfp4-ctx8k-dp2",
                                            "manifest_sha256": "old", "replicas": [{"index": 0}, {"index": 1}]}],
                              "checkpoint": {"complete": True, "marker": True}})
    rolling = plan_lines(r, state, ["release: release 0003 renders differently"])
    assert any(line.startswith("rolling update behind sglang-gateway.service") for line in rolling)
    why = "its replicas change (http://127.0.0.1:30001, http://127.0.0.1:30002 -> http://127.0.0.1:31001, ...)"
    lines = plan_lines(r, state, ["release: release 0003 renders differently"], downtime=why)
    assert not any(line.startswith("rolling update") for line in lines)
    assert (f"replace the serving replica set at once (allow_downtime=true: {why}): restart sglang@0.service, "
            "sglang@1.service together and sglang-gateway.service with them; users get errors until the new set is "
            "healthy, then the smoke gate through it") in lines


def test_a_replica_the_gateway_no_longer_lists_is_checked_and_added_back():
    from dsv4deploy.tasks.replicas import out_of_gateway
    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    values = {"files": {}, "unit": {"ActiveState": "active"},
              "releases": [{"release": 3, "status": "deployed", "profile": "nvfp4-ctx8k-dp2",
                            "manifest_sha256": r.manifest_sha256, "replicas": [{"index": 0}, {"index": 1}]}],
              "checkpoint": {"complete": True, "marker": True},
              "gateway_workers": [{"url": "http://127.0.0.1:30002", "status": "ready", "healthy": True}]}
    state = HostState(values=values)
    assert [rt.index for rt in out_of_gateway(r, state)] == [0]
    assert plan_lines(r, state, []) == [
        "nothing to change in release 0003 (nvfp4-ctx8k-dp2), but sglang-gateway.service does not list replica 0 "
        "(sglang@0.service): health and identity on its own port, then add it back (no restart)"]
    values["gateway_workers"] = None                        # the gateway did not answer: not this step's
    assert out_of_gateway(r, HostState(values=values)) == []
    assert out_of_gateway(rollout_for(SIM), _deployed_state(rollout_for(SIM))) == []


def test_the_plan_says_who_held_the_deploy_lock_when_the_host_was_read():
    r = _rollout()
    held = {"controller": "ops-laptop", "pid": 4242, "started": "2026-12-01T04:00:00+00:00", "what": "deploy nvfp4-ctx8k"}
    lines = plan_lines(r, _deployed_state(r, lock=held), [])
    assert lines[0] == ("the deploy lock was held when the host was read: PID 4242 on ops-laptop since "
                        "2026-12-01T04:00:00+00:00 (deploy nvfp4-ctx8k); a deploy refuses while that run holds it")
    assert lines[1].startswith("nothing to change") and len(plan_lines(r, _deployed_state(r), [])) == 1


def test_a_stopped_unit_with_nothing_changed_is_started_and_checked():
    r = _rollout()
    state = _deployed_state(r, unit={"ActiveState": "failed"})
    assert "not active" in plan_lines(r, state, [])[0]


def test_changes_collects_reasons_from_operations_bools_and_words():
    class Op:
        def __init__(self, change):
            self.will_change = change

    c = Changes()
    c.notify("venv", [Op(False), Op(False)])
    c.notify("weights", [])
    assert not c and c.reasons == []
    c.notify("secrets", [Op(False), Op(True)])
    c.notify("release", "release 0003 renders differently")
    c.notify("unit files", None)
    assert c and c.reasons == ["secrets changed", "release: release 0003 renders differently"]


def test_the_run_that_took_the_lock_in_its_read_does_not_name_itself_as_the_holder():
    r = _rollout()
    ours = {"controller": "ops-laptop", "pid": 7, "started": "2026-12-03T13:00:00+00:00", "what": "deploy nvfp4-ctx8k"}
    state = _deployed_state(r, lock=ours)
    state.first = ([], 0)                                    # the read's own mkdir took it
    assert state.lock_holder is None and len(plan_lines(r, state, [])) == 1
    state.first = (["{...}"], 1)                             # held by another run: refused, and named
    assert state.lock_holder == ours


def _set_state(r, **over) -> HostState:
    values = {"files": {}, "unit": {"ActiveState": "active"},
              "releases": [{"release": 3, "status": "deployed", "profile": "nvfp4-ctx8k-dp2",
                            "manifest_sha256": r.manifest_sha256, "replicas": [{"index": 0}, {"index": 1}]}],
              "checkpoint": {"complete": True, "marker": True}, "gateway_stale": False}
    values.update(over)
    return HostState(values=values, units=("sglang@0", "sglang@1", "sglang-gateway"))


def test_a_gateway_that_runs_older_files_than_those_in_place_is_restarted_alone():
    """A run cut off between writing the gateway's files and its restart left smg running the old
    ones: with nothing else to change, the next run restarts the gateway alone (the plan says so)."""
    from dsv4deploy.tasks.replicas import gateway_restart
    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    state = _set_state(r, **{f"unit:{u}": {"ActiveState": "active"} for u in ("sglang@0", "sglang@1", "sglang-gateway")})
    assert gateway_restart(r, state, [], False) is None and plan_lines(r, state, [])[0].startswith("nothing to change:")
    state.values["gateway_stale"] = True
    why = gateway_restart(r, state, [], False)
    assert why == "runs older gateway files than those in place"
    assert plan_lines(r, state, [], gateway_restart=why) == [
        "nothing to change in release 0003 (nvfp4-ctx8k-dp2), but sglang-gateway.service runs older gateway files "
        "than those in place: restart it alone (the replicas keep running; connections to the gateway drop while it "
        "restarts), then a probe through it"]
    assert gateway_restart(_rollout(), _deployed_state(_rollout(), gateway_stale=True), [], False) is None


def test_a_rolling_update_says_when_it_restarts_the_gateway_and_why():
    from dsv4deploy.tasks.replicas import gateway_restart
    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    state = _set_state(r)
    reasons = ["release: release 0003 renders differently", "unit files: gateway unit"]
    assert gateway_restart(r, state, ["gateway unit"], False) == "its unit or launcher changes"
    assert gateway_restart(r, state, [], True) == "its venv changes"
    (roll,) = [line for line in plan_lines(r, state, reasons, gateway_restart="its unit or launcher changes")
               if line.startswith("rolling update")]
    assert ("add it back; the others serve throughout; then restart sglang-gateway.service (its unit or launcher "
            "changes; connections to it drop while it restarts), then 4 short probe requests") in roll
    (quiet,) = [line for line in plan_lines(r, state, reasons[:1]) if line.startswith("rolling update")]
    assert "restart sglang-gateway.service" not in quiet


def test_a_set_with_a_replica_down_still_rolls_behind_its_gateway_as_the_run_does():
    """The run rolls whenever the gateway serves (Switch.run); the plan said "at once" when any unit
    was down, and a change that cannot roll went unrefused there."""
    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    state = _set_state(r, **{"unit:sglang@0": {"ActiveState": "active"}, "unit:sglang@1": {"ActiveState": "failed"},
                             "unit:sglang-gateway": {"ActiveState": "active"}})
    assert not state.unit_active and state.front_active
    lines = plan_lines(r, state, ["release: release 0003 renders differently"])
    assert any(line.startswith("rolling update behind sglang-gateway.service") for line in lines)


def test_a_set_with_nothing_changed_and_a_replica_down_plans_its_start_and_probes_not_a_gate():
    """What Switch.start_down does: the down replica started and probed on its own port, the
    gateway restarted if it runs older files, a probe through it; the release passed its gate."""
    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    state = _set_state(r, **{"unit:sglang@0": {"ActiveState": "active"}, "unit:sglang@1": {"ActiveState": "failed"},
                             "unit:sglang-gateway": {"ActiveState": "active"}})
    assert plan_lines(r, state, [], gateway_restart="runs older gateway files than those in place") == [
        "nothing changed, but sglang@1 is not active: start it (each replica probed on its own port), restart "
        "sglang-gateway.service (runs older gateway files than those in place), then a probe through "
        "sglang-gateway.service; release 0003 passed its gate already"]
