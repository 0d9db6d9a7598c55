"""What the local hub (:mod:`.hub`) serves: a folder as one model repo at one commit. Every
visible file is hashed once (sha256 and git blob sha1; LFS files by their pointer's sha1, as the
real hub's "oid"), and the commit is a sha1 of the paths and sha256s, so the same content always
has the same commit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

LFS_SUFFIXES = (".safetensors",)
CHUNK = 1 << 20


@dataclass(frozen=True)
class HubFile:
    path: str          # relative, "/"-separated
    size: int
    sha256: str
    blob_id: str       # git blob sha1 (of the LFS pointer for LFS files), as the hub's "oid"
    lfs: bool
    pointer_size: int | None = None

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _hash_file(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, read once."""
    size = path.stat().st_size
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha256.update(chunk)
            sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest()


@dataclass(frozen=True)
class HubRepo:
    """One repo at one commit: a folder's files with their hashes."""

    repo_id: str
    folder: Path
    commit: str
    files: dict[str, HubFile]
    last_modified: str

    def branches(self) -> dict[str, str]:
        return {"main": self.commit}

    def resolve(self, revision: str) -> str | None:
        """The commit a revision names (the commit itself, a branch, refs/heads/<branch>), or None."""
        if revision == self.commit:
            return self.commit
        return self.branches().get(revision.removeprefix("refs/heads/"))

    def expected(self) -> dict[str, dict]:
        """What :func:`dsv4deploy.weights.check.verify` takes: path -> size, sha256 (LFS), blob_id."""
        return {f.path: {"size": f.size, "sha256": f.sha256 if f.lfs else None, "blob_id": f.blob_id}
                for f in self.files.values()}


def visible(rel: Path) -> bool:
    """Served: no part of the path starts with "." (hidden files and folders are not part of the repo)."""
    return not any(part.startswith(".") for part in rel.parts)


def scan_repo(repo_id: str, folder: Path, lfs_suffixes=LFS_SUFFIXES, _cache: dict | None = None) -> HubRepo:
    """Hash every visible file of `folder` (a cache keyed by (size, mtime_ns, inode) skips
    unchanged files) and derive the commit from the paths and sha256s."""
    files: dict[str, HubFile] = {}
    newest = 0
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not visible(rel) or not p.is_file() or p.is_symlink():
            continue
        st = p.stat()
        newest = max(newest, st.st_mtime_ns)
        key = (str(p), st.st_size, st.st_mtime_ns, st.st_ino)
        cached = _cache.get(key) if _cache is not None else None
        if cached is None:
            sha256, sha1 = _hash_file(p)
            lfs = p.name.endswith(tuple(lfs_suffixes))
            pointer = lfs_pointer(sha256, st.st_size) if lfs else None
            cached = HubFile(path=rel.as_posix(), size=st.st_size, sha256=sha256,
                             blob_id=_git_blob_sha1(pointer) if lfs else sha1, lfs=lfs,
                             pointer_size=len(pointer) if lfs else None)
            if _cache is not None:
                _cache[key] = cached
        files[cached.path] = cached
    digest = hashlib.sha1()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].sha256}\n".encode())
    stamp = datetime.fromtimestamp(newest / 1e9 if newest else 0, tz=timezone.utc)
    return HubRepo(repo_id=repo_id, folder=folder, commit=digest.hexdigest(), files=files,
                   last_modified=stamp.strftime("%Y-%m-%dT%H:%M:%S.000Z"))


def repo_id_of(folder_name: str) -> str | None:
    """`org--name` -> `org/name` (the layout of .sim/checkpoints); None for other names."""
    org, sep, name = folder_name.partition("--")
    return f"{org}/{name}" if sep and org and name and not org.startswith(".") else None
