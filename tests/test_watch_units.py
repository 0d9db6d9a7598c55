"""The watch's files on the host (dsv4deploy/watch/units.py, tasks/watch.py) and its host
programs' pure parts: the sandbox the timer's service runs in, the settings it reads, the
requests the root side accepts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dsv4deploy.profile.load import load_profile
from dsv4deploy.render.layout import Layout
from dsv4deploy.tasks import watch as task
from dsv4deploy.watch import act, units

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
GATE = {"result": {"levels": [{"concurrency": 64, "tpot_ms": {"median": 90.0}},
                              {"concurrency": 1, "tpot_ms": {"median": 41.2}, "ttft_ms": {"median": 75.9},
                               "completed": 2, "num_prompts": 8}]}}


def rendered(name="nvfp4-ctx8k"):
    p = load_profile(name, PROFILES)
    return p, Layout.of(p.data)


def test_the_settings_carry_the_gate_figures_at_one_client_and_the_gpus():
    p, layout = rendered()
    doc = json.loads(units.config(p.data, layout, profile=p.name, release=7, gate_report=GATE,
                                  gpus=[{"index": 0, "uuid": "GPU-a", "pcie": [5, 16]}]))
    # the figures of a level that passed early: medians over 2 of its 8 requests, and it says so
    assert doc["baseline"] == {"tpot_ms": 41.2, "ttft_ms": 75.9, "requests": 2, "num_prompts": 8}
    assert doc["release"] == 7 and doc["targets"][0]["unit"] == "sglang.service"
    assert doc["targets"][0]["gpus"] == [0, 1, 2, 3] and doc["gateway"] is None
    assert units.baseline({"levels": [{"concurrency": 16}]}) is None


def test_a_replica_set_is_watched_replica_by_replica_and_the_gateway_is_known():
    p, layout = rendered("nvfp4-ctx8k-dp2")
    targets = units.targets(p.data, layout)
    assert [(t["name"], t["gpus"]) for t in targets] == [("replica-0", [0, 1, 2, 3]), ("replica-1", [4, 5, 6, 7])]
    assert units.gateway_url(p.data).startswith("http://127.0.0.1:")


def test_the_agent_runs_unprivileged_in_a_sandbox_and_the_timer_has_the_interval():
    p, layout = rendered()
    files = units.units(p.data, layout)
    agent = files["/etc/systemd/system/dsv4-watch.service"]
    assert "User=dsv4-watch" in agent and "ProtectSystem=strict" in agent and "CapabilityBoundingSet=\n" in agent
    assert "LoadCredential=api_key:" in agent        # the probe's key, never in argv or the settings
    assert "OnUnitActiveSec=60" in files["/etc/systemd/system/dsv4-watch.timer"]
    assert "DirectoryNotEmpty=/var/lib/dsv4-watch/requests" in files["/etc/systemd/system/dsv4-watch-act.path"]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_the_agent_unit_scores_at_most_2_0_in_systemd_analyze_security(tmp_path):
    p, layout = rendered()
    unit = tmp_path / "dsv4-watch.service"
    unit.write_text(units.units(p.data, layout)["/etc/systemd/system/dsv4-watch.service"])
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True,
                         text=True).stdout
    score = float(out.rsplit("exposure level for dsv4-watch.service:", 1)[1].split()[0])
    assert score <= 2.0, out[-2000:]


def test_the_root_side_accepts_only_known_actions_for_this_release(tmp_path):
    cfg = {"release": 3, "targets": [{"name": "server"}]}
    good = tmp_path / "1-server.json"
    good.write_text(json.dumps({"action": "restart", "target": "server", "release": 3, "reason": "x"}))
    assert act.checked(cfg, str(good))["action"] == "restart"
    for bad in ({"action": "rm -rf /", "target": "server", "release": 3}, {"action": "restart", "target": "x", "release": 3},
                {"action": "restart", "target": "server", "release": 2}, ["restart"]):
        good.write_text(json.dumps(bad))
        assert act.checked(cfg, str(good)) is None, bad
    link = tmp_path / "2-server.json"
    link.symlink_to(tmp_path / "1-server.json")
    assert act.checked(cfg, str(link)) is None          # never followed through a link


def test_the_plan_line_and_the_gpus_the_deploy_records():
    p, _ = rendered()
    assert task.settings_line(p.data).startswith("watch: every 60 s, acts after 3 failed intervals")
    assert task.parse_gpus("0, GPU-a, 5, 16\n1, GPU-b, 5, 8\n7, GPU-h, 5, 16\n", {0, 1}) == [
        {"index": 0, "uuid": "GPU-a", "pcie": [5, 16]}, {"index": 1, "uuid": "GPU-b", "pcie": [5, 8]}]


def test_a_fatal_xid_stays_with_its_gpu_after_the_interval_that_logged_it():
    agent = units.HERE / "agent.py"
    import importlib.util
    spec = importlib.util.spec_from_file_location("watch_agent", agent)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    state = {}
    first = [{"index": 1, "xid": [79, 13]}]
    mod.remember_fatal(state, first, frozenset({79}))
    later = [{"index": 1, "xid": []}]
    mod.remember_fatal(state, later, frozenset({79}))
    assert first[0]["xid"] == [13, 79] and later[0]["xid"] == [79] and later[0]["xid_new"] == 0


def test_readmit_gives_the_gateway_the_replicas_key_in_the_body(monkeypatch):
    """smg registers a worker added without `api_key` in its body as keyless: every request it
    then routes to a keyed replica fails 401. The watch's readmit carries it, as the deploy does."""
    calls = []

    def http(method, url, body=None, timeout=10.0, key="key"):
        calls.append((method, url, body, key))
        return (200, b'{"workers": []}') if method == "GET" else (202, b"{}")

    monkeypatch.setattr(act, "http", http)
    monkeypatch.setattr(act, "KEY", {"key": "inference-secret", "control": "control-secret"})
    act.readmit({"gateway": "http://127.0.0.1:30000"}, {"url": "http://127.0.0.1:30001"})
    post = [c for c in calls if c[0] == "POST"]
    assert post == [("POST", "http://127.0.0.1:30000/workers",
                     {"url": "http://127.0.0.1:30001", "api_key": "inference-secret"}, "control")]
    monkeypatch.setattr(act, "KEY", {})
    calls.clear()
    act.readmit({"gateway": "http://127.0.0.1:30000"}, {"url": "http://127.0.0.1:30001"})
    assert [c[2] for c in calls if c[0] == "POST"] == [{"url": "http://127.0.0.1:30001"}]


def test_users_who_come_and_go_while_the_probe_runs_make_its_speed_not_comparable():
    import importlib.util
    spec = importlib.util.spec_from_file_location("watch_agent", units.HERE / "agent.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    idle = {"num_running_reqs": 0.0, "num_queue_reqs": 0.0, "num_requests_total": 100.0}
    # the probe's own 2 requests alone: an idle server, the probe's speed compares with the gate
    assert mod.users_around(idle, dict(idle, num_requests_total=102.0), 2) == 0
    # idle when it began; users arrived meanwhile: 3 of theirs finished, 1 still running at its end
    assert mod.users_around(idle, dict(idle, num_running_reqs=1.0, num_requests_total=105.0), 2) == 4
    assert mod.users_around(dict(idle, num_queue_reqs=2.0), idle | {"num_requests_total": 102.0}, 2) == 2
    assert mod.users_around(idle, None, 2) is None
