"""Shared fixtures: a scratch copy of the shipped profiles that tests may add bad ones to."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    """profiles/ copied to a temp dir and made the profile search path; `.write(name, yaml)`."""
    target = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", target)
    monkeypatch.setenv("DSV4_PROFILES_DIR", str(target))

    class Dir:
        path = target

        @staticmethod
        def write(name: str, text: str) -> Path:
            path = target / f"{name}.yaml"
            path.write_text(textwrap.dedent(text).lstrip("\n"))
            return path

    return Dir


# --- order and background preparation ------------------------------------------------------------
# Tests that need the CT200 twin or SGLang's parser venv (marked `slow`) run last, in their own
# order; while the fast ones run, the twin's Debian root (mmdebstrap, under a minute on a fresh machine)
# and the parser venv are built in the background, so a fresh `make test` waits for neither.
# Tests that use the twin are also marked `twin`: `make test` runs them in a second pytest process
# beside the rest (they mostly wait on the twin; the rest mostly computes).

_prebuild: list = []
_threads: list = []


def _group(item) -> int:
    if item.get_closest_marker("slow"):
        return 2
    return 1 if item.get_closest_marker("timing") else 0


def pytest_collection_modifyitems(config, items):
    for item in items:                        # `make test` runs these in a process of their own
        if "sim_twin" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.twin)
    items.sort(key=_group)   # stable: each group keeps its order


@pytest.fixture(autouse=True)
def _quiet_machine_for_timing(request):
    """Throughput measured against the twin's model needs the CPUs: wait for the background builds."""
    if request.node.get_closest_marker("timing"):
        for thread in _threads:
            thread.join()
    yield


def pytest_collection_finish(session):
    import os
    import threading

    slow = [item for item in session.items if item.get_closest_marker("slow")]
    if not slow:
        return
    # the twins' root: for the default twin's tests, and for the isolated twins' (their own process)
    twin = any(item.get_closest_marker("twin") or item.get_closest_marker("fleet") for item in slow)
    parser = any(not item.get_closest_marker("twin") and not item.get_closest_marker("fleet") for item in slow)

    def build_root():
        from ct200twin.host import machines as simhost
        with simhost._locked():                 # `up` waits on the same lock, then finds it built
            simhost.ensure_rootfs()

    def build_parser():
        import sys
        sys.path.insert(0, str(REPO / "tests" / "tools"))
        import sglang_parser
        for version in sglang_parser.PREBUILT:
            sglang_parser.ensure(version)

    jobs = [build_parser] if parser else []
    if twin and os.geteuid() == 0:
        jobs.append(build_root)
    for job in jobs:
        def run(job=job):
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - the test that needs it builds again and reports
                _prebuild.append(f"{job.__name__}: {exc}")
        thread = threading.Thread(target=run, name=f"prebuild-{job.__name__}", daemon=True)
        thread.start()
        _threads.append(thread)
