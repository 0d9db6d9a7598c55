"""The watch's decisions (dsv4deploy/watch/decide.py), pure, from recorded measurements: what an
operator would do after each kind of interval, with Argo's semantics (a failure limit of
consecutive failed intervals acts; inconclusive never does)."""

from __future__ import annotations

import copy
from pathlib import Path

from dsv4deploy.profile.load import load_profile
from dsv4deploy.profile.validate import validate
from dsv4deploy.watch import decide

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
CFG = decide.settings({"interval_s": 5, "failure_limit": 3, "restart_cooldown_s": 600})
BASE = {"tpot_ms": 71.0, "ttft_ms": 120.0}

# one GPU as agent.read_gpus records it on a healthy CT200 (nvidia-smi, kernel log since the last look)
GPU = {"index": 0, "uuid": "GPU-0", "present": True, "xid": [], "ecc_uncorrectable": 0, "remap_pending": False,
       "clock_events": ["gpu_idle"], "pcie": [5, 16], "pcie_recorded": [5, 16], "foreign_mib": 0}
SERVER = {"name": "server", "index": None, "gpus": [0, 1, 2, 3], "unit_active": True,
          "health": {"ok": True, "status": 200}, "running": 0,
          "probe": {"asked": 32, "tokens": 32, "ttft_ms": 118.0, "tpot_ms": 72.5}}


def gpus(n=4, **sick):
    out = [dict(GPU, index=i, uuid=f"GPU-{i}") for i in range(n)]
    for i, change in sick.items():
        out[int(i[1:])].update(change)
    return out


def reading(targets=None, gpu_list=None, paused=None):
    return {"targets": targets or [SERVER], "gpus": gpu_list or gpus(), "baseline": BASE, "paused": paused}


def run(readings, cfg=CFG, state=None, t0=0.0):
    """Feed READINGS one interval apart; the state and every action, with the interval it came in."""
    actions = []
    for n, r in enumerate(readings):
        state, acts = decide.step(state, r, cfg, t0 + n * cfg["interval_s"])
        actions += [dict(a, at=n) for a in acts]
    return state, actions


def server(**change):
    t = copy.deepcopy(SERVER)
    for k, v in change.items():
        t[k] = v
    return t


SLOW = server(probe={"asked": 32, "tokens": 32, "ttft_ms": 180.0, "tpot_ms": 118.0})   # 40% less throughput
HUNG = server(probe={"asked": 32, "error": "no token within 30 s"})


def test_a_healthy_server_under_varying_load_is_never_acted_on():
    busy = [server(running=r, probe={"asked": 32, "tokens": 32, "tpot_ms": 71 + 31 * r}) for r in (0, 3, 8, 0, 1, 12)]
    state, actions = run([reading([t]) for t in busy * 20])
    assert actions == []
    assert decide.health(state) == "healthy"
    assert {h["verdict"] for h in state["targets"]["server"]["history"]} == {"passed", "inconclusive"}


def test_a_slowdown_acts_at_the_failure_limit_and_restarts():
    state, actions = run([reading()] * 2 + [reading([SLOW])] * 3)
    assert [(a["action"], a["at"]) for a in actions] == [("restart", 4)]
    assert "66% above the gate's 71.0 ms (limit 30%)" in actions[0]["reason"]
    # a gate figure that rests on part of its level (an early pass) says on how many requests
    _, actions = run([reading([SLOW]) | {"baseline": dict(BASE, requests=2, num_prompts=8)}] * 3)
    assert "66% above the gate's 71.0 ms over 2 of 8 requests (limit 30%)" in actions[0]["reason"]
    assert len(actions[0]["evidence"]) == 3 and all(e["cause"] == "regression" for e in actions[0]["evidence"])


def test_a_passed_interval_clears_the_count_and_inconclusive_neither_counts_nor_clears():
    busy_slow = server(running=5, probe=SLOW["probe"])
    _, actions = run([reading([SLOW]), reading([SLOW]), reading(), reading([SLOW]), reading([SLOW])])
    assert actions == []
    _, actions = run([reading([SLOW]), reading([busy_slow]), reading([SLOW]), reading([busy_slow]), reading([SLOW])])
    assert [(a["action"], a["at"]) for a in actions] == [("restart", 4)]


def test_a_regression_again_within_the_cooldown_is_marked_degraded_not_restarted_again():
    state, actions = run([reading([SLOW])] * 6)
    assert [a["action"] for a in actions] == ["restart", "degraded"]
    assert "make rollback" in actions[1]["reason"] and decide.health(state) == "degraded"
    _, more = run([reading([SLOW])] * 3, state=state, t0=100)
    assert more == []                    # marked once, not again while nothing changes


def test_a_hang_behind_a_healthy_health_endpoint_fails_and_errors_too():
    _, actions = run([reading([HUNG])] * 3)
    assert actions[0]["action"] == "restart" and "while /health answers" in actions[0]["reason"]
    short = server(probe={"asked": 32, "tokens": 7, "tpot_ms": 70.0})
    _, actions = run([reading([short])] * 3)
    assert actions[0]["action"] == "restart" and "asked 32 tokens, got 7" in actions[0]["reason"]


def test_a_down_server_is_restarted_and_health_says_down():
    down = server(health={"ok": False, "error": "connection refused"}, probe=None)
    state, actions = run([reading([down])] * 3)
    assert actions[0]["action"] == "restart"
    assert decide.health(state) == "down"


def test_each_gpu_fault_marks_degraded_and_never_restarts():
    faults = {
        "xid 79": {"xid": [79]}, "ecc": {"ecc_uncorrectable": 2}, "remap": {"remap_pending": True},
        "thermal": {"clock_events": ["sw_power_cap", "hw_thermal_slowdown"]},
        "link": {"pcie": [5, 8]}, "gone": {"present": False}, "foreign": {"foreign_mib": 20000},
    }
    for name, fault in faults.items():
        state, actions = run([reading(gpu_list=gpus(g2=fault))] * 4)
        assert [a["action"] for a in actions] == ["degraded"], name
        assert "no config rollback" in actions[0]["reason"] and "GPU 2" in actions[0]["reason"], name
        assert decide.health(state) == "degraded", name


def test_application_xids_and_the_power_cap_are_not_hardware_faults():
    state, actions = run([reading(gpu_list=gpus(g1={"xid": [13], "clock_events": ["sw_power_cap"]}))] * 4)
    assert actions == []
    assert "XID 13 (usually the application's)" in state["targets"]["server"]["history"][-1]["reasons"][0]


def test_a_fault_on_a_gpu_another_target_uses_does_not_touch_this_one():
    state, actions = run([reading(gpu_list=gpus(8, g6={"xid": [79]}))] * 4)
    assert actions == [] and decide.health(state) == "healthy"


REPLICAS = [server(name="replica-0", index=0, gpus=[0, 1, 2, 3]), server(name="replica-1", index=1, gpus=[4, 5, 6, 7])]


def test_a_replica_on_a_sick_gpu_leaves_the_gateway_and_comes_back_when_healthy():
    sick = reading(REPLICAS, gpus(8, g5={"xid": [79]}))
    well = reading(REPLICAS, gpus(8))
    state, actions = run([sick] * 4 + [well] * 3)
    assert [(a["action"], a["target"], a["index"], a["at"]) for a in actions] == [
        ("evict", "replica-1", 1, 2), ("readmit", "replica-1", 1, 6)]
    assert "replica-0 serve on" in actions[0]["reason"]
    assert decide.health(state) == "healthy"


def test_the_last_serving_replica_is_never_evicted():
    both = reading(REPLICAS, gpus(8, g1={"xid": [79]}, g5={"ecc_uncorrectable": 1}))
    _, actions = run([both] * 3)
    assert sorted(a["action"] for a in actions) == ["degraded", "evict"]


def test_while_a_deploy_holds_the_lock_every_interval_is_inconclusive():
    state, actions = run([reading([HUNG], paused="a deploy holds the lock")] * 10)
    assert actions == []
    assert state["targets"]["server"]["consecutive"] == 0


def test_without_gate_figures_speed_is_inconclusive_but_a_hang_still_fails():
    r = reading([SLOW]) | {"baseline": None}
    _, actions = run([r] * 5)
    assert actions == []
    _, actions = run([reading([HUNG]) | {"baseline": None}] * 3)
    assert actions[0]["action"] == "restart"


def test_on_regression_none_only_marks_degraded():
    _, actions = run([reading([SLOW])] * 3, cfg=decide.settings({"on_regression": "none"}))
    assert [a["action"] for a in actions] == ["degraded"]


def test_the_watch_block_has_safe_defaults_outside_the_content_hash():
    p = load_profile("nvfp4-ctx8k", PROFILES)
    assert p.data["watch"]["failure_limit"] == 3 and p.data["watch"]["interval_s"] == 60
    data = copy.deepcopy(p.data)
    data["watch"]["interval_s"] = 7
    assert type(p)(p.name, data, p.origins, p.files).content_hash == p.content_hash
    assert decide.settings(p.data["watch"])["probe"]["output_len"] == 32


def test_a_cooldown_shorter_than_the_failures_it_follows_is_refused():
    p = load_profile("nvfp4-ctx8k", PROFILES)
    data = copy.deepcopy(p.data)
    data["watch"].update(interval_s=600, failure_limit=10, restart_cooldown_s=3600)
    problems = validate(type(p)(p.name, data, p.origins, p.files)).errors
    assert any(x.path == "watch.restart_cooldown_s" for x in problems), problems
