"""A twin's uv cache, warm (ct200twin/host/uv_cache.py): what this machine's uv cache holds is
hard-linked into the twin root's /var/cache/dsv4deploy/uv, the twin's own entries kept, nothing
followed out of the root; and what `warm` fetches is the release the default profile deploys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ct200twin.host import uv_cache
from checkout import load_profile


def _file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def here(tmp_path, monkeypatch):
    """This machine's uv cache (UV_CACHE_DIR) with an index page, a wheel's pointer and its archive."""
    cache = tmp_path / "uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(cache))
    monkeypatch.delenv("DSV4_SIM_UV_CACHE", raising=False)
    _file(cache / "simple-v28/pypi/torch.rkyv", "index page")
    _file(cache / "wheels-v8/pypi/torch/2.14.1-cp311.http", "pointer to AbC")
    _file(cache / "archive-v0/AbC/torch/__init__.py", "import torch")
    _file(cache / "archive-v0/AbC/torch-2.14.1.dist-info/RECORD", "record")
    _file(cache / "archive-v0/.tmpXyZ/half.py", "uv at work")            # not a finished archive
    _file(cache / "interpreter-v5/abc.msgpack", "this machine's python")   # not a download
    return cache


def _twin_cache(root: Path) -> Path:
    return root / "var/cache/dsv4deploy/uv"


def test_the_twin_gets_this_machines_files_as_links_and_keeps_its_own(here, tmp_path):
    root = tmp_path / "twin-root"
    own = _file(_twin_cache(root) / "wheels-v8/pypi/torch/2.14.1-cp311.http", "the twin's own pointer")
    assert uv_cache.share(root) == 3                # the page and the archive's two files; its own pointer kept
    twin = _twin_cache(root)
    assert own.read_text() == "the twin's own pointer"
    linked = twin / "archive-v0/AbC/torch/__init__.py"
    assert linked.read_text() == "import torch"
    assert os.stat(linked).st_ino == os.stat(here / "archive-v0/AbC/torch/__init__.py").st_ino   # no copy
    assert (twin / "simple-v28/pypi/torch.rkyv").is_file()
    assert not (twin / "archive-v0/.tmpXyZ").exists() and not (twin / "interpreter-v5").exists()
    assert [p.name for p in (twin / "archive-v0").iterdir()] == ["AbC"]      # no temporary left
    # a second boot links nothing new; an archive the twin has is left whole as it is
    (twin / "archive-v0/AbC/torch-2.14.1.dist-info/RECORD").unlink()
    assert uv_cache.share(root) == 0
    assert not (twin / "archive-v0/AbC/torch-2.14.1.dist-info/RECORD").exists()


def test_a_link_planted_where_the_cache_goes_is_not_followed(here, tmp_path):
    root, outside = tmp_path / "twin-root", tmp_path / "this-machine"
    outside.mkdir()
    (root / "var/cache").mkdir(parents=True)
    (root / "var/cache/dsv4deploy").symlink_to(outside)
    assert uv_cache.share(root) == 0
    assert list(outside.iterdir()) == []


def test_a_twin_of_its_own_cache_gets_nothing(here, tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_SIM_UV_CACHE", "own")
    root = tmp_path / "twin-root"
    assert uv_cache.share(root) == 0 and not _twin_cache(root).exists()


def test_warm_fetches_the_release_the_default_profile_deploys():
    version = load_profile("nvfp4-ctx8k").data["sglang"]["version"]
    assert version in uv_cache.WARM_VERSIONS
    assert (uv_cache.LOCKS / f"{version}.lock").is_file()


def test_the_lock_is_compiled_once_here_and_each_twin_venv_finds_its_bytecode_current(here, tmp_path):
    """uv_cache.warm compiles what the lock installed (hard links of this machine's cache) into a
    store of its own; share links it beside the same source files in a twin's cache; the venv
    uv links from there has bytecode that compileall (uv's compile step, not forced) keeps."""
    import compileall
    import sys

    from ct200twin.host import bytecode
    installed = tmp_path / "warm-target"
    (installed / "torch-2.14.1.dist-info").mkdir(parents=True)                  # what the lock installed
    _file(here / "archive-v0/Other/other.py", "x = 1")              # another venv's package: not compiled
    _file(here / "archive-v0/Other/other-1.0.dist-info/RECORD", "record")
    # the same wheel unpacked twice (two installs fetched it at once): a twin may use either
    _file(here / "archive-v0/Twice/torch/__init__.py", "import torch")
    _file(here / "archive-v0/Twice/torch-2.14.1.dist-info/RECORD", "record")
    twin_python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert bytecode.compile_lock(installed, here, twin_python) == 2
    assert bytecode.compile_lock(installed, here, twin_python) == 0        # current: not again
    assert bytecode.compile_lock(installed, here, "2.7") == 0               # not the twins' python
    pyc = bytecode.store_dir(here) / "archive-v0/AbC/torch/__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    assert pyc.is_file() and not (here / "archive-v0/AbC/torch/__pycache__").exists()   # this machine's cache untouched
    assert not list(bytecode.store_dir(here).rglob("other*.pyc"))

    root = tmp_path / "twin-root"
    root.mkdir()
    uv_cache.share(root)
    twin_pyc = _twin_cache(root) / "archive-v0/AbC/torch/__pycache__" / pyc.name
    assert os.stat(twin_pyc).st_ino == os.stat(pyc).st_ino
    # the venv's files are links of the twin's cache (uv's install): compileall keeps the bytecode
    venv = tmp_path / "venv/torch"
    (venv / "__pycache__").mkdir(parents=True)
    os.link(_twin_cache(root) / "archive-v0/AbC/torch/__init__.py", venv / "__init__.py")
    os.link(twin_pyc, venv / "__pycache__" / pyc.name)
    assert compileall.compile_file(str(venv / "__init__.py"), quiet=2, force=False)
    assert os.stat(venv / "__pycache__" / pyc.name).st_ino == os.stat(pyc).st_ino      # not rewritten


def test_bytecode_goes_only_beside_this_machines_source_files(here, tmp_path):
    """A twin archive of its own (its files are not this machine's: another mtime) gets no bytecode
    of the store's: the twin compiles it itself."""
    import sys

    from ct200twin.host import bytecode
    installed = tmp_path / "warm-target"
    (installed / "torch-2.14.1.dist-info").mkdir(parents=True)
    assert bytecode.compile_lock(installed, here, f"{sys.version_info[0]}.{sys.version_info[1]}") == 1
    root = tmp_path / "twin-root"
    _file(_twin_cache(root) / "archive-v0/AbC/torch/__init__.py", "import torch")     # the twin's own copy
    uv_cache.share(root)
    assert not (_twin_cache(root) / "archive-v0/AbC/torch/__pycache__").exists()
