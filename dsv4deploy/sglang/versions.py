"""What each SGLang release accepts, kept as data (data/sglang/): its option strings, dumped
from the release's own parser, and a few facts (versions.yaml). A version with no data is
refused: guessing flag spellings is how launch scripts broke in the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import yaml

from dsv4deploy import PACKAGE_DATA

_DIR = PACKAGE_DATA / "sglang"


@dataclass(frozen=True)
class VersionFacts:
    version: str
    flags: frozenset[str]
    cuda_graph_max_bs_flag: str
    has_ready_endpoint: bool
    nvfp4_dsv4_moe: bool
    moe_runner_backends: tuple[str, ...]
    secrets_mask_patch: str | None = None   # sha256 of the patch that masks api_key in logs
    nvfp4_dsv4_moe_patch: str | None = None  # sha256 of the PR #25820 backport (releases without it)
    min_driver_branch: int = 0
    prepare_without_gpu: bool = False       # prepare_server_args runs on a machine without a GPU
    venv_gib: float | None = None           # the venv's installed size, measured (None: not yet)
    arity: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def accepts(self, flag: str) -> bool:
        return flag in self.flags

    def takes(self, flag: str) -> str | None:
        """How many argv words `flag` takes ('0', '1', '?', '*', '+'), None when not known."""
        return self.arity.get(flag)


@cache
def _table() -> dict:
    return yaml.safe_load((_DIR / "versions.yaml").read_text()) or {}


def version_key(version: str) -> tuple[int, ...]:
    """`0.5.13.post1` -> (0, 5, 13, 1), `0.5.14` -> (0, 5, 14, 0): release order."""
    parts = version.split(".")
    post = int(parts[3][4:]) if len(parts) > 3 and parts[3].startswith("post") else 0
    return (*(int(x) for x in parts[:3]), post)


def known_versions() -> list[str]:
    return sorted((v for v in _table() if (_DIR / f"{v}.flags").is_file()), key=version_key)


@cache
def facts(version: str) -> VersionFacts | None:
    entry = _table().get(version)
    flag_file = _DIR / f"{version}.flags"
    if entry is None or not flag_file.is_file():
        return None
    flags = frozenset(line.strip() for line in flag_file.read_text().splitlines() if line.strip())
    arity_file = _DIR / f"{version}.arity"
    arity = dict(line.split() for line in arity_file.read_text().splitlines()
                 if line.strip()) if arity_file.is_file() else {}
    return VersionFacts(
        version=version,
        flags=flags,
        cuda_graph_max_bs_flag=entry["cuda_graph_max_bs_flag"],
        has_ready_endpoint=bool(entry["has_ready_endpoint"]),
        nvfp4_dsv4_moe=bool(entry["nvfp4_dsv4_moe"]),
        moe_runner_backends=tuple(entry.get("moe_runner_backends") or ()),
        secrets_mask_patch=entry.get("secrets_mask_patch"),
        nvfp4_dsv4_moe_patch=entry.get("nvfp4_dsv4_moe_patch"),
        min_driver_branch=int(entry.get("min_driver_branch") or 0),
        prepare_without_gpu=bool(entry.get("prepare_without_gpu")),
        venv_gib=float(entry["venv_gib"]) if entry.get("venv_gib") is not None else None,
        arity=arity,
    )


def venv_gib(version: str) -> float:
    """What the release's venv takes on disk, for the disk check: its measured figure, else the
    largest measured one of any release (they all hold CUDA torch and its wheels)."""
    figures = {v: float(e["venv_gib"]) for v, e in _table().items() if (e or {}).get("venv_gib") is not None}
    return figures.get(version) or max(figures.values())


def lock_file(version: str):
    """The release's lock file (data/sglang/<version>.lock: every package its venv holds, SGLang
    included, pinned with the sha256 of each file, for Python 3.11 and 3.12 on Linux x86_64;
    installed whole with --require-hashes), or None when none is shipped (uv then resolves
    SGLang's own requirements). tests/tools/sglang_lock.py (make lock) writes it."""
    path = _DIR / f"{version}.lock"
    return path if path.is_file() else None


@cache
def lock_sha256(version: str) -> str | None:
    path = lock_file(version)
    if path is None:
        return None
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()
