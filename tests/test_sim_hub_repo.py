"""ct200twin/host/hub_repo.py: a folder as one model repo at one commit, hashed as the real hub
and git name its files (the client checks a download against these)."""

import hashlib
import subprocess

from ct200twin.host.hub_repo import lfs_pointer, repo_id_of, scan_repo


def test_the_commit_follows_the_content(tmp_path):
    folder = tmp_path / "a--b"
    folder.mkdir()
    (folder / "x.json").write_text("1")
    first = scan_repo("a/b", folder).commit
    assert scan_repo("a/b", folder).commit == first
    (folder / "x.json").write_text("2")
    assert scan_repo("a/b", folder).commit != first
    (folder / ".hidden").write_text("not served")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "y.json").write_text("not served either")
    assert sorted(scan_repo("a/b", folder).files) == ["x.json"]


def test_blob_ids_are_gits_and_an_lfs_file_is_named_by_its_pointer(tmp_path):
    """A small file's oid is `git hash-object` of it; a safetensors file's is that of its LFS
    pointer, and its ETag is its sha256, as on the real hub."""
    folder = tmp_path / "org--model"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}\n')
    shard = folder / "model-00001.safetensors"
    shard.write_bytes(bytes(range(256)) * 4096)
    repo = scan_repo("org/model", folder)
    git = lambda path: subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True,
                                      check=True).stdout.strip()
    config, weights = repo.files["config.json"], repo.files["model-00001.safetensors"]
    assert config.blob_id == git(folder / "config.json") and not config.lfs and config.etag == config.blob_id
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    pointer = tmp_path / "pointer"
    pointer.write_bytes(lfs_pointer(digest, shard.stat().st_size))
    assert weights.lfs and weights.sha256 == weights.etag == digest and weights.size == 1 << 20
    assert weights.blob_id == git(pointer) and weights.pointer_size == pointer.stat().st_size
    assert repo.expected()["model-00001.safetensors"] == {"size": 1 << 20, "sha256": digest, "blob_id": weights.blob_id}
    assert repo.resolve("main") == repo.resolve("refs/heads/main") == repo.resolve(repo.commit) == repo.commit
    assert repo.resolve("v2") is None


def test_folder_names_map_to_repo_ids():
    assert repo_id_of("deepseek-ai--DeepSeek-V4-Flash") == "deepseek-ai/DeepSeek-V4-Flash"
    assert [repo_id_of(n) for n in ("plain", "--x", "x--", ".hidden--x")] == [None, None, None, None]
