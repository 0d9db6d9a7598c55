"""The switch of a replica set (tasks/replicas.py) on a fake host: after a rolling update the set
users reach is probed through the gateway, never loaded by a second gate (users are there), and
the release records each replica's own gate with the weakest one as its headline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsv4deploy.gate import GateOutcome, GateResult, GateSpec, LevelResult, LevelSpec, judge
from dsv4deploy.sglang.health import HealthError
from dsv4deploy.cli.history import gate_summary
from dsv4deploy.host.gate import rolling_gate_record
from dsv4deploy.render.layout import Layout
from checkout import load_profile
from dsv4deploy.release.records import Release
from dsv4deploy.release.rollout import Target
from dsv4deploy.tasks import replicas as tr

SPEC = GateSpec(levels=(LevelSpec(64, 64, 256, 64, min_output_throughput=300),))


def outcome(tok_s: float) -> GateOutcome:
    result = GateResult(runner="builtin", levels=[LevelResult(concurrency=64, num_prompts=64, completed=64,
                                                              output_throughput=tok_s, duration_s=9.0)])
    return GateOutcome(SPEC, result, judge(SPEC, result))


class Store:
    def __init__(self, h, releases_dir=None):
        self.h = h
        self.saved: list[dict] = []
        Store.last = self

    def current(self):
        return {"release": 1, "profile": "nvfp4-ctx8k-dp2", "status": "deployed"}

    def target(self, rec):
        return Target.of(load_profile("nvfp4-ctx8k-dp2").data)

    def go_live(self, rel, also=""):
        self.saved.append(rel.record)
        return rel


@pytest.fixture()
def switch(monkeypatch):
    events: list[tuple] = []
    data = load_profile("nvfp4-ctx8k-dp2").data
    r = SimpleNamespace(target=Target.of(data), layout=Layout.of(data), profile=SimpleNamespace(name="nvfp4-ctx8k-dp2"))
    pending = Release({"release": 2, "profile": "nvfp4-ctx8k-dp2", "status": "pending"})
    monkeypatch.setattr(tr, "unit_active", lambda h, unit: True)
    monkeypatch.setattr(tr, "sh", lambda h, cmd, timeout=None: (True, ""))
    speeds = {0: 420.0, 1: 380.0}

    def gate(h, t, number, previous_doc, profile, prepared=None):
        events.append(("gate", t.base_url) + ((prepared,) if prepared else ()))
        return outcome(speeds[t.index] if t.index is not None else 999.0)

    def prepare(h, t):
        events.append(("prepare", t.base_url))
        return "prepared"

    def roll(h, t, indices, check, poll_s, log, steps):
        for s in steps:
            check(t.replica(s.index))
            s.status = "switched"
        return steps

    def probe(h, t, requests=2, tokens=8):
        events.append(("probe", t.base_url, requests))
        if getattr(switch, "probe_fails", False):
            raise HealthError("probe request 1/4 failed: no answer")
        return f"{requests}/{requests} probe requests through {t.base_url} answered {tokens} tokens each"

    monkeypatch.setattr(tr, "run_release_gate", gate)
    monkeypatch.setattr(tr, "previous_report", lambda h, t, previous: None)
    monkeypatch.setattr(tr, "prepare_release_gate", prepare)
    monkeypatch.setattr(tr, "roll", roll)
    monkeypatch.setattr(tr, "retire", lambda h, serving, indices, log, done: events.append(("retire", indices)))
    monkeypatch.setattr(tr, "stop_surplus", lambda h, t, log: [])
    monkeypatch.setattr(tr, "probe", probe)
    h = SimpleNamespace(name="fake", data={"health_poll_s": 0})
    switch = SimpleNamespace(make=lambda: tr.Switch(Store(h), r, ["the unit changed"], False, pending), events=events)
    return switch


def test_a_rolling_update_gates_each_replica_alone_then_only_probes_the_gateway(switch, capsys):
    switch.make().run()
    # the gate's runner and client made ready once, before the first replica leaves the gateway
    assert switch.events == [("prepare", "http://127.0.0.1:30000"), ("gate", "http://127.0.0.1:30001", "prepared"),
                             ("gate", "http://127.0.0.1:30002", "prepared"), ("retire", []),
                             ("probe", "http://127.0.0.1:30000", 4)]
    rec = Store.last.saved[-1]
    assert rec["gate"]["passed"] and rec["gate"]["output_throughput"] == 380.0
    assert rec["gate"]["scope"] == "replica 1, the weakest of 2 gated one at a time"
    assert [r["gate"]["output_throughput"] for r in rec["replicas"]] == [420.0, 380.0]
    assert "4/4 probe requests through http://127.0.0.1:30000 answered" in capsys.readouterr().out


def test_a_failed_probe_through_the_gateway_fails_the_release_and_restores_every_replica(switch, monkeypatch):
    switch.probe_fails = True
    restored = {}

    def after_failure(rel, t, reason, indices):
        restored.update(reason=reason, indices=indices, status=rel.record["status"])
        return "rolled back: release 0003 (restores 0001, profile nvfp4-ctx8k-dp2) is serving"

    monkeypatch.setattr(tr, "Rollback", lambda store, poll_s: SimpleNamespace(after_failure=after_failure))
    with pytest.raises(tr.DeployError, match="probe request 1/4 failed"):
        switch.make().run()
    assert restored["indices"] is None and "probe request" in restored["reason"]     # the whole set comes back
    assert not Store.last.saved


def test_the_rolling_record_names_the_weakest_replica_and_history_shows_it():
    per = {0: {"passed": True, "summary": "C=64 420 tok/s", "level": "C=64", "floor": 300, "output_throughput": 420.0},
           1: {"passed": True, "summary": "C=64 380 tok/s", "level": "C=64", "floor": 300, "output_throughput": 380.0}}
    doc = rolling_gate_record(per, "4/4 probe requests through http://127.0.0.1:30000 answered 8 tokens each")
    assert doc["passed"] and doc["output_throughput"] == 380.0 and doc["summary"].startswith("replica 0: C=64 420")
    assert gate_summary({"gate": doc}) == ("pass: C=64 380.0 tok/s vs floor 300 "
                                           "(replica 1, the weakest of 2 gated one at a time)")
    assert not rolling_gate_record({**per, 1: {**per[1], "passed": False}}, "-")["passed"]
    # a replica whose level passed early: its figure rests on part of the level, and history says so
    early = {**per, 1: {**per[1], "passed_early": True, "completed": 64, "num_prompts": 128}}
    assert gate_summary({"gate": rolling_gate_record(early, "-")}) == (
        "pass: C=64 380.0 tok/s vs floor 300 (passed early: 64 of 128 requests) "
        "(replica 1, the weakest of 2 gated one at a time)")


@pytest.mark.parametrize("stale", [True, False])
def test_a_set_restore_restarts_the_gateway_only_when_it_runs_other_files_than_the_restored(monkeypatch, stale):
    """Across a change of smg itself (version, policy, launcher) the gateway still runs the failed
    release's files after the restore put the old ones back: it restarts from them. A release
    that changed only the replicas leaves it running (a restart would drop every connection)."""
    from dsv4deploy.host import rollback as rb

    t = Target.of(load_profile("nvfp4-ctx8k-dp2").data)
    events: list[str] = []
    monkeypatch.setattr(rb, "unit_active", lambda h, unit: True)
    monkeypatch.setattr(rb, "stop_surplus", lambda h, t, log: events.append("surplus"))
    monkeypatch.setattr(rb, "roll", lambda h, t, indices, check, poll_s, log: events.append(f"roll {indices}"))
    monkeypatch.setattr(rb, "api", lambda h, t: (None, "", ""))
    monkeypatch.setattr(rb.gateway, "list_workers", lambda http, endpoint, key: [])
    monkeypatch.setattr(rb, "gateway_stale", lambda h, t: stale)
    monkeypatch.setattr(rb, "start_gateway", lambda h, t, restart: events.append(f"gateway restart={restart}"))
    rb.Rollback(Store(SimpleNamespace(name="fake")), poll_s=0.1).restore_set(t, None)
    assert events == ["surplus", "roll [0, 1]"] + (["gateway restart=True"] if stale else [])


@pytest.mark.parametrize("pid_now, restored_too", [("4343", [1]), ("4242", []), ("0", [1])])
def test_a_replica_restarted_during_a_failed_roll_is_restored_with_the_touched_ones(switch, monkeypatch, pid_now,
                                                                                     restored_too):
    """Replica 0 fails its gate; replica 1, not reached, crashed meanwhile and systemd started it
    again from the new release's files (or left it down): the restore takes it back too, else it
    would go on serving a release no gate passed. Untouched and unchanged, it is left alone."""
    restored = {}

    def roll(h, t, indices, check, poll_s, log, steps):
        raise tr.ReplicaFailed(0, "replica 0: smoke gate failed", done=[])

    def after_failure(rel, t, reason, indices):
        restored.update(indices=indices)
        return "rolled back"

    asked = []
    monkeypatch.setattr(tr, "roll", roll)
    monkeypatch.setattr(tr, "Rollback", lambda store, poll_s: SimpleNamespace(after_failure=after_failure))
    from dsv4deploy.host import replicas as hr
    monkeypatch.setattr(hr, "sh", lambda h, cmd, timeout=None: (asked.append(cmd), (True, f"{pid_now}\n"))[1])
    s = switch.make()
    s.pids_before = {0: 4141, 1: 4242}
    with pytest.raises(tr.DeployError):
        s.run()
    assert restored["indices"] == [0] + restored_too
    assert asked[-1] == "systemctl show -p MainPID --value sglang@1.service"


def test_a_serving_set_whose_kept_profile_cannot_be_read_is_not_promised_a_rolling_update(monkeypatch):
    """Switch.run replaces the set at once when it cannot read what the serving set runs: the
    guard asks for allow_downtime then too, instead of a plan that promises a roll."""
    from dsv4deploy.host.release_store import RollbackError
    from dsv4deploy.host.state import HostState

    class Unreadable:
        def __init__(self, h, releases_dir=None):
            pass

        def target(self, rec):
            raise RollbackError("release 0003's profile.json is damaged (not the JSON a release keeps)")

    data = load_profile("nvfp4-ctx8k-dp2").data
    r = SimpleNamespace(target=Target.of(data), layout=Layout.of(data))
    state = HostState(values={"unit": {"ActiveState": "active"},
                              "releases": [{"release": 3, "status": "deployed", "replicas": [{"index": 0}]}]})
    monkeypatch.setattr(tr, "ReleaseStore", Unreadable)
    monkeypatch.setattr(tr, "host", SimpleNamespace(data={}))
    with pytest.raises(tr.DeployError, match=r"cannot replace it one replica at a time: what the serving set runs "
                                             r"cannot be read back \(release 0003's profile.json is damaged"):
        tr.cannot_roll(r, state, ["release: release 0003 renders differently"])
    monkeypatch.setattr(tr, "host", SimpleNamespace(data={"allow_downtime": True}))
    assert tr.cannot_roll(r, state, ["x"]).startswith("what the serving set runs cannot be read back")


def test_a_restore_takes_the_stopped_surplus_out_of_the_gateway_at_once_and_moved_ones_at_the_end(monkeypatch):
    """After a failed larger set, sglang@2 is stopped and leaves the gateway before the roll (users
    routed there would get errors for the whole restore); a stray that still answers (a replica
    that moved and serves) stays until the restored replicas are back."""
    from dsv4deploy.gateway.model import Worker
    from dsv4deploy.host import rollback as rb

    t = Target.of(load_profile("nvfp4-ctx8k-dp2").data)
    listed = {"a": "http://127.0.0.1:30001", "b": "http://127.0.0.1:30002",
              "dead": "http://127.0.0.1:30003", "moved": "http://127.0.0.1:31001"}
    events: list[str] = []

    def http(method, url, headers, body, timeout):
        if url.endswith(":30003/health"):
            raise ConnectionRefusedError("Connection refused")
        return 200, b"{}"

    monkeypatch.setattr(rb, "unit_active", lambda h, unit: True)
    monkeypatch.setattr(rb, "stop_surplus", lambda h, t, log: ["sglang@2.service"])
    monkeypatch.setattr(rb, "roll", lambda h, t, indices, check, poll_s, log: events.append("roll"))
    monkeypatch.setattr(rb, "api", lambda h, t: (http, "", ""))
    monkeypatch.setattr(rb.gateway, "list_workers", lambda http_, endpoint, key: [
        Worker(id=i, url=u, status="ready", healthy=True, load=0) for i, u in listed.items()])
    monkeypatch.setattr(rb.gateway, "remove_worker", lambda http_, endpoint, key, wid: (events.append(f"remove {wid}"),
                                                                                          listed.pop(wid)))
    monkeypatch.setattr(rb, "gateway_stale", lambda h, t: False)
    rb.Rollback(Store(SimpleNamespace(name="fake")), poll_s=0.1).restore_set(t, None)
    assert events == ["remove dead", "roll", "remove moved"]


def test_the_read_compares_every_instance_with_the_release_and_the_plan_says_what_converges():
    """Issue 40, item 1: an instance of the template that runs but is not one of the release's
    replicas, and a replica whose process runs another argv than the release's (it started from
    other files, which no gate passed on it), each become a planned step with its reason. A
    replica with the release's argv is not stale even when its files changed since it started
    (a restore's copy touches them all); one whose argv cannot be read is judged by the times."""
    from dsv4deploy.host.replicas import instances_command
    from dsv4deploy.release.running_set import argv_sha256
    from dsv4deploy.host.state import HostState
    from dsv4deploy.release.rollout import rollout_for
    from dsv4deploy.tasks.plan import plan_lines
    from test_host_state import SIM

    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    assert "--timestamp=unix" in instances_command(r.target) and "/proc/$p/cmdline" in instances_command(r.target)
    same = [argv_sha256(rep.argv) for rep in r.rendered.replicas]
    values = {"files": {}, "unit": {"ActiveState": "active"},
              "releases": [{"release": 3, "status": "deployed", "profile": "nvfp4-ctx8k-dp2",
                            "manifest_sha256": r.manifest_sha256, "replicas": [{"index": 0}, {"index": 1}]}],
              "checkpoint": {"complete": True, "marker": True},
              "gateway_workers": [{"url": f"http://127.0.0.1:{p}", "status": "ready", "healthy": True}
                                  for p in (30001, 30002, 30003)],
              "instances": f"sglang@0.service active 1700000000 1700000100 {same[0]}\n"
                           f"sglang@1.service active 1700000000 1700000100 {'e' * 64}\n"
                           "sglang@2.service active 1700000000 - -\nsglang@3.service inactive 0 - -\n"}
    state = HostState(values=values)
    assert tr.surplus_units(r, state) == ["sglang@2.service"]
    assert [rt.index for rt in tr.stale_instances(r, state)] == [1]
    assert plan_lines(r, state, []) == [
        "nothing to change in release 0003 (nvfp4-ctx8k-dp2), but sglang@2.service runs and is not one of its 2 "
        "replicas: drain it from sglang-gateway.service, stop and disable it",
        "nothing to change in release 0003 (nvfp4-ctx8k-dp2), but replica 1 (sglang@1.service) runs other files "
        "than those in place (its process's argv is not the release's: no gate passed on it): out of the gateway, "
        "restart it, health, identity and a probe on its own port, back in"]
    values["instances"] = (f"sglang@0.service active 1700000100 1700000000 {same[0]}\n"
                           "sglang@1.service active 1700000000 1700000100 -\n")      # renamed: by the times
    assert [rt.index for rt in tr.stale_instances(r, HostState(values=values))] == [1]
    values["instances"] = (f"sglang@0.service active 1700000100 1700000000 {same[0]}\n"
                           f"sglang@1.service active 1700000100 1700000100 {same[1]}\n")
    assert plan_lines(r, HostState(values=values), [])[0].startswith("nothing to change: release 0003")


def test_a_shrink_plans_a_roll_then_the_surplus_replica_leaves():
    """count 3 -> 2: the plan promises the rolling update (no allow_downtime) and says that
    sglang@2, which runs and is not in the release, leaves after it, its GPUs checked free."""
    from dsv4deploy.host.state import HostState
    from dsv4deploy.release.rollout import rollout_for
    from dsv4deploy.tasks.plan import plan_lines
    from test_host_state import SIM

    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    values = {"files": {}, "unit": {"ActiveState": "active"},
              "releases": [{"release": 3, "status": "deployed", "profile": "nvfp4-ctx8k-dp2",
                            "manifest_sha256": "old", "replicas": [{"index": 0}, {"index": 1}, {"index": 2}]}],
              "checkpoint": {"complete": True, "marker": True},
              "instances": "sglang@0.service active 2 1\nsglang@1.service active 2 1\nsglang@2.service active 2 -\n"}
    lines = plan_lines(r, HostState(values=values), ["release: release 0003 renders differently"],
                       gateway_restart="its unit or launcher changes")
    roll = next(line for line in lines if line.startswith("rolling update"))
    assert ("add it back; the others serve throughout; then drain sglang@2.service from the gateway (this release "
            "does not run it), stop and disable it, its GPUs checked free; then restart sglang-gateway.service") in roll


def test_after_a_rollback_the_plan_still_promises_the_roll_the_run_makes():
    """A rollback's record has no replicas' parts; the set it restored serves behind its gateway
    all the same, and the run rolls it (Switch.run): the plan said 'start at once' instead."""
    from dsv4deploy.host.state import HostState
    from dsv4deploy.release.rollout import rollout_for
    from dsv4deploy.tasks.plan import plan_lines
    from test_host_state import SIM

    r = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
    values = {"files": {}, "unit": {"ActiveState": "active"}, "checkpoint": {"complete": True, "marker": True},
              "releases": [{"release": 4, "kind": "rollback", "restores": 2, "status": "deployed",
                            "profile": "nvfp4-ctx8k-dp2", "manifest_sha256": "old"}]}
    lines = plan_lines(r, HostState(values=values), ["release: release 0004 renders differently"])
    assert any(line.startswith("rolling update behind sglang-gateway.service") for line in lines), lines
