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
