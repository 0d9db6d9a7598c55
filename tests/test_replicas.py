"""Replicas: how a `replicas:` block resolves (GPU sets, ports, gateway defaults) and what the
validator says about one that cannot work on the host, each message at the right file:line:key."""

from __future__ import annotations

import pytest

from dsv4deploy.profile import replicas
from checkout import load_profile
from dsv4deploy.profile.validate import validate

DP2 = "extends: nvfp4-ctx8k\n"


def report_for(profile_dir, text: str, name: str = "r"):
    profile_dir.write(name, DP2 + text)
    return validate(load_profile(name))


def errors(report) -> dict[str, str]:
    return {p.path: p.message for p in report.errors}


def test_the_shipped_dp2_profile_is_two_tp4_replicas_on_all_eight_gpus():
    report = validate(load_profile("nvfp4-ctx8k-dp2"))
    assert report.ok, [str(p) for p in report.errors]
    plan = replicas.plan(report.profile.data)
    assert [r.gpus for r in plan.replicas] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [r.url for r in plan.replicas] == ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
    assert (plan.gateway.host, plan.gateway.port, plan.gateway.metrics_port) == ("127.0.0.1", 30000, 29000)


def test_without_gpus_the_sets_are_contiguous_and_ports_follow_the_server_port(profile_dir):
    profile_dir.write("r", DP2 + "server: {tp_size: 2, port: 31000}\nreplicas: {count: 3}\n")
    plan = replicas.plan(load_profile("r").data)
    assert [r.gpus for r in plan.replicas] == [(0, 1), (2, 3), (4, 5)]
    assert [r.port for r in plan.replicas] == [31001, 31002, 31003]
    assert plan.gateway.port == 31000 and plan.gateway.policy == "round_robin"       # the default
    assert plan.gateway.version == "1.13.0" and plan.drain_timeout_s == 300


def test_a_profile_without_replicas_has_no_plan():
    assert replicas.plan(load_profile("nvfp4-ctx8k").data) is None


def test_each_replica_gets_the_profiles_memory_budget(profile_dir):
    """The per-GPU budget is each replica's: 0.85 at TP4 fails as it does for one server."""
    single = report_for(profile_dir, "server: {mem_fraction_static: 0.85}\n", "one")
    dp2 = report_for(profile_dir, "server: {mem_fraction_static: 0.85}\nreplicas: {count: 2}\n", "two")
    assert "server.mem_fraction_static" in errors(single)
    assert errors(dp2)["server.mem_fraction_static"] == errors(single)["server.mem_fraction_static"]
    assert dp2.budget == single.budget


def test_more_gpus_than_the_host_has(profile_dir):
    report = report_for(profile_dir, "replicas: {count: 3}\n")
    assert errors(report) == {"replicas.count": "3 replicas x server.tp_size 4 = 12 GPUs; the host has 8 "
                                                "(hardware.gpus_per_host)"}
    p = report.errors[0]
    assert p.file.endswith("r.yaml") and p.line == 2


def test_overlapping_sets_name_the_gpu_and_both_replicas(profile_dir):
    report = report_for(profile_dir, "replicas:\n  count: 2\n  gpus:\n    - [0, 1, 2, 3]\n    - [3, 4, 5, 6]\n")
    assert errors(report) == {"replicas.gpus[1][0]": "GPU 3 is already replica 0's: GPU sets must be disjoint "
                                                     "(two servers on one GPU run out of memory)"}
    assert report.errors[0].line == 6


def test_a_set_that_does_not_match_tp_and_a_gpu_the_host_lacks(profile_dir):
    report = report_for(profile_dir, "replicas:\n  count: 2\n  gpus: [[0, 1, 2], [4, 5, 6, 8]]\n")
    got = errors(report)
    assert "server.tp_size is 4" in got["replicas.gpus[0]"]
    assert "GPU 8 does not exist: the host has GPUs 0-7" in got["replicas.gpus[1][3]"]


def test_a_gpu_twice_in_one_set(profile_dir):
    report = report_for(profile_dir, "replicas:\n  count: 2\n  gpus: [[0, 0, 1, 2], [4, 5, 6, 7]]\n")
    assert errors(report) == {"replicas.gpus[0][1]": "GPU 0 is listed twice in replica 0"}


def test_one_set_per_replica(profile_dir):
    report = report_for(profile_dir, "replicas:\n  count: 1\n  gpus: [[0, 1, 2, 3], [4, 5, 6, 7]]\n")
    assert errors(report) == {"replicas.gpus": "2 GPU sets for replicas.count 1: give one set per replica"}


@pytest.mark.parametrize("text,path,words", [
    ("replicas: {count: 2, base_port: 29999}\n", "replicas.base_port",
     "replicas.gateway.port (default 30000) 30000 is replica 1's port"),
    ("server: {port: 29000}\nreplicas: {count: 2}\n", "replicas", "replicas.gateway.metrics_port (default 29000) 29000 "
     "is also replicas.gateway.port"),
    ("replicas: {count: 2, gateway: {metrics_port: 30002}}\n", "replicas.gateway.metrics_port", "is replica 1's port"),
    ("replicas: {count: 2, gateway: {port: 31000, metrics_port: 31000}}\n", "replicas.gateway.metrics_port",
     "is also replicas.gateway.port"),
    ("replicas: {count: 2, base_port: 65535}\n", "replicas.base_port", "ports 65535-65536, past 65535"),
    ("replicas: {count: 2, base_port: 80}\n", "replicas.base_port", "below 1024"),
    ("replicas: {count: 2, gateway: {port: 443}}\n", "replicas.gateway.port", "below 1024"),
    ("server: {port: 65535}\nreplicas: {count: 2}\n", "replicas", "default server.port + 1 = 65536"),
])
def test_port_conflicts(profile_dir, text, path, words):
    got = errors(report_for(profile_dir, text))
    assert words in got[path], got


def test_replicas_listen_on_loopback_only(profile_dir):
    got = errors(report_for(profile_dir, "server: {host: 0.0.0.0}\nreplicas: {count: 2}\n"))
    assert "set replicas.gateway.host for the public address" in got["server.host"]


def test_a_public_gateway_needs_the_api_key(profile_dir):
    got = errors(report_for(profile_dir, "server: {api_key: false}\nreplicas: {count: 2, gateway: {host: 0.0.0.0}}\n"))
    assert "control plane" in got["server.api_key"] and "server.api_key: true" in got["server.api_key"]


def test_a_loopback_gateway_without_a_key_is_a_warning(profile_dir):
    report = report_for(profile_dir, "server: {api_key: false}\nreplicas: {count: 2}\n")
    assert report.ok
    assert any(p.path == "server.api_key" and "control plane" in p.message for p in report.warnings)


def test_the_drain_needs_metrics(profile_dir):
    got = errors(report_for(profile_dir, "server: {enable_metrics: false}\nreplicas: {count: 2}\n"))
    assert "/metrics" in got["server.enable_metrics"]


@pytest.mark.parametrize("key", replicas.REPLICA_ENV)
def test_per_replica_environment_cannot_be_set_in_server_env(profile_dir, key):
    got = errors(report_for(profile_dir, f"server:\n  env: {{{key}: '1'}}\nreplicas: {{count: 2}}\n"))
    assert "set per replica" in got[f"server.env.{key}"]


def test_cuda_visible_devices_stays_allowed_without_replicas(profile_dir):
    assert report_for(profile_dir, "server:\n  env: {CUDA_VISIBLE_DEVICES: '0,1,2,3'}\n").ok


def test_an_smg_release_without_a_lock_file(profile_dir):
    got = errors(report_for(profile_dir, "replicas: {count: 2, gateway: {version: '1.12.0'}}\n"))
    assert got["replicas.gateway.version"] == ("no lock file for smg 1.12.0 (dsv4deploy/data/smg/1.12.0.lock); "
                                               "shipped: 1.13.0")


def test_one_replica_warns_that_updates_are_not_seamless(profile_dir):
    report = report_for(profile_dir, "replicas: {count: 1}\n")
    assert report.ok and any(p.path == "replicas.count" for p in report.warnings)


def test_a_bigger_host_takes_more_replicas(profile_dir):
    assert report_for(profile_dir, "hardware: {gpus_per_host: 16}\nreplicas: {count: 4}\n").ok


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("localhost", True),
                                       ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("ct200", False)])
def test_loopback(host, loop):
    assert replicas.is_loopback(host) is loop


def test_a_replica_set_rollout_targets_the_gateway_and_each_instance():
    """The rollout of a replicas profile is a set: users reach it through the gateway, each replica
    on its own port and unit; a profile without replicas keeps its single unit."""
    from dsv4deploy.release.rollout import rollout_for

    from checkout import settings

    t = rollout_for({"profile": "nvfp4-ctx8k-dp2", "weights_source": {"type": "hf"}, "settings": settings()}).target
    assert t.is_set and t.unit == "sglang-gateway.service" and t.base_url == "http://127.0.0.1:30000"
    assert [(rt.unit, rt.base_url, rt.port) for rt in t.replica_targets] == [
        ("sglang@0.service", "http://127.0.0.1:30001", 30001), ("sglang@1.service", "http://127.0.0.1:30002", 30002)]
    assert t.units == ["sglang@0.service", "sglang@1.service", "sglang-gateway.service"]
    single = rollout_for({"profile": "nvfp4-ctx8k", "weights_source": {"type": "hf"}, "settings": settings()}).target
    assert not single.is_set and single.units == ["sglang.service"] and single.base_url == "http://127.0.0.1:30000"


def test_a_set_rolls_only_when_every_replica_keeps_its_address_and_its_gpus():
    import copy
    from checkout import load_profile
    from dsv4deploy.profile.replicas import roll_problem
    base = load_profile("nvfp4-ctx8k-dp2").data
    assert roll_problem(base, copy.deepcopy(base)) is None
    moved = copy.deepcopy(base)
    moved["replicas"]["base_port"] = 31001
    assert roll_problem(base, moved) == ("its replicas change (http://127.0.0.1:30001, http://127.0.0.1:30002 -> "
                                         "http://127.0.0.1:31001, http://127.0.0.1:31002)")
    swapped = copy.deepcopy(base)
    swapped["replicas"]["gpus"] = [[4, 5, 6, 7], [0, 1, 2, 3]]     # replica 0 would start on GPUs 1 still holds
    assert roll_problem(base, swapped) == "their GPU sets change (0,1,2,3 4,5,6,7 -> 4,5,6,7 0,1,2,3)"
    assert roll_problem(load_profile("nvfp4-ctx8k").data, base) is None    # not two sets: not this question


def test_a_set_that_only_shrinks_rolls_and_its_surplus_replicas_leave():
    """count 3 -> 2 at TP2: the first two keep their addresses and GPUs, so the set rolls and
    replica 2 leaves (drained, stopped); growing back rolls too (a new replica on free GPUs is
    not a roll: it is refused as its address is new) and a shrink that moves GPUs is refused."""
    import copy
    from checkout import load_profile
    from dsv4deploy.profile.replicas import roll_problem, surplus
    base = load_profile("nvfp4-ctx8k-dp2").data
    three = copy.deepcopy(base)
    three["server"]["tp_size"] = 2
    three["replicas"]["count"] = 3
    three["replicas"].pop("gpus", None)
    two = copy.deepcopy(three)
    two["replicas"]["count"] = 2
    assert roll_problem(three, two) is None and surplus(three, two) == [2]
    assert surplus(three, copy.deepcopy(three)) == [] and surplus(two, three) == []
    assert roll_problem(two, three) is not None                 # a new replica: not one at a time
    moved = copy.deepcopy(two)
    moved["replicas"]["gpus"] = [[2, 3], [4, 5]]
    assert roll_problem(three, moved) == "their GPU sets change (0,1 2,3 4,5 -> 2,3 4,5)"
