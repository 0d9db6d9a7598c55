"""`dsv4deploy status` (dsv4deploy/watch/status.py): a host's one answer, recorded on the twin
after a deploy of nvfp4-ctx8k with the watch, parsed and judged; then the same answer with what
an operator would have to notice changed in it."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4deploy.cli.status import print_status
from dsv4deploy.watch import status

ANSWER = (Path(__file__).resolve().parent / "fixtures" / "watch" / "status-answer.txt").read_text()


def judged(answer: str = ANSWER, now: float | None = None) -> dict:
    doc = status.parse(answer)
    return status.judge("ct200", doc, now=now if now is not None else (doc["state"] or {}).get("t", 0) + 1)


def test_a_deployed_release_with_a_passing_watch_is_healthy(capsys):
    s = judged()
    assert (s["health"], s["release"], s["profile"]) == ("healthy", 2, "nvfp4-ctx8k-watch")
    assert s["units"] == {"sglang.service": "active", "dsv4-watch.timer": "active"}
    assert s["last"]["server"]["verdict"] == "passed" and s["trend"]["server"].endswith("P")
    assert s["gpus"]["count"] == 4 and not s["gpus"]["faults"] and s["drift"] == []
    assert print_status([s], as_json=False) == 0
    text = capsys.readouterr().out
    assert text.startswith("ct200: HEALTHY - release 0002 (nvfp4-ctx8k-watch) since ")
    assert "watch server: passed (TTFT" in text


def test_a_hand_edited_unit_is_drift_and_degrades():
    parts = ANSWER.split("@@dsv4-status@@")
    parts[5] = "\n/etc/systemd/system/sglang.service\n"
    s = judged("@@dsv4-status@@".join(parts))
    assert s["health"] == "degraded" and s["drift"] == ["/etc/systemd/system/sglang.service"]
    assert status.exit_code([s]) == 1


def test_a_stopped_server_is_down_and_a_stale_watch_degraded():
    s = judged(ANSWER.replace("ActiveState=active", "ActiveState=failed", 1))
    assert s["health"] == "down" and status.exit_code([s]) == 2
    late = judged(now=(status.parse(ANSWER)["state"]["t"] + 3600))
    assert late["health"] == "degraded" and "the watch last measured" in late["why"][0]


def test_the_watch_verdict_and_a_gpu_fault_show_with_the_gpu(capsys):
    doc = status.parse(ANSWER)
    doc["state"]["last_reading"]["gpus"][2]["xid"] = [79]
    doc["state"]["health"] = "degraded"
    doc["state"]["targets"]["server"]["degraded"] = "hardware fault, no config rollback: GPU 2 XID 79"
    s = status.judge("ct200", doc, now=doc["state"]["t"])
    assert s["health"] == "degraded" and "GPU 2 XID 79 in the kernel log" in s["gpus"]["faults"]
    assert print_status([s], as_json=True) == 1
    assert json.loads(capsys.readouterr().out)["health"] == "degraded"


def test_an_unreachable_host_is_down():
    assert status.exit_code([judged(), status.unreachable("ct201", "timed out")]) == 2


def test_right_after_a_new_deploy_the_last_releases_intervals_are_not_shown_as_its_own(capsys):
    """Until the watch's first interval of a new release, its state still holds the last
    release's: status says that none of this release's has run yet, and shows none of those."""
    doc = status.parse(ANSWER)
    doc["records"].append(dict(doc["records"][-1], release=3, updated="2026-12-06T10:00:00+00:00"))
    s = status.judge("ct200", doc, now=doc["state"]["t"] + 5)
    assert (s["health"], s["release"], s["trend"], s["gpus"]["count"]) == ("healthy", 3, {}, 0)
    print_status([s], as_json=False)
    text = capsys.readouterr().out
    assert "watch: no interval of this release yet (one every 3 s)" in text and "watch server:" not in text
