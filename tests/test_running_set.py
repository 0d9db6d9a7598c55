"""The running replica set against the release that serves it (release/running_set.py), as
`dsv4deploy status` shows it (issue 40, item 1): from a rendered two-replica release and small
reads of the host, each instance's files, process and GPUs, the instances the release does not
run, and the gateway's process and workers."""

from __future__ import annotations

import json

from dsv4deploy.cli.status import print_status
from dsv4deploy.host.replicas import gpu_mib
from dsv4deploy.release import running_set as rs
from dsv4deploy.release.rollout import rollout_for
from dsv4deploy.watch import status
from test_host_state import SIM
from test_watch_status import judged

R = rollout_for({**SIM, "profile": "nvfp4-ctx8k-dp2"})
T = R.target
ARGV = rs.kept_argv(json.loads(R.rendered.manifest))
RIGHT = [rs.argv_sha256(rep.argv) for rep in R.rendered.replicas]
WORKERS = [{"url": f"http://127.0.0.1:{p}", "status": "ready", "healthy": True} for p in (30001, 30002)]
GATEWAY = {"ActiveState": "active", "MainPID": 4242}
IN_USE = {g: 30000 for g in range(8)}


def read(instances: str, workers=WORKERS, stale: bool = False) -> rs.SetRead:
    from dsv4deploy.host.replicas import parse_instances
    return rs.SetRead(instances=parse_instances(instances), workers=workers, gateway=GATEWAY,
                      gateway_stale=stale, gpu_mib=IN_USE)


MATCHING = (f"sglang@0.service active 1700000100 1700000000 {RIGHT[0]}\n"
            f"sglang@1.service active 1700000100 1700000000 {RIGHT[1]}\n")


def test_the_kept_manifest_gives_each_replica_the_argv_its_process_must_run():
    assert ARGV == {"sglang@0.service": RIGHT[0], "sglang@1.service": RIGHT[1]}
    assert RIGHT[0] != RIGHT[1]                       # the port differs
    assert rs.kept_argv({"replicas": [{"instance": "sglang@0", "argv": "not a list"}]}) == {}
    assert rs.kept_argv(None) == {}


def test_a_set_that_matches_its_release_keeps_the_host_healthy(capsys):
    view = rs.compare(T, ARGV, read(MATCHING))
    assert view["differences"] == [] and view["surplus"] == []
    assert [(r["unit"], r["files_current"], r["from_current_files"], r["gpus"], r["in_gateway"])
            for r in view["replicas"]] == [("sglang@0.service", True, True, [0, 1, 2, 3], True),
                                           ("sglang@1.service", True, True, [4, 5, 6, 7], True)]
    g = view["gateway"]
    assert (g["active"], g["pid"], g["from_current_files"], g["missing"], g["strays"]) == (True, 4242, True, [], [])
    s = status.with_set(judged(), {"release": 2, **view})
    assert s["health"] == "healthy" and s["why"] == []
    assert print_status([s], as_json=False) == 0
    text = capsys.readouterr().out
    assert "  replica set of release 0002: matches it" in text
    assert ("    replica 1 sglang@1.service active: files current, process from current files, GPUs 4,5,6,7 "
            "(30000 MiB, 30000 MiB, 30000 MiB, 30000 MiB used), in the gateway") in text
    assert ("    gateway sglang-gateway.service active (PID 4242): files current, process from current files; "
            "workers: http://127.0.0.1:30001, http://127.0.0.1:30002") in text
    assert status.lines(json.loads(json.dumps(s))) == status.lines(s)       # --json holds all the text shows


def test_each_difference_from_the_release_is_named_and_degrades_the_host(capsys):
    """A replica restarted from another argv, its env file edited, an instance started by hand,
    the gateway on older files, listing a worker the release has not and missing replica 0."""
    instances = (f"sglang@0.service active 1700000100 1700000000 {RIGHT[0]}\n"
                 f"sglang@1.service active 1700000100 1700000000 {'e' * 64}\n"
                 "sglang@2.service active 1700000100 - -\nsglang@3.service inactive 0 - -\n")
    workers = [WORKERS[1], {"url": "http://127.0.0.1:30003", "status": "ready", "healthy": True}]
    view = rs.compare(T, ARGV, read(instances, workers, stale=True),
                      changed=frozenset({T.layout.replica_env(1)}))
    assert view["differences"] == [
        "replica 0 (sglang@0.service) runs but the gateway does not list it",
        "replica 1 (sglang@1.service): its files on the host are not the release's",
        "replica 1 (sglang@1.service) runs other files than the release's (its process's argv is not the release's)",
        "sglang@2.service runs and is not one of the release's 2 replicas",
        "sglang-gateway.service runs older gateway files than those in place",
        "sglang-gateway.service lists http://127.0.0.1:30003, which no replica of the release serves"]
    s = status.with_set(judged(), {"release": 2, **view})
    assert s["health"] == "degraded" and status.exit_code([s]) == 1
    assert "replica set: sglang@2.service runs and is not one of the release's 2 replicas" in s["why"]
    assert print_status([s], as_json=True) == 1
    doc = json.loads(capsys.readouterr().out)["hosts"][0]["set"]
    assert doc["surplus"] == ["sglang@2.service"] and doc["gateway"]["missing"] == ["sglang@0.service"]
    print_status([s], as_json=False)
    text = capsys.readouterr().out
    assert "    replica 1 sglang@1.service active: files CHANGED, process from OTHER files" in text
    assert "    sglang@2.service active: NOT one of the release's replicas (holds its GPUs)" in text


def test_a_process_whose_argv_cannot_be_read_is_judged_by_its_start_time():
    """A process that renamed itself (one word in its cmdline) shows no argv: it started before
    its files last changed, or after."""
    older = "sglang@0.service active 1700000000 1700000100 -\nsglang@1.service active 1700000200 1700000100 -\n"
    view = rs.compare(T, ARGV, read(older))
    assert [r["from_current_files"] for r in view["replicas"]] == [False, True]


def test_a_stopped_set_and_an_unanswering_gateway_are_differences_not_guesses():
    view = rs.compare(T, ARGV, rs.SetRead(instances={}, workers=None, gateway={"ActiveState": "failed"}))
    assert [r["from_current_files"] for r in view["replicas"]] == [None, None]
    assert [r["in_gateway"] for r in view["replicas"]] == [None, None]
    assert view["differences"] == ["replica 0 (sglang@0.service) is not running",
                                   "replica 1 (sglang@1.service) is not running",
                                   "sglang-gateway.service is not running"]
    s = status.with_set(judged(), {"release": 2, **view})
    assert "    replica 0 sglang@0.service NOT RUNNING: files current, process -, GPUs 0,1,2,3, gateway not read" \
        in "\n".join(status.lines(s))


def test_a_release_that_cannot_be_read_back_is_said_and_degrades():
    s = status.with_set(judged(), {"release": 2, "error": "release 0002's profile.json is damaged"})
    assert s["health"] == "degraded"
    assert s["why"][-1] == "replica set: cannot be compared: release 0002's profile.json is damaged"
    assert "  replica set of release 0002: cannot be compared: release 0002's profile.json is damaged" \
        in status.lines(s)


def test_a_single_server_has_no_set_to_compare():
    assert status.with_set(judged(), None) == judged()


def test_the_gpu_read_gives_mib_per_gpu_and_skips_what_does_not_parse():
    assert gpu_mib("0, 30000\n1, 12\nNVIDIA-SMI has failed\n") == {0: 30000, 1: 12}
    assert gpu_mib("") is None and gpu_mib(None) is None
