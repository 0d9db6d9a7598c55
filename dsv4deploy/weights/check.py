# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""Is a downloaded checkpoint complete and intact? Size and sha256 of every file, against the
hub's metadata for the pinned commit.

Pure and standard-library only, so the same file runs on the host with its system python3:

    python3 weights_check.py DIR EXPECTED.json [--marker FILE] [--write-marker] [--no-hash]

prints ``{"complete": bool, "problems": [...], "unverified": [...], "hashed": N, "trusted": M}``
and exits 0 when complete, 1 when not, 2 on bad arguments.

``EXPECTED.json`` maps each file of the repo to what the hub says about it::

    {"commit": "<40 hex>", "files": {"model-00001-of-00046.safetensors":
        {"size": 3459212345, "sha256": "<64 hex>", "blob_id": "<40 hex>"}, ...}}

(:func:`expected_from_model_info` builds it from ``HfApi().model_info(repo, revision=commit,
files_metadata=True)``; a bare ``{path: {...}}`` mapping is accepted too).  LFS files (the
shards) carry ``sha256``; small files carry only the git ``blob_id``, which is checked as git
computes it (sha1 of ``"blob <size>\\0" + content``).  Files in the folder that the repo does not
name (``.cache/``, markers) are ignored.

Hashing 149 GiB takes minutes, so the check leaves a marker recording each verified file's size,
mtime, inode and digest, rewritten after every file it proves (a verify cut halfway keeps what it
proved): a later check trusts a file whose stat and expected digest still match the marker and
hashes only the others. ``--no-hash`` (the deploy's host read, under its time cap) hashes nothing:
a file of the right size the marker does not vouch for is listed as ``unverified`` (not complete),
for the deploy's verify step, which hashes it with one progress line per file (``--progress``).  huggingface_hub's own ``hf download --local-dir`` never
re-checks a file it already has (same commit in its metadata => returned as is), which is why a
corrupted shard is only caught here.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

MARKER = ".dsv4deploy-verified.json"
CHUNK = 8 << 20


def expected_from_model_info(info) -> dict:
    """{"commit", "files"} from a huggingface_hub ModelInfo fetched with files_metadata=True
    (or the JSON of /api/models/{repo}/revision/{rev}?blobs=true)."""
    def get(obj, *names):
        for name in names:
            value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
            if value is not None:
                return value
        return None

    files = {}
    for s in get(info, "siblings") or []:
        lfs = get(s, "lfs")
        size = get(s, "size")
        if size is None:
            raise ValueError(f"{get(s, 'rfilename')}: no size in the metadata (fetch it with files_metadata=True)")
        files[get(s, "rfilename")] = {"size": int(size), "sha256": get(lfs, "sha256") if lfs else None,
                                      "blob_id": get(s, "blob_id", "blobId")}
    return {"commit": get(info, "sha"), "files": files}


def _files_of(expected: dict) -> dict:
    files = expected.get("files") if isinstance(expected.get("files"), dict) else expected
    for path, meta in files.items():
        if not isinstance(meta, dict) or not isinstance(meta.get("size"), int):
            raise ValueError(f"{path}: expected {{size, sha256 or blob_id}}")
        if not meta.get("sha256") and not meta.get("blob_id"):
            raise ValueError(f"{path}: neither sha256 nor blob_id: the content cannot be checked")
    return files


def _unsafe(path: str) -> bool:
    p = Path(path)
    return p.is_absolute() or ".." in p.parts or not path or "\0" in path


def _digest(path: Path, meta: dict) -> tuple[str, str]:
    """(algorithm, hex digest) of a file as the metadata checks it: sha256 when known, else git blob sha1."""
    if meta.get("sha256"):
        h = hashlib.sha256()
        algo = "sha256"
    else:
        h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
        algo = "git-sha1"
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return algo, h.hexdigest()


def _want(meta: dict) -> tuple[str, str]:
    return ("sha256", meta["sha256"].lower()) if meta.get("sha256") else ("git-sha1", meta["blob_id"].lower())


def _stat_key(st: os.stat_result) -> list:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def check(local_dir, expected: dict, *, marker: dict | None = None, workers: int = 4, hash_files: bool = True,
          on_verified=None) -> dict:
    """The full result: ``complete``, ``problems`` (one line each, sorted by file), ``unverified``
    (right size, not hashed: HASH_FILES off), ``hashed``, ``trusted`` (files the marker vouched
    for), and ``marker`` (every verified file's record). ON_VERIFIED(marker, rel, done, total) is
    called after each file hashed good or bad (the marker so far: written at once by the CLI)."""
    root = Path(local_dir)
    files = _files_of(expected)
    trusted_files = (marker or {}).get("files", {}) if isinstance(marker, dict) else {}
    problems: dict[str, str] = {}
    bad: set[str] = set()          # present but wrong: a new download must replace them
    to_hash: list[tuple[str, Path, dict]] = []
    record: dict[str, dict] = {}
    trusted = 0
    if not root.is_dir():
        return {"complete": False, "problems": [f"{root}: not a folder"], "bad": [], "hashed": 0, "trusted": 0,
                "marker": None}
    for rel, meta in sorted(files.items()):
        if _unsafe(rel):
            problems[rel] = f"{rel!r}: not a relative path inside the checkpoint"
            continue
        p = root / rel
        try:
            st = p.stat()
        except OSError:
            problems[rel] = f"{rel}: missing"
            continue
        if not p.is_file():
            problems[rel] = f"{rel}: not a regular file"
            continue
        if st.st_size != meta["size"]:
            problems[rel] = f"{rel}: {st.st_size} bytes, expected {meta['size']}"
            bad.add(rel)
            continue
        algo, want = _want(meta)
        seen = trusted_files.get(rel)
        if isinstance(seen, dict) and seen.get("stat") == _stat_key(st) and seen.get(algo) == want:
            record[rel] = seen
            trusted += 1
            continue
        to_hash.append((rel, p, meta))
    unverified = [] if hash_files else [rel for rel, _p, _m in to_hash]
    if not hash_files:
        to_hash = []

    def work(item):
        rel, p, meta = item
        try:
            return rel, p, _digest(p, meta), None
        except OSError as exc:
            return rel, p, None, exc

    if to_hash:     # imported here: a check the marker answers whole (a re-deploy's) starts faster
        from concurrent.futures import ThreadPoolExecutor

        commit = expected.get("commit") if "files" in expected else None
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for done, (rel, p, got, exc) in enumerate(pool.map(work, to_hash), 1):
                if exc is not None:
                    problems[rel] = f"{rel}: cannot read ({exc.strerror or exc})"
                    continue
                algo, want = _want(files[rel])
                if got[1] != want:
                    problems[rel] = f"{rel}: {algo} {got[1]}, expected {want} (corrupt or a different revision)"
                    bad.add(rel)
                else:
                    record[rel] = {"stat": _stat_key(p.stat()), algo: want}
                if on_verified:
                    on_verified({"commit": commit, "files": dict(record)}, rel, done, len(to_hash))
    complete = not problems and not unverified
    return {"complete": complete, "problems": [problems[k] for k in sorted(problems)], "bad": sorted(bad),
            "unverified": unverified, "hashed": len(to_hash), "trusted": trusted,
            "marker": {"commit": expected.get("commit") if "files" in expected else None, "files": record}}


def verify(local_dir, expected: dict, *, marker: dict | None = None, workers: int = 4) -> list[str]:
    """Problems with the checkpoint in `local_dir` (empty: complete and intact)."""
    return check(local_dir, expected, marker=marker, workers=workers)["problems"]


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="weights_check", description=__doc__.splitlines()[0])
    parser.add_argument("local_dir")
    parser.add_argument("expected", help="JSON file (or - for stdin): {commit, files: {path: {size, sha256, blob_id}}}")
    parser.add_argument("--marker", help=f"marker file (default LOCAL_DIR/{MARKER})")
    parser.add_argument("--write-marker", action="store_true", help="write the marker when complete")
    parser.add_argument("--remove-bad", action="store_true",
                        help="delete files whose size or digest is wrong (a download then fetches them again)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--no-hash", action="store_true",
                        help="hash nothing: files of the right size the marker does not vouch for are 'unverified'")
    parser.add_argument("--progress", action="store_true", help="one line on stderr per file hashed")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.expected == "-" else Path(args.expected).read_text()
        expected = json.loads(text)
        _files_of(expected)
    except (OSError, ValueError, AttributeError) as exc:
        print(f"weights_check: {args.expected}: {exc}", file=sys.stderr)
        return 2
    marker_path = Path(args.marker) if args.marker else Path(args.local_dir) / MARKER
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError):
        marker = None
    def write(doc: dict) -> None:
        tmp = marker_path.with_name(marker_path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, marker_path)

    def verified(doc: dict, rel: str, done: int, total: int) -> None:
        if args.write_marker:
            write(doc)          # one record per file, at once: a verify cut here keeps what it proved
        if args.progress:
            print(f"weights_check: verified {done}/{total} {rel}"
                  + ("" if rel in doc["files"] else ": MISMATCH"), file=sys.stderr, flush=True)

    result = check(args.local_dir, expected, marker=marker, workers=args.workers, hash_files=not args.no_hash,
                   on_verified=verified)
    if args.write_marker and result["hashed"]:
        write(result["marker"])
    if args.remove_bad:
        for rel in result["bad"]:
            (Path(args.local_dir) / rel).unlink(missing_ok=True)    # _unsafe paths never reach "bad"
    print(json.dumps({k: v for k, v in result.items() if k != "marker"}))
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
