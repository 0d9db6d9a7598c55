"""The watch end to end on an isolated twin (fleet `watch`): one deploy of nvfp4-ctx8k with the
watch every 3 s, then each twin fault switched on under the running server (ct200twin/host/sick.py)
and what the watch decided read back from the host: the action in the release's
watch-events.jsonl, and `dsv4deploy status`'s exit code. bench/watch.py runs the full matrix and
times it; here each fault must reach its decision."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ct200twin.host import sick
from sim_fixtures import _isolated_twin

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

ROOT = Path(__file__).resolve().parent.parent
FLEET = os.environ.get("DSV4_SIM_WATCH_FLEET", "watch")
ENV = {"DSV4_SIM_FLEET": FLEET, "DSV4_SIM_LAUNCH_CHECK": "twin"}
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    gen = _isolated_twin(FLEET)
    twin = next(gen)
    profiles = tmp_path_factory.mktemp("profiles")
    subprocess.run([sys.executable, "bench/watch.py", "--profiles-dir", str(profiles)], cwd=ROOT, check=True)
    env = {**os.environ, **ENV, "DSV4_PROFILES_DIR": str(profiles)}
    run = subprocess.run([str(BIN / "pyinfra"), "-y", "inventory/fleet-sim.py", "deploy/serve.py", "--data",
                          "profile=nvfp4-ctx8k-watch", "--data", "allow_downtime=true"],   # from any shape
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "watch: every 3 s, acts after 3 failed intervals" in run.stdout
    yield twin
    sick.heal(twin)
    next(gen, None)


def _json(line: str) -> dict:
    try:
        return json.loads(line)
    except ValueError:          # a line the watch is appending right now
        return {}


def status(json_out: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dsv4deploy"), "status", "--inventory", "inventory/fleet-sim.py",
                           *(["--json"] if json_out else [])], cwd=ROOT, env={**os.environ, **ENV},
                          capture_output=True, text=True, timeout=120)


def fresh(twin) -> float:
    """A healthy start: every sickness off, the watch's counts forgotten, one interval passed (the
    first one at once, not an interval after the timer's start)."""
    sick.heal(twin)
    twin.run("systemctl stop dsv4-watch.timer dsv4-watch.service; rm -f /var/lib/dsv4-watch/state.json "
             "/var/lib/dsv4-watch/requests/*; systemctl is-active -q sglang || { systemctl reset-failed sglang; "
             "systemctl restart sglang; }; systemctl start --no-block dsv4-watch.service; "
             "systemctl start dsv4-watch.timer")
    end = time.time() + 60
    while time.time() < end:
        hist = history(twin)
        if hist and hist[-1]["verdict"] == "passed":
            return time.time()
        time.sleep(0.5)
    raise AssertionError("the watch passed no interval within 60 s of a healthy start")


def history(twin) -> list[dict]:
    """The server's last intervals as the watch judged them (its state file, read from the twin's
    root here: a poll costs no ssh)."""
    try:
        doc = json.loads((twin.root / "var/lib/dsv4-watch/state.json").read_text())
    except (OSError, ValueError):
        return []
    return (doc.get("targets") or {}).get("server", {}).get("history") or []


def first_action(twin, since: float, within: float = 30) -> dict | None:
    """The watch's first action recorded in a release's watch-events.jsonl since SINCE."""
    end = time.time() + within
    while True:
        lines = [line for f in sorted((twin.root / "var/lib/dsv4deploy/releases").glob("*/watch-events.jsonl"))
                 for line in f.read_text().splitlines() if line.strip()]
        got = [e for e in map(_json, lines) if (e.get("decided_at") or 0) >= since]
        if got or time.time() >= end:
            return got[0] if got else None
        time.sleep(0.5)


def test_after_a_deploy_status_shows_the_release_healthy_with_its_watch_results(watched):
    fresh(watched)
    out = status()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "HEALTHY - release" in out.stdout and "(nvfp4-ctx8k-watch)" in out.stdout
    assert "watch server: passed (TTFT" in out.stdout and "drift: none" in out.stdout
    doc = json.loads(status(json_out=True).stdout)
    assert doc["health"] == "healthy" and doc["hosts"][0]["gpus"]["count"] == 4
    # the metrics, where node_exporter's textfile collector reads them: a link the deploy made in
    # its folder (root's) to the file the watch writes in its own
    link = watched.root / "var/lib/prometheus/node-exporter/dsv4deploy_watch.prom"
    assert os.readlink(link) == "/var/lib/dsv4-watch/dsv4deploy_watch.prom"
    prom = (watched.root / os.readlink(link).lstrip("/")).read_text()
    assert re.search(r'^dsv4_watch_up\{release="\d{4}",profile="nvfp4-ctx8k-watch"\} 1$', prom, re.M), prom


@pytest.mark.parametrize("fault", ["slowdown", "hang", "errors"])
def test_a_regression_with_healthy_gpus_restarts_the_release(watched, fault):
    t0 = fresh(watched)
    sick.server(watched, **{"slowdown": {"slowdown": 1.67}, "hang": {"hang": True},
                            "errors": {"errors_after_s": 1}}[fault])
    act = first_action(watched, t0)
    sick.heal(watched)
    assert act and act["action"] == "restart", act
    assert act["done"].startswith("restarted sglang.service") and len(act["evidence"]) == 3
    assert "regression with healthy GPUs" in act["reason"]


# Two batches of GPU faults, each on other GPUs of the release at once: one decision names them all
# (a test each would cost the suite about ten seconds per fault)
GPU_FAULTS = {
    "kernel log and memory": ((lambda t: sick.xid(t, 1, 79), "GPU 1 XID 79 in the kernel log"),
                              (lambda t: sick.gpu(t, 2, ecc_uncorrectable=2), "GPU 2 2 uncorrectable ECC errors"),
                              (lambda t: sick.gpu(t, 0, remap_pending=True), "GPU 0 row remap pending"),
                              (lambda t: sick.gpu(t, 3, clock_events=["hw_thermal_slowdown"]),
                               "GPU 3 clock events: hw_thermal_slowdown")),
    "link, gone, foreign": ((lambda t: sick.gpu(t, 1, pcie_width=8), "GPU 1 PCIe gen5 x8, recorded at deploy gen5 x16"),
                            (lambda t: sick.gpu(t, 2, gone=True), "GPU 2 is gone"),
                            (lambda t: sick.foreign(t, 0, 20000), "GPU 0 20000 MiB held by a process")),
}


@pytest.mark.parametrize("batch", list(GPU_FAULTS))
def test_gpu_faults_mark_the_release_degraded_and_never_restart_it(watched, batch):
    t0 = fresh(watched)
    for inject, _ in GPU_FAULTS[batch]:
        inject(watched)
    act = first_action(watched, t0)
    try:
        assert act and act["action"] == "degraded", act
        assert "hardware fault, no config rollback: GPU" in act["reason"]
        said = " ".join(r for e in act["evidence"] for r in e["reasons"])
        for _, phrase in GPU_FAULTS[batch]:
            assert phrase in said, (phrase, said)
        out = status()
        assert out.returncode == 1 and "DEGRADED" in out.stdout, out.stdout
    finally:
        sick.heal(watched)


def test_nothing_is_done_while_a_deploy_holds_the_lock(watched):
    t0 = fresh(watched)
    lock = "/var/lib/dsv4deploy/deploy.lock"
    watched.run(f"mkdir {lock} && echo '{{\"what\": \"test: a deploy\"}}' > {lock}/owner.json")
    try:
        sick.server(watched, slowdown=1.67)
        # one interval more than the failure limit, each judged while the lock was held: without
        # the lock the slowdown would have been acted on by then
        end, paused = time.time() + 30, []
        while len(paused) <= 3 and time.time() < end:
            time.sleep(1)
            paused = [h for h in history(watched) if h["t"] > t0 and h["cause"] == "paused"]
        assert len(paused) > 3, history(watched)
        assert first_action(watched, t0, within=0) is None
    finally:
        watched.run(f"rm -rf {lock}")
        sick.heal(watched)
