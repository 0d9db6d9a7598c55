"""A twin's uv cache, warm: the twin is a host that has installed the release's wheels before.

The deploy fills its venvs with the host's uv and the host's cache, /var/cache/dsv4deploy/uv
(dsv4deploy/host/installer.py). A fresh twin's cache is empty, so every twin's first deploy of
the real venv (the release's hashed lock, about 10 GB unpacked) downloaded it from PyPI and
unpacked it again: 2-3 minutes a twin, on the twins that make test runs side by side.

Here, at each boot (``up``), what this machine's uv cache holds (.cache/uv-cache: the control
venv's, the parser venvs', and the hosts' locks that ``warm`` fetched) is hard-linked into the
twin's cache, where its uv looks; the twin's own entries are kept. The deploy does not know: its
uv still reads the index, checks every wheel against the lock's sha256, downloads what the cache
lacks, and hard-links the venv from the twin's own cache (one file system inside the twin), as on
a host that installed before. Hard links, not a bind mount: a venv can be hard-linked only from a
cache on its own mount, so a shared bind-mounted cache would be copied into every venv (30 s and
10 GB more each, measured).

The release's bytecode comes along: ``warm`` compiles the lock's modules once into a store
beside the cache, and ``share`` links each file beside its source (ct200twin/host/bytecode.py).

The links share this machine's files: uv never rewrites a cached file (it writes a new one and
renames it), and neither does patch(1) in a venv, so nothing a deploy does in a twin changes them.
Every link is made below directory descriptors opened without following links (code in the twin
runs as root and may plant them). Skipped, with a line in the log, where .sim and the cache are on
different file systems. DSV4_SIM_UV_CACHE=own: a twin's cache stays its own (a host that never
installed), e.g. to measure a cold install.

    python -m ct200twin.host.uv_cache warm [VERSION ...]   # the hosts' locks into this machine's cache

Stdlib only at module level: make test runs ``warm`` with a bare python3 from its first second.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ct200twin.host import bytecode
from ct200twin.host.files import _open_dirs
from ct200twin.host.layout import REPO_ROOT

log = logging.getLogger("ct200twin.host")

TWIN_CACHE = "var/cache/dsv4deploy/uv"          # the host's (dsv4deploy/host/installer.py CACHE), in a twin root
# uv's buckets that hold what was downloaded: the index pages, the wheels' pointers, the unpacked
# wheels (archive-v*, linked last: a pointer is written after its archive, so every pointer linked
# names an archive that exists by then; uv fetches again for one that does not)
POINTERS = ("simple-v", "wheels-v")
ARCHIVES = "archive-v"
# The release the shipped profiles deploy (tests/test_uv_cache.py checks it against nvfp4-ctx8k)
WARM_VERSIONS = ("0.5.23",)
LOCKS = REPO_ROOT / "dsv4deploy" / "data" / "sglang"
PYPI = "https://pypi.org/simple"
# The twins' root: Debian bookworm, its python3 (3.11) and glibc (2.36) pick the wheels
TWIN_PYTHON = "3.11"
TWIN_PLATFORM = "x86_64-manylinux_2_36"
WAIT_S = 900.0


def _home():
    from dsv4deploy.host import uvpip          # stdlib only; imported late, as the Makefile runs this bare
    return uvpip, uvpip.UvHome.of(os.environ, REPO_ROOT)


def cache_dir() -> Path:
    return _home()[1].cache


def warm_lock() -> Path:
    """Held by ``warm`` while it fetches: ``share(wait=True)`` waits for it."""
    return cache_dir().parent / "uv-warm.lock"


def shared() -> bool:
    return os.environ.get("DSV4_SIM_UV_CACHE", "shared") != "own"


@contextlib.contextmanager
def _locked(exclusive: bool, wait_s: float) -> Iterator[bool]:
    """The warm lock (True once held; False when WAIT_S ran out)."""
    path = warm_lock()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(1)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def warm(versions: tuple[str, ...] = WARM_VERSIONS) -> float:
    """Fetch each VERSION's host lock (data/sglang/VERSION.lock) into this machine's uv cache, as a
    twin's uv would pick the wheels (its Python and platform), from PyPI as the twin reaches it,
    hash-checked: installed into a scratch folder (--target) and the folder removed. Returns the
    seconds it took."""
    uvpip, home = _home()
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1")
    with _locked(exclusive=True, wait_s=WAIT_S):
        for version in versions:
            lock = LOCKS / f"{version}.lock"
            with tempfile.TemporaryDirectory(prefix=".uv-warm-", dir=home.cache.parent) as target:
                argv = [str(uvpip.uv(home)), "pip", "install", "--quiet", "--cache-dir", str(home.cache),
                        "--index-url", PYPI, "--system-certs", "--only-binary", ":all:", "--require-hashes",
                        "--target", target, "--python-version", TWIN_PYTHON, "--python-platform", TWIN_PLATFORM,
                        "-r", str(lock)]
                print("$ " + " ".join(argv), flush=True)
                subprocess.run(argv, env=env, check=True)
                if shared():         # while the folder holds the lock's files: their bytecode, once
                    began = time.monotonic()
                    done = bytecode.compile_lock(Path(target), home.cache, TWIN_PYTHON)
                    print(f"twin bytecode: {done} modules compiled in {time.monotonic() - began:.0f} s "
                          f"({bytecode.store_dir(home.cache)})", flush=True)
    return time.monotonic() - started


def share(root: Path, wait: bool = False) -> int:
    """Hard-link what this machine's uv cache holds into the twin ROOT's cache, entries it lacks
    only; WAIT: first let a running ``warm`` finish (up to WAIT_S). Returns the files linked."""
    if not shared():
        return 0
    source = cache_dir()
    if not source.is_dir():
        return 0
    with _locked(exclusive=False, wait_s=WAIT_S if wait else 0) as held:
        if wait and not held:
            log.warning("uv cache: %s still held after %.0f s: the twin's cache gets what is there",
                        warm_lock(), WAIT_S)
        started = time.monotonic()
        try:
            linked = _link_cache(source, root)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                log.info("uv cache: %s and %s are on different file systems: the twin keeps its own", source, root)
            else:       # e.g. a link planted in the twin where its cache goes: nothing is followed
                log.warning("uv cache: not linked into %s/%s: %s", root, TWIN_CACHE, exc)
            return 0
    if linked:
        log.info("%s: uv cache: %d files linked from %s in %.1f s", root.parent.name, linked, source,
                 time.monotonic() - started)
    return linked


def _link_cache(source: Path, root: Path) -> int:
    buckets = sorted(p.name for p in source.iterdir() if p.is_dir() and p.name.startswith(POINTERS + (ARCHIVES,)))
    buckets.sort(key=lambda name: name.startswith(ARCHIVES))       # the archives last
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        cache_fd = _open_dirs(root_fd, TWIN_CACHE.split("/"))
    finally:
        os.close(root_fd)
    try:
        linked = sum(_link_tree(source / name, cache_fd, name, whole=name.startswith(ARCHIVES)) for name in buckets)
        if bytecode.ARCHIVES in buckets:
            archives_fd = _open_dirs(cache_fd, [bytecode.ARCHIVES], create=False)
            try:
                linked += bytecode.link_into(source, archives_fd)
            finally:
                os.close(archives_fd)
        return linked
    finally:
        os.close(cache_fd)


def _link_tree(src: Path, parent_fd: int, name: str, whole: bool) -> int:
    """Link SRC's files into NAME below PARENT_FD, missing ones only. WHOLE: SRC's entries are
    archives (unpacked wheels, never changed once in place): one the twin has is skipped whole, a
    new one is linked under a temporary name and renamed into place."""
    linked = 0
    fd = _open_dirs(parent_fd, [name])
    try:
        for entry in os.scandir(src):
            if entry.name.startswith(".tmp") or entry.name.endswith(".lock"):
                continue                                   # uv's work in progress and its locks
            if entry.is_dir(follow_symlinks=False):
                if not whole:
                    linked += _link_tree(Path(entry.path), fd, entry.name, whole=False)
                    continue
                if _exists(fd, entry.name):
                    continue
                tmp = f".tmp-dsv4deploy-{os.getpid()}-{entry.name}"
                _remove(fd, tmp)
                linked += _link_tree(Path(entry.path), fd, tmp, whole=False)
                os.rename(tmp, entry.name, src_dir_fd=fd, dst_dir_fd=fd)
            elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                with contextlib.suppress(FileExistsError):
                    if entry.is_symlink():
                        os.symlink(os.readlink(entry.path), entry.name, dir_fd=fd)
                    else:
                        os.link(entry.path, entry.name, dst_dir_fd=fd, follow_symlinks=False)
                    linked += 1
    finally:
        os.close(fd)
    return linked


def _exists(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _remove(fd: int, name: str) -> None:
    """NAME below FD gone (a temporary folder an interrupted share left), links not followed."""
    if not _exists(fd, name):
        return
    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    try:
        for entry in os.scandir(sub):
            if entry.is_dir(follow_symlinks=False):
                _remove(sub, entry.name)
            else:
                os.unlink(entry.name, dir_fd=sub)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=fd)


def main(argv: list[str]) -> int:
    if argv[:1] != ["warm"]:
        print("usage: python -m ct200twin.host.uv_cache warm [VERSION ...]", file=sys.stderr)
        return 2
    versions = tuple(argv[1:]) or WARM_VERSIONS
    missing = [v for v in versions if not (LOCKS / f"{v}.lock").is_file()]
    if missing:
        print(f"uv cache: no host lock for {', '.join(missing)} in {LOCKS}", file=sys.stderr)
        return 2
    try:
        took = warm(versions)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"uv cache: warming failed ({exc}); the twins download what their caches lack", file=sys.stderr)
        return 1
    print(f"uv cache: {', '.join(versions)} warm in {took:.0f} s ({cache_dir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
