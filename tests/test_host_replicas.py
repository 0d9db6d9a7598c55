"""The rolling step on a fake host and a fake gateway: the order an operator relies on (out of the
gateway and idle before the restart, back in only after health, identity and the check), and a
failure that stops the roll with the replicas already switched named."""

from __future__ import annotations

import json
import re

import pytest

from dsv4deploy.sglang.health import HealthError
from dsv4deploy.host import replicas as hr
from checkout import load_profile
from dsv4deploy.release.rollout import Target
from dsv4deploy.release.running_set import argv_sha256


class FakeHost:
    """Records every shell command and gateway call in one event list."""

    name = "fake"

    def __init__(self):
        self.events: list[str] = []
        self.workers = {"w0": "http://127.0.0.1:30001", "w1": "http://127.0.0.1:30002"}
        self.draining: dict[str, int] = {}     # worker url -> polls of /metrics until idle
        self.active = {"sglang-gateway.service": True}
        self.n = 2

    def sh(self, h, command, timeout=None):
        if command.startswith("systemctl is-active"):
            unit = command.split()[-1]
            return self.active.get(unit, False), ""
        self.events.append(f"sh {command.split('systemctl ')[-1]}")
        return True, ""

    def http(self, method, url, headers, body, timeout):
        path = re.sub(r"^http://[^/]+", "", url)
        if path == "/workers" and method == "GET":
            doc = {"workers": [{"id": i, "url": u, "status": "ready", "is_healthy": True} for i, u in self.workers.items()]}
            return 200, json.dumps(doc).encode()
        if path.startswith("/workers/") and method == "DELETE":
            url_gone = self.workers.pop(path.rsplit("/", 1)[1])
            self.events.append(f"remove {url_gone}")
            return 202, json.dumps({"status": "accepted", "worker_id": "x1"}).encode()
        if path == "/workers" and method == "POST":
            spec = json.loads(body)
            self.n += 1
            self.workers[f"w{self.n}"] = spec["url"]
            self.events.append(f"add {spec['url']}")
            return 202, json.dumps({"status": "accepted", "worker_id": f"w{self.n}"}).encode()
        if path == "/metrics":
            left = self.draining.get(url, 0)
            self.draining[url] = max(0, left - 1)
            self.events.append(f"metrics {url.split(':')[-1].split('/')[0]} in flight {left}")
            return 200, f"sglang:num_running_reqs {left}\nsglang:num_queue_reqs 0\n".encode()
        raise AssertionError(f"unexpected {method} {url}")


@pytest.fixture()
def fake(monkeypatch):
    f = FakeHost()
    monkeypatch.setattr(hr, "sh", f.sh)
    monkeypatch.setattr(hr, "host_http", lambda h, key_file: f.http)
    monkeypatch.setattr(hr, "confirm", lambda h, t, budget_s, poll_s: f.events.append(f"healthy {t.unit}"))
    monkeypatch.setattr(hr, "journal_tail", lambda h, t: "(journal)")
    monkeypatch.setattr(hr.gateway.time, "sleep", lambda s: None)
    return f


def target() -> Target:
    return Target.of(load_profile("nvfp4-ctx8k-dp2").data)


def test_each_replica_leaves_the_gateway_goes_idle_restarts_passes_and_comes_back(fake):
    fake.draining["http://127.0.0.1:30001/metrics"] = 2       # two requests still running on replica 0
    checked = []
    steps = hr.roll(fake, target(), [0, 1], lambda rt: (checked.append(rt.unit), fake.events.append(f"gate {rt.unit}")),
                    poll_s=0, log=lambda m: None)
    assert [s.status for s in steps] == ["switched", "switched"]
    e = fake.events
    r0 = e[:e.index("add http://127.0.0.1:30001") + 1]
    assert r0[:4] == ["remove http://127.0.0.1:30001", "metrics 30001 in flight 2", "metrics 30001 in flight 1",
                      "metrics 30001 in flight 0"]                  # restarted only once idle
    assert r0[4].startswith("sh ") and r0[4].endswith("restart sglang@0.service")
    assert r0[5:] == ["healthy sglang@0.service", "gate sglang@0.service", "add http://127.0.0.1:30001"]
    # replica 1 is touched only once replica 0 is back
    assert e.index("remove http://127.0.0.1:30002") > e.index("add http://127.0.0.1:30001")
    assert checked == ["sglang@0.service", "sglang@1.service"]


def test_a_failed_check_stops_the_roll_and_names_what_was_switched(fake):
    def gate(rt):
        if rt.index == 1:
            raise HealthError("smoke gate failed: C=64 12.0 tok/s < 400")

    with pytest.raises(hr.ReplicaFailed) as err:
        hr.roll(fake, target(), [0, 1], gate, poll_s=0, log=lambda m: None)
    assert err.value.index == 1 and err.value.done == [0]
    assert "replica 1 (sglang@1.service): smoke gate failed" in str(err.value)
    # the failed replica is not put back into the gateway: users never reach the release that failed
    assert "add http://127.0.0.1:30002" not in fake.events and "add http://127.0.0.1:30001" in fake.events


def test_a_replica_the_gateway_does_not_list_is_restarted_without_a_drain(fake):
    del fake.workers["w0"]                         # e.g. it crashed and smg dropped it, or a failed run left it out
    hr.roll(fake, target(), [0], lambda rt: None, poll_s=0, log=lambda m: None)
    assert not any(e.startswith("metrics") or e.startswith("remove") for e in fake.events)
    assert fake.events[-1] == "add http://127.0.0.1:30001"


def test_a_replica_ahead_that_restarted_during_the_roll_leaves_the_gateway_until_its_turn(fake, monkeypatch):
    """Replica 1, not reached yet, crashed and systemd started it from the files the roll already
    wrote, which no gate passed on it: it leaves the gateway before replica 0's step (not at its
    own turn, users would reach it meanwhile), and comes back only after its own check."""
    plain = fake.sh

    def sh(h, command, timeout=None):
        if command.startswith("systemctl show -p MainPID --value"):
            fake.events.append(f"pids {command.split()[-1]}")
            return True, "4343\n"          # not the 4242 the host's read saw
        return plain(h, command, timeout)

    monkeypatch.setattr(hr, "sh", sh)
    said = []
    steps = [hr.Step(0, "sglang@0", pid_before=4141), hr.Step(1, "sglang@1", pid_before=4242)]
    hr.roll(fake, target(), [0, 1], lambda rt: fake.events.append(f"gate {rt.unit}"), poll_s=0, log=said.append,
            steps=steps)
    e = fake.events
    assert e[:2] == ["pids sglang@1.service", "remove http://127.0.0.1:30002"]
    assert e.index("remove http://127.0.0.1:30002") < e.index("remove http://127.0.0.1:30001")
    assert e[-3:] == ["healthy sglang@1.service", "gate sglang@1.service", "add http://127.0.0.1:30002"]
    assert any("replica 1 (sglang@1.service) taken out of sglang-gateway.service: it restarted" in m for m in said)


@pytest.mark.parametrize("smi, held", [("4, 3\n5, 0\n", None), ("4, 30211\n5, 0\n", "GPU 4: 30211 MiB in use")])
def test_a_surplus_replica_is_drained_then_stopped_and_its_gpus_checked_free(fake, monkeypatch, smi, held):
    """count shrank: the replica the new release no longer runs leaves the gateway and goes idle
    before its stop; a GPU still holding memory after it fails the roll (its restore starts it)."""
    data = load_profile("nvfp4-ctx8k-dp2").data
    data["server"]["tp_size"] = 2
    data["replicas"].update(count=3, gpus=[[0, 1], [2, 3], [4, 5]])
    three = Target.of(data)
    fake.workers["w2"] = "http://127.0.0.1:30003"
    plain = fake.sh
    monkeypatch.setattr(hr, "sh", lambda h, command, timeout=None: (plain(h, command), (True, smi))[1])
    said = []
    if held:
        with pytest.raises(hr.ReplicaFailed) as err:
            hr.retire(fake, three, [2], said.append, done=[0, 1])
        assert err.value.index == 2 and err.value.done == [0, 1] and held in str(err.value)
    else:
        hr.retire(fake, three, [2], said.append, done=[0, 1])
        assert said[-1] == "stopped sglang@2.service: not in the new release's set; GPUs 4,5 free"
    e = fake.events
    assert e[0] == "remove http://127.0.0.1:30003" and e[-1].startswith("sh disable --now sglang@2.service && nvidia-smi")
    assert "-i 4,5" in e[-1]


def test_instances_the_set_no_longer_has_are_stopped_and_disabled(tmp_path):
    """After `count` shrank (or a restore of a smaller set), sglang@2 would go on holding its GPUs
    and port, and start again at boot: the command stops and disables exactly the instances the
    release does not run, through systemctl (never by process name), and names them."""
    import os
    import subprocess

    calls = tmp_path / "calls"
    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\necho \"$*\" >> " + str(calls) + "\n"
                    "case \"$1\" in list-units) printf '%s\\n' "
                    "'sglang@0.service loaded active running x' 'sglang@1.service loaded active running x' "
                    "'sglang@2.service loaded active running x' 'sglang@3.service loaded inactive dead x';; esac\n")
    fake.chmod(0o755)
    t = target()                                            # nvfp4-ctx8k-dp2: sglang@0 and sglang@1
    out = subprocess.run(["sh", "-c", hr.surplus_command(t)], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert out.returncode == 0 and out.stdout.split() == ["sglang@2.service", "sglang@3.service"]
    said = calls.read_text().splitlines()
    assert said[0].startswith("list-units --all --plain --no-legend --type=service sglang@*")
    assert said[1:] == ["disable --now sglang@2.service", "disable --now sglang@3.service"]


def test_starting_a_set_at_once_stops_the_surplus_first(fake):
    """The surplus goes before the set starts: a new replica may need the GPUs it holds."""
    hr.start_set(object(), target(), lambda rt: None, 0.1, fake.events.append)
    assert fake.events[0] == 'sh disable --now "$u" >/dev/null 2>&1; echo "$u";; esac; done; true'
    assert "sh restart sglang@0.service sglang@1.service" in fake.events[1:]


def test_the_instances_read_gives_each_process_argv_as_the_kernel_holds_it(tmp_path):
    """The host's read of the set's instances (systemctl faked, a real process): the sha256 of
    the running process's argv, which stale_instances compares with the release's argv, and the
    instance the release does not run named with no files of its own."""
    import os
    import subprocess

    proc = subprocess.Popen(["sleep", "30"])
    try:
        fake = tmp_path / "systemctl"
        fake.write_text("#!/bin/sh\ncase \"$*\" in\n"
                        "  list-units*) printf '%s\\n' 'sglang@0.service loaded active running x' "
                        "'sglang@2.service loaded inactive dead x';;\n"
                        "  *ExecMainStartTimestamp*) echo @1700000000;;\n"
                        f"  *MainPID*sglang@0*) echo {proc.pid};;\n  *MainPID*) echo 0;;\n"
                        "  *ActiveState*sglang@0*) echo active;;\n  *ActiveState*) echo inactive;;\nesac\n")
        fake.chmod(0o755)
        out = subprocess.run(["sh", "-c", hr.instances_command(target())], capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    finally:
        proc.kill()
    seen = hr.parse_instances(out.stdout)
    assert seen["sglang@0.service"]["argv"] == argv_sha256(["sleep", "30"]), out
    assert seen["sglang@0.service"]["active"] and seen["sglang@0.service"]["started"] == 1700000000
    assert seen["sglang@2.service"] == {"active": False, "started": 1700000000, "files": None, "argv": None}
