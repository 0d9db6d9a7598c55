"""The twin's local hub driven by the real huggingface_hub client (the version pyproject pins):
model_info, hf_hub_download, snapshot_download, a cut download resumed with a Range request,
a corrupted byte caught by sha256, revision and token errors, and the `hf` CLI the deploy runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub import constants as hf_constants  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from dsv4deploy.weights import check as weights_check  # noqa: E402
from ct200twin.host.checkpoint import make_checkpoint  # noqa: E402
from ct200twin.host.hub import HubFaults, serve_hub  # noqa: E402
from ct200twin.host.hub_repo import scan_repo  # noqa: E402
from hub_fixtures import no_agent_registry_fetch  # noqa: F401,E402

REPO = "nvidia/DeepSeek-V4-Flash-NVFP4"
BIG = "sim/big-shard"
SHARD1 = "model-00001-of-00003.safetensors"
SHARD2 = "model-00002-of-00003.safetensors"
BIG_SHARD = "model-00001-of-00001.safetensors"
TOKEN = "hf_simtoken_0123456789"
VENV_BIN = Path(sys.executable).parent


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Two repos: the twin's stand-in checkpoint, and one shard bigger than the client's 10 MiB
    read chunk (a cut is resumed from the last whole chunk written)."""
    root = tmp_path_factory.mktemp("hub")
    make_checkpoint(REPO, root=root)
    big = root / BIG.replace("/", "--")
    big.mkdir()
    size = hf_constants.DOWNLOAD_CHUNK_SIZE + (3 << 20) + 12345
    block = hashlib.sha256(b"dsv4").digest() * 32768  # 1 MiB, not all one byte
    (big / BIG_SHARD).write_bytes((block * (size // len(block) + 1))[:size])
    (big / "config.json").write_text('{"model_type": "deepseek_v4"}\n')
    return root


@pytest.fixture
def hub(root):
    with serve_hub(root) as h:
        yield h


@pytest.fixture
def dl(tmp_path):
    """Keyword arguments that keep the client off this machine's HF cache and token."""
    return {"cache_dir": tmp_path / "hf-cache", "token": False}


def commit_of(root: Path, repo: str = REPO) -> str:
    return scan_repo(repo, root / repo.replace("/", "--")).commit


def resolves(hub, method: str = "GET", name: str | None = None, since: float = 0.0) -> list[dict]:
    """Requests for files' bytes (on /resolve/, or for LFS files on the /_cdn/ the 302 names);
    `since`: only those that started after it (a record is appended when its answer ends, which
    can be after the client has moved on)."""
    return [r for r in hub.request_log() if r["method"] == method and r["status"] != 302
            and ("/resolve/" in r["path"] or r["path"].startswith("/_cdn/"))
            and (name is None or r["path"].endswith("/" + name)) and r["start"] >= since]


# ------------------------------------------------------------------------------- model info
def test_model_info_names_the_commit_and_every_file_with_size_and_lfs_sha256(hub, root):
    api = HfApi(endpoint=hub.url, token=False)
    info = api.model_info(REPO, revision="main", files_metadata=True)
    folder = root / REPO.replace("/", "--")
    assert info.sha == commit_of(root) and len(info.sha) == 40
    by_name = {s.rfilename: s for s in info.siblings}
    assert set(by_name) == {p.name for p in folder.iterdir()}
    for name, s in by_name.items():
        assert s.size == (folder / name).stat().st_size
        if name.endswith(".safetensors"):
            assert s.lfs.sha256 == sha256(folder / name) and s.lfs.size == s.size
        else:
            assert s.lfs is None
            data = (folder / name).read_bytes()
            assert s.blob_id == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    # The commit resolves to itself; without files_metadata only names come back.
    assert api.model_info(REPO, revision=info.sha).sha == info.sha
    assert all(s.size is None for s in api.model_info(REPO).siblings)


def test_tree_paths_info_and_refs(hub, root):
    api = HfApi(endpoint=hub.url, token=False)
    commit = commit_of(root)
    tree = {f.path: f for f in api.list_repo_tree(REPO, recursive=True, revision=commit)}
    assert tree[SHARD1].lfs.sha256 == sha256(root / REPO.replace("/", "--") / SHARD1)
    [info] = api.get_paths_info(REPO, [SHARD2, "missing.bin"], revision="main")
    assert info.path == SHARD2 and info.lfs is not None
    refs = api.list_repo_refs(REPO)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", commit)]


# ---------------------------------------------------------------------------------- download
def test_hf_hub_download_one_file(hub, root, tmp_path, dl):
    path = hf_hub_download(REPO, SHARD1, revision="main", endpoint=hub.url, local_dir=tmp_path / "m", **dl)
    assert sha256(Path(path)) == sha256(root / REPO.replace("/", "--") / SHARD1)
    # as from the real hub: the HEAD on /resolve/ is a 302 (metadata on it, not followed to
    # another host name), the bytes come from the "CDN" it names, without the token
    head = [r for r in hub.request_log() if r["method"] == "HEAD" and r["path"].endswith(SHARD1)]
    assert [h["status"] for h in head] == [302] and head[0]["path"].startswith(f"/{REPO}/resolve/")
    get = resolves(hub, "GET", SHARD1)
    assert [(g["status"], g["path"].split("/")[1]) for g in get] == [(200, "_cdn")]


def test_resolve_headers_as_the_client_reads_them(hub, root):
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    commit = commit_of(root)
    meta = get_hf_file_metadata(hf_hub_url(REPO, SHARD1, revision="main", endpoint=hub.url), token=False)
    assert meta.commit_hash == commit
    assert meta.etag == sha256(root / REPO.replace("/", "--") / SHARD1)  # X-Linked-Etag: the LFS sha256
    assert meta.size == (root / REPO.replace("/", "--") / SHARD1).stat().st_size


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_an_lfs_file_is_a_302_to_the_cdn_with_its_metadata_as_the_real_hub_answers(hub, root):
    """What huggingface_hub 1.33 reads: the 302 carries X-Repo-Commit, X-Linked-Etag (sha256) and
    X-Linked-Size, its Location is another host name (not followed by the client's HEAD); the
    CDN URL serves the bytes and ranges without a token, and only with the signature it was given."""
    folder = root / REPO.replace("/", "--")
    opener = urllib.request.build_opener(_NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as moved:
        opener.open(urllib.request.Request(f"{hub.url}/{REPO}/resolve/main/{SHARD1}", method="HEAD"), timeout=5)
    h = moved.value.headers
    assert moved.value.code == 302 and h["X-Repo-Commit"] == commit_of(root)
    assert h["X-Linked-Etag"] == f'"{sha256(folder / SHARD1)}"' and int(h["X-Linked-Size"]) == (folder / SHARD1).stat().st_size
    location = h["Location"]
    assert location.startswith(f"http://localhost:{hub.url.rsplit(':', 1)[1]}/_cdn/{REPO}/") and "sig=" in location
    data = (folder / SHARD1).read_bytes()
    with urllib.request.urlopen(urllib.request.Request(location, headers={"Range": "bytes=100-"}), timeout=5) as r:
        assert r.status == 206 and r.read() == data[100:] and r.headers["ETag"] == f'"{sha256(folder / SHARD1)}"'
    with pytest.raises(urllib.error.HTTPError) as forged:
        urllib.request.urlopen(location.split("?")[0] + "?sig=" + "0" * 32, timeout=5)
    assert forged.value.code == 403
    # in the order the requests came: a record is appended when its answer ends, and the 206's
    # thread may end after the 403's
    log = [(r["method"], r["path"].split("/")[1], r["status"], r["range"])
           for r in sorted(hub.request_log(), key=lambda r: r["start"])]
    assert log[-2:] == [("GET", "_cdn", 206, "bytes=100-"), ("GET", "_cdn", 403, None)]
    with urllib.request.urlopen(f"{hub.url}/{REPO}/resolve/main/config.json", timeout=5) as small:
        assert small.status == 200 and small.headers["X-Repo-Commit"] == commit_of(root)   # small files: no 302


def test_range_requests(hub, root):
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    data = (root / REPO.replace("/", "--") / "config.json").read_bytes()

    def get(rng):
        req = urllib.request.Request(url, headers={"Range": rng})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.headers.get("Content-Range"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Range"), b""

    assert get("bytes=10-") == (206, f"bytes 10-{len(data) - 1}/{len(data)}", data[10:])
    assert get("bytes=0-9") == (206, f"bytes 0-9/{len(data)}", data[:10])
    assert get("bytes=-5") == (206, f"bytes {len(data) - 5}-{len(data) - 1}/{len(data)}", data[-5:])
    assert get(f"bytes={len(data)}-")[:2] == (416, f"bytes */{len(data)}")


def test_snapshot_download_whole_repo_then_nothing_again(hub, root, tmp_path, dl):
    commit = commit_of(root)
    out = Path(snapshot_download(REPO, revision=commit, endpoint=hub.url, local_dir=tmp_path / "m", **dl))
    folder = root / REPO.replace("/", "--")
    for p in folder.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name
    assert weights_check.verify(out, weights_check.expected_from_model_info(
        HfApi(endpoint=hub.url, token=False).model_info(REPO, revision=commit, files_metadata=True))) == []
    since = time.time()
    snapshot_download(REPO, revision=commit, endpoint=hub.url, local_dir=tmp_path / "m", **dl)
    assert resolves(hub, "GET", since=since) == [], "a complete checkpoint at a pinned commit is never fetched again"


@pytest.mark.slow
def test_a_cut_download_resumes_with_a_range_request(root, tmp_path, dl):
    size = (root / BIG.replace("/", "--") / BIG_SHARD).stat().st_size
    cut = hf_constants.DOWNLOAD_CHUNK_SIZE + (1 << 20)
    with serve_hub(root, faults=HubFaults(cut={BIG_SHARD: cut})) as hub:
        t0 = time.monotonic()
        path = Path(hf_hub_download(BIG, BIG_SHARD, revision="main", endpoint=hub.url,
                                    local_dir=tmp_path / "m", **dl))
        first, second = resolves(hub, "GET", BIG_SHARD)
    assert first["cut"] and first["sent"] == cut and first["range"] is None
    # The client kept what it had written (whole 10 MiB read chunks) and asked for the rest.
    start = int(second["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= cut and second["status"] == 206 and second["sent"] == size - start
    assert path.stat().st_size == size and sha256(path) == sha256(root / BIG.replace("/", "--") / BIG_SHARD)
    assert time.monotonic() - t0 < 10


@pytest.mark.slow
def test_a_killed_hf_download_restarts_the_partial_file_from_zero(root, tmp_path):
    """What 2.4 does after `hf download` is killed (the deploy's SSH session dropped): the partial
    file is a per-process `*.incomplete` temp file under LOCAL_DIR/.cache/huggingface/download
    that no later run reuses or deletes; the next run fetches that file again from byte 0 and
    skips every file already complete. Resume by Range happens only inside one process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    local = tmp_path / "m"
    size = (root / BIG.replace("/", "--") / BIG_SHARD).stat().st_size
    with serve_hub(root, faults=HubFaults(stall={BIG_SHARD: hf_constants.DOWNLOAD_CHUNK_SIZE + 4096})) as hub:
        env["HF_ENDPOINT"] = hub.url
        cmd = [str(VENV_BIN / "hf"), "download", BIG, "--revision", commit_of(root, BIG), "--local-dir", str(local)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        partial: list[Path] = []
        done_meta = local / ".cache/huggingface/download/config.json.metadata"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            partial = [p for p in (local / ".cache/huggingface/download").rglob("*.incomplete")
                       if p.stat().st_size > 0] if local.exists() else []
            # complete = moved into place AND its metadata written (hf writes it just after the
            # move; a file killed between the two has no metadata and is fetched again)
            if partial and (local / "config.json").is_file() and done_meta.is_file():
                break
            time.sleep(0.02)
        proc.kill()
        proc.wait()
        assert partial and done_meta.is_file() and not (local / BIG_SHARD).exists()
        hub.set_faults(HubFaults())
        t_again = time.time()
        assert subprocess.run(cmd, env=env, capture_output=True, timeout=60).returncode == 0
        gets = resolves(hub, "GET", since=t_again)
    assert [(g["path"].rsplit("/", 1)[1], g["range"], g["sent"]) for g in gets] == [(BIG_SHARD, None, size)]
    assert all(p.exists() for p in partial), "the killed run's temp file stays behind"
    assert sha256(local / BIG_SHARD) == sha256(root / BIG.replace("/", "--") / BIG_SHARD)


def test_a_failed_run_then_a_rerun_fetches_only_what_is_missing(hub, root, tmp_path, dl):
    commit = commit_of(root)
    hub.set_faults(HubFaults(fail={SHARD2: 1}))
    with pytest.raises(HfHubHTTPError):
        snapshot_download(REPO, revision=commit, endpoint=hub.url, local_dir=tmp_path / "m", max_workers=1, **dl)
    assert not (tmp_path / "m" / SHARD2).exists()
    done_before = {p.name for p in (tmp_path / "m").iterdir() if p.is_file()}
    since = time.time()
    snapshot_download(REPO, revision=commit, endpoint=hub.url, local_dir=tmp_path / "m", **dl)
    fetched = {r["path"].rsplit("/", 1)[1] for r in resolves(hub, "GET", since=since)}
    assert SHARD2 in fetched and not (fetched & done_before)


def test_a_corrupted_byte_is_caught_by_sha256_and_only_a_fresh_download_mends_it(hub, root, tmp_path, dl):
    commit = commit_of(root)
    expected = weights_check.expected_from_model_info(
        HfApi(endpoint=hub.url, token=False).model_info(REPO, revision=commit, files_metadata=True))
    assert expected["commit"] == commit and expected["files"][SHARD1]["sha256"]
    hub.set_faults(HubFaults(corrupt={SHARD1: 5000}))
    local = tmp_path / "m"
    snapshot_download(REPO, revision=commit, endpoint=hub.url, local_dir=local, **dl)  # sizes match: no error
    problems = weights_check.verify(local, expected)
    assert len(problems) == 1 and problems[0].startswith(f"{SHARD1}: sha256 ") and "corrupt" in problems[0]
    # huggingface_hub trusts its own local copy at a pinned commit: the bad file must go first.
    hub.set_faults(HubFaults())
    snapshot_download(REPO, revision=commit, endpoint=hub.url, local_dir=local, **dl)
    assert weights_check.verify(local, expected) == problems
    (local / SHARD1).unlink()
    snapshot_download(REPO, revision=commit, endpoint=hub.url, local_dir=local, **dl)
    assert weights_check.verify(local, expected) == []


# ------------------------------------------------------------------------------------ errors
def test_unknown_revision_repo_and_file(hub, tmp_path, dl):
    api = HfApi(endpoint=hub.url, token=False)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="0" * 40)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="0" * 40, endpoint=hub.url, local_dir=tmp_path, **dl)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("nobody/nothing")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "nope.json", revision="main", endpoint=hub.url, local_dir=tmp_path, **dl)


def test_token_missing_wrong_and_right(root, tmp_path):
    with serve_hub(root, token=TOKEN) as hub:
        with pytest.raises(GatedRepoError):
            HfApi(endpoint=hub.url, token=False).model_info(REPO)
        with pytest.raises(HfHubHTTPError) as wrong:
            HfApi(endpoint=hub.url, token="hf_wrong_token_000").model_info(REPO)
        assert wrong.value.response.status_code == 401 and not isinstance(wrong.value, RepositoryNotFoundError)
        with pytest.raises(GatedRepoError):
            hf_hub_download(REPO, "config.json", revision="main", endpoint=hub.url, local_dir=tmp_path / "a",
                            cache_dir=tmp_path / "c", token=False)
        assert HfApi(endpoint=hub.url, token=TOKEN).model_info(REPO).sha
        hf_hub_download(REPO, "config.json", revision="main", endpoint=hub.url, local_dir=tmp_path / "b",
                        cache_dir=tmp_path / "c", token=TOKEN)
        assert all(r["auth"] for r in hub.request_log() if r["status"] == 200 and not r["path"].startswith("/_cdn/"))


def test_fault_control_endpoint(hub):
    def put(doc):
        req = urllib.request.Request(f"{hub.url}/_sim/faults", data=json.dumps(doc).encode(), method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert put({"cut": {SHARD1: 100}})[0] == 200 and hub.faults.cut == {SHARD1: 100}
    status, body = put({"cutt": {}})
    assert status == 400 and "unknown keys" in body["error"]
    assert put({"cut": {SHARD1: -1}})[0] == 400
    assert put({"rate": 100_000})[0] == 200
    t0 = time.monotonic()
    with urllib.request.urlopen(f"{hub.url}/{REPO}/resolve/main/{SHARD1}", timeout=10) as r:
        assert len(r.read()) > 30_000
    assert time.monotonic() - t0 > 0.25


# --------------------------------------------------------- the commands the deploy runs on a host
@pytest.mark.slow
def test_hf_cli_download_token_file_and_the_host_check(root, tmp_path):
    """`hf download REPO --revision C --local-dir D` with HF_ENDPOINT and HF_TOKEN_PATH, then the
    weights check run as a plain script, as the weights step will run them on the host."""
    commit = commit_of(root)
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    local = tmp_path / "model"
    with serve_hub(root, token=TOKEN) as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub.url, HF_TOKEN_PATH=str(token_file), HF_HOME=str(tmp_path / "hf-home"),
                   HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        cmd = [str(VENV_BIN / "hf"), "download", REPO, "--revision", commit, "--local-dir", str(local)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        expected = weights_check.expected_from_model_info(
            HfApi(endpoint=hub.url, token=TOKEN).model_info(REPO, revision=commit, files_metadata=True))
        t_again = time.time()
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0
        assert [r for r in hub.request_log() if r["start"] >= t_again] == [], "no request the second time"
        cmd[-1] = str(tmp_path / "fresh")
        none = subprocess.run(cmd, env={**env, "HF_TOKEN_PATH": str(tmp_path / "none")}, capture_output=True,
                              text=True, timeout=60)
        (tmp_path / "wrong").write_text("hf_wrong_token_000\n")
        wrong = subprocess.run(cmd, env={**env, "HF_TOKEN_PATH": str(tmp_path / "wrong")}, capture_output=True,
                               text=True, timeout=60)
    assert none.returncode == 1 and "Access denied" in none.stderr, none.stderr
    assert wrong.returncode == 1 and "Invalid credentials" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "fresh" / SHARD1).exists()
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    script = Path(weights_check.__file__)
    check = [sys.executable, "-S", str(script), str(local), str(tmp_path / "expected.json"), "--write-marker"]
    first = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stdout + first.stderr
    assert json.loads(first.stdout) == {"complete": True, "problems": [], "bad": [], "unverified": [], "hashed": len(expected["files"]),
                                         "trusted": 0}
    second = json.loads(subprocess.run(check, capture_output=True, text=True, timeout=60).stdout)
    assert second["hashed"] == 0 and second["trusted"] == len(expected["files"])
    with open(local / SHARD2, "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    third = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert third.returncode == 1 and json.loads(third.stdout)["problems"][0].startswith(SHARD2)


def test_sim_hub_command(root, tmp_path):
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "ct200twin", "hub", "--port", "0", "--root", str(root),
                             "--ready-file", str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        doc = json.loads(ready.read_text())
        assert doc["repos"][REPO] == commit_of(root)
        assert HfApi(endpoint=doc["url"], token=False).model_info(REPO).sha == doc["repos"][REPO]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "Traceback" not in err
    assert f"{REPO}\t{commit_of(root)}" in out
    assert "no Xet" in err and "not exercised here" in err     # the route it cannot serve, said
    bad = subprocess.run([sys.executable, "-m", "ct200twin", "hub", "--root", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "not a folder" in bad.stderr and "Traceback" not in bad.stderr
