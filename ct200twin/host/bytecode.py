"""The real venv's bytecode, compiled once on this machine for every twin (test bench only).

The deploy installs the real host's venv with ``--compile-bytecode`` (the service account cannot
write ``__pycache__``), and uv then compiles its 35,000 modules: about 75 CPU seconds, on each of
make test's three twins with the real venv, side by side on two cores (bench/results/
make-test-cpu-2026-12-06.md).

uv's compile step is compileall without ``force``: a ``.pyc`` whose header names its source's
mtime is kept. A twin's venv files are hard links of its uv cache, which ``uv_cache.share`` links
from this machine's, so a source file is one inode, with one mtime, on this machine and in every
twin's venv. ``compile_lock`` (run by ``uv_cache.warm``, once the release's wheels are here)
compiles each module of the release's lock once, from this machine's cache files, into a store of
its own (``.cache/twin-bytecode/archive-v0/<archive>/<path>/__pycache__/<module>.cpython-311.pyc``);
``link_into`` links it beside that source in a twin's cache, where uv's install links it into the
venv with its sources, and uv's compile step finds it current. The deploy's install is unchanged;
only its compile step has nothing left to do. This machine's own venvs are not touched (the store
is not its cache). Python fixes a module's code file name to its source's path at import, so the
store's names (the cache paths) are never seen. Off with the shared cache (DSV4_SIM_UV_CACHE=own),
and where this machine's python is not the twins' (3.11): the twin then compiles its own.

Stdlib only: make test runs ``uv_cache warm`` with a bare python3.
"""

from __future__ import annotations

import contextlib
import logging
import os
import py_compile
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ct200twin.host.files import _open_dirs

log = logging.getLogger("ct200twin.host")

PYC_TAG = sys.implementation.cache_tag          # cpython-311
ARCHIVES = "archive-v0"


def store_dir(cache: Path) -> Path:
    """The store beside this machine's uv cache (.cache/uv-cache -> .cache/twin-bytecode)."""
    return cache.parent / "twin-bytecode"


def pyc_name(source: str) -> str:
    return f"__pycache__/{source[:-3]}.{PYC_TAG}.pyc"


def _dists(folder: Path) -> set[str]:
    """The distributions (their .dist-info folders' names: name and version) FOLDER holds."""
    try:
        return {e.name for e in os.scandir(folder) if e.name.endswith(".dist-info") and e.is_dir(follow_symlinks=False)}
    except OSError:
        return set()


def _modules(folder: Path) -> list[str]:
    """Every .py file below FOLDER, relative to it (links not followed, no __pycache__)."""
    found: list[str] = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [os.path.relpath(os.path.join(top, name), folder) for name in files if name.endswith(".py")]
    return found


def _current(pyc: str, source: str) -> bool:
    """PYC's header names SOURCE's mtime and size (what both compileall and the import check)."""
    try:
        with open(pyc, "rb") as f:
            head = f.read(16)
        st = os.stat(source)
    except OSError:
        return False
    return (len(head) == 16 and head[4:8] == b"\0\0\0\0"
            and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFF_FFFF
            and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFF_FFFF)


def _compile(jobs: list[tuple[str, str]]) -> int:
    done = 0
    warnings.simplefilter("ignore")           # SyntaxWarnings of vendored code: uv ignores them too
    for source, pyc in jobs:
        if _current(pyc, source):
            continue
        with contextlib.suppress(py_compile.PyCompileError, OSError, ValueError, SyntaxError):
            py_compile.compile(source, cfile=pyc, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
            done += 1
    return done


def compile_lock(installed: Path, cache: Path, twin_python: str) -> int:
    """Compile every module of each archive in CACHE that holds a distribution INSTALLED holds (a
    folder uv filled from CACHE: the lock's packages) into the store. Every such archive: uv can
    unpack one wheel twice when two installs fetch it at once (make test's parser venvs and this
    warm), and a twin installs from whichever its pointer names. Returns the modules compiled (0
    where this python is not TWIN_PYTHON, the twins' "3.11")."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" != twin_python:
        log.warning("twin bytecode: this python is %d.%d, the twins' %s: each twin compiles its own",
                    *sys.version_info[:2], twin_python)
        return 0
    wanted = _dists(installed)
    store = store_dir(cache)
    jobs: list[tuple[str, str]] = []
    for archive in sorted((cache / ARCHIVES).iterdir()):
        if archive.name.startswith(".") or not (_dists(archive) & wanted):
            continue
        for rel in _modules(archive):
            pyc = store / ARCHIVES / archive.name / Path(rel).parent / pyc_name(Path(rel).name)
            jobs.append((str(archive / rel), str(pyc)))
    for folder in {str(Path(pyc).parent) for _, pyc in jobs}:
        os.makedirs(folder, exist_ok=True)
    workers = max(1, os.cpu_count() or 1)
    chunks = [jobs[i::workers * 8] for i in range(workers * 8)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(_compile, chunks))


def link_into(cache: Path, twin_archives_fd: int) -> int:
    """Link the store's bytecode into a twin's cache (its archive folder open as TWIN_ARCHIVES_FD,
    every folder below it opened without following links), each file
    only beside a source that is this machine's (the same inode, so the same mtime) and only
    where the twin has none. Returns the files linked."""
    store = store_dir(cache) / ARCHIVES
    if not store.is_dir():
        return 0
    linked = 0
    for top, _dirs, files in os.walk(store):
        if os.path.basename(top) != "__pycache__":
            continue
        rel_dir = os.path.relpath(os.path.dirname(top), store)      # <archive>/<path>
        parts = [p for p in rel_dir.split(os.sep) if p not in ("", ".")]
        try:
            src_fd = _open_dirs(twin_archives_fd, parts, create=False)
        except OSError:
            continue                                                # the twin lacks that archive
        try:
            pyc_fd = None
            for name in files:
                module = name[:-len(f".{PYC_TAG}.pyc")] + ".py"
                try:
                    theirs = os.stat(module, dir_fd=src_fd, follow_symlinks=False)
                    ours = os.stat(cache / ARCHIVES / rel_dir / module, follow_symlinks=False)
                except OSError:
                    continue
                if theirs.st_ino != ours.st_ino or theirs.st_dev != ours.st_dev:
                    continue                                        # the twin's own copy: it compiles it
                if pyc_fd is None:
                    pyc_fd = _open_dirs(src_fd, ["__pycache__"], create=True)
                with contextlib.suppress(FileExistsError):
                    os.link(os.path.join(top, name), name, dst_dir_fd=pyc_fd, follow_symlinks=False)
                    linked += 1
            if pyc_fd is not None:
                os.close(pyc_fd)
        finally:
            os.close(src_fd)
    return linked
