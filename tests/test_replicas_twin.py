"""Replicas on the CT200 twin (issue 13): two twin servers as sglang@0 and sglang@1 behind the
real smg gateway, deployed, re-run, rolled one replica at a time under load, and a replica whose
new release fails its gate restored while the other keeps serving.

The twin is an isolated one (`sim up --fleet lab`, shared with the fault matrix's tests: its own
network namespace, docs/fleet.md), so these tests run beside the default twin's in their own
pytest process (marker `fleet`). The load
runs on this machine inside that namespace (`ip netns exec`), against the twin's loopback. The
profiles are nvfp4-ctx8k-dp2 with a short gate, on non-default ports (31000 for the gateway,
31001-31002 for the replicas, 31009 for its metrics).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time

import pytest

from ct200twin import faultlab
from ct200twin.faultlab.tool import run as tool_run
from ct200twin.host.errors import SimError
from sim_fixtures import LAB_ENV, LAB_FLEET, lab_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

INVENTORY = "inventory/fleet-sim.py"
GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 16, num_prompts: 16, input_len: 128, output_len: 16, min_output_throughput: 50}
"""
PORTS = """server:
  port: 31000
  context_length: %d
replicas:
  base_port: 31001
  gateway:
    metrics_port: 31009
"""
BASE, CHANGED, BROKEN = "rset-a", "rset-b", "rset-broken"
PROFILES = {name: f"extends: nvfp4-ctx8k-dp2\n{PORTS % ctx}{GATE}"
            for name, ctx in ((BASE, 8192), (CHANGED, 7168), (BROKEN, 6144))}
ONE = "rset-one"           # the set shrunk to one replica (a change that cannot roll)
PROFILES[ONE] = (f"extends: nvfp4-ctx8k-dp2\n{PORTS % 8192}  count: 1\n  gpus:\n    - [0, 1, 2, 3]\n{GATE}")
GATEWAY = "http://127.0.0.1:31000"
UNITS = ("sglang@0.service", "sglang@1.service", "sglang-gateway.service")


@pytest.fixture(scope="module")
def rset(lab_twin, tmp_path_factory):  # noqa: F811
    profiles = faultlab.write_profiles(tmp_path_factory.mktemp("profiles"), PROFILES)
    lab = faultlab.Lab(lab_twin, profiles, baseline=BASE, inventory=INVENTORY, env=LAB_ENV)
    lab.reset_host()
    # the single server of the fault matrix's tests (same twin) gives the GPUs back
    lab_twin.run("systemctl disable --now sglang.service 2>/dev/null; true", check=False)
    yield lab
    lab_twin.run(f"systemctl disable --now {' '.join(UNITS)} 2>/dev/null; rm -f {faultlab.FAULTS}; true",
                 check=False)


def pids(twin) -> dict[str, int]:
    out = twin.run(f"for u in {' '.join(UNITS)}; do systemctl show -p MainPID --value $u; done").stdout.split()
    return dict(zip(UNITS, map(int, out)))


def workers(twin) -> list[tuple[str, str]]:
    # smg's /workers takes the gateway's control-plane key, not the inference key
    out = twin.run("sed 's/^/Authorization: Bearer /' /etc/dsv4deploy/secrets/sglang-gateway-control-key | "
                   f"curl -s -H @- {GATEWAY}/workers").stdout
    return sorted((w["url"], w["status"]) for w in json.loads(out)["workers"])


def argv_context(twin, unit: str) -> int:
    argv = twin.run(f"tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value {unit})/cmdline").stdout.split()
    return int(argv[argv.index("--context-length") + 1])


class Load:
    """ct200twin.host.load inside the twin's network namespace: streaming requests on the gateway
    until stop(), then its figures (sent, completed, failed, errors)."""

    def __init__(self, twin):
        key = twin.run("cat /etc/dsv4deploy/secrets/sglang-api-key").stdout.strip()
        python = str(faultlab.REPO / ".venv" / "bin" / "python")
        self.p = subprocess.Popen(["ip", "netns", "exec", twin.net()["netns"], python, "-m", "ct200twin.host.load",
                                   "--url", GATEWAY, "--concurrency", "8", "--input-len", "64", "--output-len", "64",
                                   "--stagger-s", "2", "--key-stdin"], cwd=faultlab.REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.p.stdin.write(key + "\n")
        self.p.stdin.close()
        assert self.p.stdout.readline().strip() == "started"

    def stop(self) -> dict:
        self.p.send_signal(signal.SIGTERM)
        out = self.p.stdout.read()
        self.p.wait(timeout=300)
        return json.loads(out.strip().splitlines()[-1])


def test_a_replica_set_serves_through_the_gateway_and_a_rerun_changes_nothing(rset):
    first = rset.deploy(BASE)
    assert first.rc == 0, first.output[-4000:]
    assert "gateway sglang-gateway.service routes to 2 replicas" in first.output
    assert workers(rset.twin) == [("http://127.0.0.1:31001", "ready"), ("http://127.0.0.1:31002", "ready")]
    rec = faultlab.releases(rset.twin)[-1]
    assert rec["status"] == "deployed" and rec["gate"]["passed"]
    assert [(r["index"], r["status"]) for r in rec["replicas"]] == [(0, "switched"), (1, "switched")]
    # the gate through the gateway: which replica served it, by the replicas' own counters
    # (16 prompts + 1 warm-up; nothing else reaches the set meanwhile) and smg's routing header
    assert "requests per replica: 0: " in first.output and "C=16: routed" in first.output, first.output[-3000:]
    assert len(rec["gate"]["split"]) == 2 and sum(rec["gate"]["split"]) == 17, rec["gate"]
    assert 0.5 <= rec["gate"]["busiest_share"] <= 1.0
    before = pids(rset.twin)
    again = rset.deploy(BASE)
    assert again.rc == 0 and faultlab.changed_ops(again.output) == [], again.output[-3000:]
    assert "nothing to change" in again.output and pids(rset.twin) == before


def test_a_rolling_update_drops_no_request_and_a_failing_replica_is_restored(rset):
    twin = rset.twin
    if faultlab.releases(twin)[-1]["profile"] != BASE:
        assert rset.deploy(BASE).rc == 0
    before = pids(twin)
    # the broken release fails its gate (20% errors, on the new argv only) on replica 0
    rset.faults(error_rate=0.2, match_argv="--context-length 6144")
    load = Load(twin)
    broken = rset.deploy(BROKEN)
    res = load.stop()
    assert broken.rc != 0
    assert "failed the smoke gate" in broken.output or "smoke gate failed" in broken.output, broken.output[-4000:]
    recs = faultlab.releases(twin)
    failed, restore = recs[-2], recs[-1]
    assert failed["profile"] == BROKEN and failed["status"] == "failed"
    assert [(r["index"], r["status"]) for r in failed["replicas"]] == [(0, "failed"), (1, "untouched")]
    assert restore["kind"] == "rollback" and restore["status"] == "deployed" and restore["profile"] == BASE
    now = pids(twin)
    assert now["sglang@1.service"] == before["sglang@1.service"]          # replica 1 was never touched
    assert now["sglang-gateway.service"] == before["sglang-gateway.service"]
    assert argv_context(twin, "sglang@0.service") == 8192               # replica 0 runs the old release again
    assert workers(twin) == [("http://127.0.0.1:31001", "ready"), ("http://127.0.0.1:31002", "ready")]
    assert res["failed"] == 0 and res["completed"] > 0, res["errors"][:5]

    # a good change rolls across both replicas under the same load, the gateway never restarts
    rset.faults()
    load = Load(twin)
    good = rset.deploy(CHANGED)
    res = load.stop()
    assert good.rc == 0, good.output[-4000:]
    assert res["failed"] == 0 and res["completed"] > 0, res["errors"][:5]
    assert [argv_context(twin, u) for u in UNITS[:2]] == [7168, 7168]
    assert pids(twin)["sglang-gateway.service"] == before["sglang-gateway.service"]
    rec = faultlab.releases(twin)[-1]
    assert rec["profile"] == CHANGED and [r["status"] for r in rec["replicas"]] == ["switched", "switched"]
    assert all(r["gate"]["passed"] for r in rec["replicas"])
    # after the roll the set is probed through the gateway, not loaded by a second gate (users are
    # there); the release's gate is the weakest replica's own
    assert "4/4 probe requests through http://127.0.0.1:31000 answered" in good.output, good.output[-3000:]
    assert "requests per replica" not in good.output.split("replica 1 (sglang@1.service) switched")[-1]
    weakest = min(r["gate"]["output_throughput"] for r in rec["replicas"])
    assert rec["gate"]["passed"] and rec["gate"]["output_throughput"] == weakest
    assert rec["gate"]["through_gateway"].startswith("4/4 probe requests") and "split" not in rec["gate"]


def test_fault_14_a_killed_gateway_comes_back_and_a_replica_killed_mid_update_does_not_stop_the_roll(rset):
    """Fault 14 of the matrix (bench/faults.py runs it on the shipped ports): the gateway SIGKILLed
    by its PID while the set serves is restarted by systemd and routes to both replicas again, and
    the same deploy then changes nothing; replica 1 SIGKILLed while replica 0 is in its rolling
    step is restarted by systemd and the roll still ends with the new release on both."""
    twin = rset.twin
    current = faultlab.releases(twin)[-1]["profile"]
    gw = pids(twin)["sglang-gateway.service"]
    twin.run(f"kill -KILL {gw}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = pids(twin)["sglang-gateway.service"]
        # systemd has started a new gateway: until it listens, its port refuses (curl exits 7)
        with contextlib.suppress(SimError):
            if now not in (0, gw) and _routes(twin) == 2:
                break
        time.sleep(0.5)
    assert _routes(twin) == 2 and pids(twin)["sglang-gateway.service"] not in (0, gw)
    again = rset.deploy(current)
    assert again.rc == 0 and faultlab.changed_ops(again.output) == [], again.output[-3000:]

    target = BASE if current != BASE else CHANGED
    killed = {}

    def strike(line: str) -> None:
        if "replica 0 (sglang@0.service) drained" in line and not killed:
            killed["pid"] = pids(twin)["sglang@1.service"]
            twin.run(f"kill -KILL {killed['pid']}")

    run = faultlab.deploy_watching(target, strike, profiles_dir=rset.profiles, inventory=INVENTORY, env=rset.env)
    assert killed and run.rc == 0, run.output[-4000:]
    rec = faultlab.releases(twin)[-1]
    assert rec["profile"] == target and rec["status"] == "deployed"
    assert [r["status"] for r in rec["replicas"]] == ["switched", "switched"]
    assert pids(twin)["sglang@1.service"] != killed["pid"] and _routes(twin) == 2


def _routes(twin) -> int:
    return sum(status == "ready" for _, status in workers(twin))


def test_a_gateway_left_on_older_files_by_a_cut_off_run_is_restarted_alone_by_the_next(rset):
    """A run cut off between writing the gateway's files and restarting it leaves smg running the
    old ones: the started-marker (its MainPID, its files' sha256) says so here as it would then;
    the next run, with nothing else to change, restarts the gateway alone, the replicas untouched,
    and the run after it changes nothing."""
    twin = rset.twin
    current = faultlab.releases(twin)[-1]["profile"]
    before = pids(twin)
    marker = "/run/dsv4deploy/sglang-gateway.service.started"
    # (a gateway systemd restarted since, as fault 14's, is another PID than its marker's: not stale)
    twin.run(f"echo {before['sglang-gateway.service']} {'0' * 64} > {marker}")
    run = rset.deploy(current)
    assert run.rc == 0, run.output[-4000:]
    assert "but sglang-gateway.service runs older gateway files than those in place: restart it alone" in run.output
    assert "restarted sglang-gateway.service (runs older gateway files than those in place); 2/2 probe requests" \
        in run.output, run.output[-3000:]
    now = pids(twin)
    assert now["sglang-gateway.service"] != before["sglang-gateway.service"]
    assert [now[u] for u in UNITS[:2]] == [before[u] for u in UNITS[:2]] and _routes(twin) == 2
    assert twin.run(f"cat {marker}").stdout.split()[0] == str(now["sglang-gateway.service"])
    again = rset.deploy(current)
    assert again.rc == 0 and faultlab.changed_ops(again.output) == [], again.output[-3000:]


def test_a_set_that_shrinks_rolls_and_stops_the_replica_it_no_longer_runs(rset):
    """count 2 -> 1 keeps replica 0 as it was: the set rolls (no allow_downtime needed), then
    sglang@1, which the release does not run, is drained from the gateway, stopped and disabled
    through systemctl, its GPUs checked free (left running it held them and its port, and started
    at boot); the gateway restarts on its one worker. Back to two adds a replica: not one at a
    time, so it needs allow_downtime."""
    twin = rset.twin
    if faultlab.releases(twin)[-1]["profile"] != BASE:
        assert rset.deploy(BASE).rc == 0
    before = pids(twin)
    one = rset.deploy(ONE)
    assert one.rc == 0, one.output[-4000:]
    assert "rolling update of 1 replicas" in one.output, one.output[-3000:]
    assert "stopped sglang@1.service: not in the new release's set; GPUs 4,5,6,7 free" in one.output
    state = twin.run("systemctl is-active sglang@1.service; systemctl is-enabled sglang@1.service", check=False)
    assert state.stdout.split() == ["inactive", "disabled"]
    assert workers(twin) == [("http://127.0.0.1:31001", "ready")]
    assert pids(twin)["sglang-gateway.service"] != before["sglang-gateway.service"]
    refused = rset.deploy(BASE)
    assert refused.rc != 0 and "cannot replace it one replica at a time" in refused.output, refused.output[-3000:]
    downtime = ("--data", "allow_downtime=true")
    back = faultlab.deploy(BASE, *downtime, profiles_dir=rset.profiles, inventory=INVENTORY, env=rset.env)
    assert back.returncode == 0, (back.stdout + back.stderr)[-4000:]
    assert _routes(twin) == 2


def gpu_memory(twin) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    """Each GPU's memory.used and its compute apps (pid, MiB), as the twin's nvidia-smi says."""
    out = twin.run("for i in 0 1 2 3 4 5 6 7; do echo \"$i|$(nvidia-smi -i $i --query-gpu=memory.used "
                   "--format=csv,noheader,nounits)|$(nvidia-smi -i $i --query-compute-apps=pid,used_memory "
                   "--format=csv,noheader,nounits | tr '\\n' ';')\"; done").stdout
    found = {}
    for line in out.splitlines():
        index, used, apps = line.split("|")
        found[int(index)] = (int(used), [tuple(map(int, a.split(", "))) for a in apps.split(";") if a])
    return found


def watch_once(twin) -> list[dict]:
    """One interval of the release's watch, now; the GPUs as it read them."""
    twin.run("systemctl start dsv4-watch.service", timeout=300)
    return json.loads(twin.read_file("/var/lib/dsv4-watch/state.json"))["last_reading"]["gpus"]


def host_status(lab) -> dict:
    out = tool_run([str(faultlab.REPO / ".venv/bin/dsv4deploy"), "status", "--inventory", INVENTORY,
                             "--json"], env=lab.env, timeout=120)
    return json.loads(out.stdout)["hosts"][0]


def test_the_gpus_show_what_each_replica_holds_and_a_process_left_on_them_fails_the_shrink(rset):
    """The twin's nvidia-smi reports what each replica's server holds (its memory model) by PID, and
    the watch takes them for the release's own. A process that is none of the release's, left on
    replica 1's GPUs: the watch and `dsv4deploy status` name it, and the shrink to one replica, which
    checks replica 1's GPUs free once it is stopped, fails there and restores the set of two."""
    from ct200twin.host import sick

    twin = rset.twin
    if [r["profile"] for r in faultlab.releases(twin)[-1:]] != [BASE] or 0 in pids(twin).values():
        first = rset.deploy(BASE)
        assert first.rc == 0, first.output[-3000:]
    owner = pids(twin)
    mem = gpu_memory(twin)
    held = mem[0][0]
    assert held > 60000, mem          # TP4 at 0.70: its static share, the CUDA context, the decode graphs
    for i in range(8):
        pid = owner["sglang@0.service" if i < 4 else "sglang@1.service"]
        assert mem[i] == (held, [(pid, held)]), mem
    assert all(g["foreign_mib"] == 0 for g in watch_once(twin))
    leak = sick.hold(twin, [4, 5, 6, 7], 4000)     # what is left free beside a replica: a few GiB
    try:
        assert gpu_memory(twin)[4] == (held + 4000, [(owner["sglang@1.service"], held), (leak, 4000)])
        assert {g["index"]: g["foreign_mib"] for g in watch_once(twin)} == {**{i: 0 for i in range(4)},
                                                                            **{i: 4000 for i in range(4, 8)}}
        status = host_status(rset)
        assert "GPU 4 4000 MiB held by a process that is not the release's" in status["gpus"]["faults"], status
        assert status["set"]["replicas"][1]["gpu_mib"] == [held + 4000] * 4
        shrink = rset.deploy(ONE)
        assert shrink.rc != 0, shrink.output[-3000:]
        assert "its GPUs are not free after the stop: GPU 4: 4000 MiB in use; GPU 5: 4000 MiB in use" \
            in shrink.output, shrink.output[-3000:]
    finally:
        twin.run(f"systemctl stop {sick.HOLD_UNIT}-4-5-6-7", check=False)
    assert _routes(twin) == 2 and faultlab.releases(twin)[-1]["profile"] == BASE
    again = gpu_memory(twin)
    assert again[4] == (held, [(pids(twin)["sglang@1.service"], held)]), again
