"""weights_fetch.py against the twin's local hub: a download cut mid-shard resumes on the next run
from the bytes already on disk (the hub's request log shows the Range, those bytes are not sent
again), through the hub's 302 to its CDN; and the verify step's marker, so that a re-run after a
verified download hashes nothing (the host read only checks sizes and the marker)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ct200twin.host.checkpoint import make_checkpoint
from ct200twin.host.hub import HubFaults, serve_hub
from ct200twin.host.hub_repo import scan_repo
from dsv4deploy.weights import check as weights_check
from dsv4deploy.weights import fetch as weights_fetch

REPO = "nvidia/DeepSeek-V4-Flash-NVFP4"
BIG = "sim/big-shard"
BIG_SHARD = "model-00001-of-00001.safetensors"
SIZE = (5 << 20) + 12345


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    make_checkpoint(REPO, root=root)
    big = root / BIG.replace("/", "--")
    big.mkdir()
    block = hashlib.sha256(b"dsv4").digest() * 32768
    (big / BIG_SHARD).write_bytes((block * (SIZE // len(block) + 1))[:SIZE])
    (big / "config.json").write_text('{"model_type": "deepseek_v4"}\n')
    return root


def expected_of(root: Path, repo: str) -> dict:
    hub_repo = scan_repo(repo, root / repo.replace("/", "--"))
    return {"commit": hub_repo.commit, "files": hub_repo.expected()}


def fetcher(hub, folder: Path, expected: dict, repo: str = BIG) -> weights_fetch.Fetcher:
    return weights_fetch.Fetcher(folder, hub.url, repo, expected["commit"], None)


def test_a_download_cut_mid_shard_resumes_from_the_bytes_on_disk_on_the_next_run(root, tmp_path, monkeypatch):
    expected = expected_of(root, BIG)
    cut = (2 << 20) + 777
    folder = tmp_path / "m"
    monkeypatch.setattr(weights_fetch, "TRIES", 2)
    monkeypatch.setattr(weights_fetch.time, "sleep", lambda s: None)
    with serve_hub(root, faults=HubFaults(cut={BIG_SHARD: cut}, cut_times=99)) as hub:
        first = weights_fetch.run(fetcher(hub, folder, expected), expected, hf=None)   # the run dies mid-shard
        assert list(first["failed"]) == [BIG_SHARD] and not (folder / BIG_SHARD).exists()
        hub.set_faults(HubFaults())
        hub.clear_log()
        second = weights_fetch.run(fetcher(hub, folder, expected), expected, hf=None)   # the re-run
        log = hub.request_log()
    assert second["failed"] == {} and second["resumed"] == {BIG_SHARD: cut}
    gets = [r for r in log if r["method"] == "GET" and r["path"].endswith(BIG_SHARD)]
    # the bytes on disk were not fetched again: the first GET of the shard starts at the cut; a
    # retry (a loaded machine may time an answer out) never starts before it, and the last one
    # sends the rest of the file
    starts = [int(g["range"].removeprefix("bytes=").removesuffix("-")) for g in gets]
    assert {(g["path"].split("/")[1], g["status"]) for g in gets} == {("_cdn", 206)}, gets
    assert starts[0] == cut and starts == sorted(starts), gets
    assert gets[-1]["sent"] == SIZE - starts[-1], gets
    heads = [r for r in log if r["method"] == "HEAD" and r["path"].endswith(BIG_SHARD)]
    assert [h["status"] for h in heads] == [302]              # the metadata from the hub's redirect
    assert weights_check.verify(folder, expected) == []


def test_the_route_is_said_and_only_missing_or_wrong_sized_files_are_fetched(root, tmp_path, capsys):
    expected = expected_of(root, REPO)
    folder = tmp_path / "m"
    with serve_hub(root) as hub:
        first = weights_fetch.run(fetcher(hub, folder, expected, REPO), expected, hf="/nonexistent/hf")
        assert sorted(first["fetched"]) == sorted(expected["files"]) and first["xet"] == []
        assert "offers no Xet for these files: plain HTTP with Range resume" in capsys.readouterr().err
        shard = next(p for p, m in expected["files"].items() if m["sha256"])
        with open(folder / shard, "ab") as f:
            f.write(b"x")                                    # the wrong size: removed and fetched again
        hub.clear_log()
        again = weights_fetch.run(fetcher(hub, folder, expected, REPO), expected, hf=None)
    assert again["fetched"] == [shard] and weights_check.verify(folder, expected) == []


def run_check(folder: Path, expected: dict, *flags: str) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-I", "-S", weights_check.__file__, str(folder), "-", *flags],
                         input=json.dumps(expected), capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout), out.stderr


def test_the_read_hashes_nothing_and_a_rerun_after_a_verified_download_hashes_nothing(root, tmp_path):
    expected = expected_of(root, REPO)
    folder = tmp_path / "m"
    with serve_hub(root) as hub:
        weights_fetch.run(fetcher(hub, folder, expected, REPO), expected, hf=None)
    read, _ = run_check(folder, expected, "--no-hash")       # the host read, before any verify
    assert read["complete"] is False and read["hashed"] == 0 and read["problems"] == []
    assert sorted(read["unverified"]) == sorted(expected["files"])
    verify, progress = run_check(folder, expected, "--write-marker", "--progress", "--remove-bad")
    n = len(expected["files"])
    assert verify["complete"] and verify["hashed"] == n and progress.count("weights_check: verified ") == n
    marker = json.loads((folder / weights_check.MARKER).read_text())
    assert sorted(marker["files"]) == sorted(expected["files"])     # one record per verified file
    again, _ = run_check(folder, expected, "--no-hash")
    assert again["complete"] and again["hashed"] == 0 and again["trusted"] == n
    rerun, _ = run_check(folder, expected, "--write-marker", "--progress")
    assert rerun["hashed"] == 0


def test_a_verify_cut_halfway_keeps_what_it_proved(root, tmp_path):
    """The marker is rewritten after each file: files proven before a cut are trusted by the read."""
    expected = expected_of(root, REPO)
    folder = tmp_path / "m"
    with serve_hub(root) as hub:
        weights_fetch.run(fetcher(hub, folder, expected, REPO), expected, hf=None)
    names = sorted(expected["files"])
    seen = []

    def stop_after_two(doc, rel, done, total):
        (folder / weights_check.MARKER).write_text(json.dumps(doc))
        seen.append(rel)
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        weights_check.check(folder, expected, workers=1, on_verified=stop_after_two)
    read, _ = run_check(folder, expected, "--no-hash")
    assert read["trusted"] == 2 and sorted(read["unverified"]) == sorted(set(names) - set(seen))
