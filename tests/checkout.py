"""Profiles by name, for tests, from the folder the `dsv4deploy` command would use: its settings
(dsv4deploy/cli/settings.py) built from the environment, so the `profile_dir` fixture's copy
(DSV4_PROFILES_DIR) when a test uses it, else the checkout's profiles/."""

from __future__ import annotations

import os
from pathlib import Path

from dsv4deploy.cli.settings import Settings
from dsv4deploy.profile import load


def settings() -> Settings:
    return Settings.from_environment(os.environ)


def profiles_dir() -> Path:
    return settings().profiles


def load_profile(name: str, directory: Path | None = None) -> load.Profile:
    return load.load_profile(name, directory or profiles_dir())


def list_profiles(directory: Path | None = None) -> list[str]:
    return load.list_profiles(directory or profiles_dir())
