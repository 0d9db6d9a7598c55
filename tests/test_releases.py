"""Release-record transitions (pure): pending -> deployed | failed, superseded, interrupted runs."""

from __future__ import annotations

from dsv4deploy.release import records as rel


def record(n, status, sha="s"):
    return {"release": n, "status": status, "manifest_sha256": sha, "profile": "p"}


def test_numbers_grow_from_the_highest():
    assert rel.next_number([]) == 1
    assert rel.next_number([record(1, rel.FAILED), record(7, rel.DEPLOYED)]) == 8


def test_new_record_starts_pending():
    doc = rel.new_record([record(1, rel.DEPLOYED)], profile="x", content_hash="h", manifest_sha256="m",
                         sglang_version="0.5.23")
    assert (doc["release"], doc["status"], doc["kind"]) == (2, rel.PENDING, "deploy")


def test_deploying_supersedes_the_previous_deployed():
    records = [record(1, rel.SUPERSEDED), record(2, rel.DEPLOYED), record(3, rel.PENDING)]
    changed = {d["release"]: d["status"] for d in rel.mark_deployed(records, 3)}
    assert changed == {2: rel.SUPERSEDED, 3: rel.DEPLOYED}


def test_an_interrupted_release_is_never_deployed_without_its_gate():
    records = [record(1, rel.DEPLOYED, "a"), record(2, rel.PENDING, "b")]
    failed = rel.settle_interrupted(records, live_manifest_sha256="a", healthy=True)
    assert [(d["release"], d["status"]) for d in failed] == [(2, rel.FAILED)]     # never reached the host
    assert "interrupted" in failed[0]["reason"]
    for healthy in (True, False):
        (doc,) = rel.settle_interrupted(records, "b", healthy=healthy)               # its files are live
        assert (doc["release"], doc["status"]) == (2, rel.UNVERIFIED)
        assert "before its gate passed" in doc["reason"] and "restarts and gates" in doc["reason"]
    assert rel.current(records)["release"] == 1        # the last release that passed stays current


def test_nothing_stays_pending_after_settling():
    records = [record(1, rel.PENDING, "a"), record(2, rel.PENDING, "b")]
    settled = rel.settle_interrupted(records, "b", healthy=True)
    assert {d["release"]: d["status"] for d in settled} == {1: rel.FAILED, 2: rel.UNVERIFIED}
    assert not any(d["status"] in (rel.PENDING, rel.DEPLOYED) for d in settled)


def test_current_is_the_newest_deployed():
    assert rel.current([record(1, rel.SUPERSEDED), record(2, rel.DEPLOYED), record(3, rel.FAILED)])["release"] == 2
    assert rel.current([record(1, rel.FAILED)]) is None


def test_prune_keeps_the_newest_ten_and_the_live_one():
    records = [record(n, rel.SUPERSEDED) for n in range(1, 15)]
    records[2] = record(3, rel.DEPLOYED)  # an old release rolled back to stays
    assert rel.to_prune(records) == [1, 2, 4]


def test_unused_paths():
    assert rel.unused(["/v/a", "/v/b", "/m/x"], {"/v/a", "/m/x"}) == ["/v/b"]


def test_prune_keeps_what_make_rollback_would_restore_after_a_run_of_failed_deploys():
    """1 passed, 2 is live; then five deploys fail, each rolled back to 2 (a rollback entry renders
    like 2): the newest ten are all failures and rollbacks of 2, and `make rollback` restores 1."""
    records = [record(1, rel.SUPERSEDED, "m1"), record(2, rel.SUPERSEDED, "m2")]
    for n in range(3, 13, 2):
        records += [record(n, rel.FAILED, f"m{n}"), record(n + 1, rel.SUPERSEDED, "m2")]
    records[-1]["status"] = rel.DEPLOYED
    assert rel.before_live(records)["release"] == 1
    assert rel.to_prune(records) == [2]              # 1 stays: it is what a manual rollback restores
