"""What a render gives the host: the Rendered release (with `replicas:`, each replica and the
gateway too), and its launch manifest, which names every other rendered file by its sha256.
Made by render/unit.py (a single server) and render/replicas.py (a replica set).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from dsv4deploy import __version__
from dsv4deploy.profile.load import Profile


@dataclass(frozen=True)
class RenderedReplica:
    """One replica: instance `<service>@<index>`, its GPUs, port, resolved argv and env files."""

    index: int
    instance: str
    gpus: tuple[int, ...]
    port: int
    url: str
    argv: list[str]
    env_file: str
    nccl_env_file: str


@dataclass(frozen=True)
class RenderedGateway:
    """The smg gateway: its unit, argv (key from a credential), venv and public endpoint."""

    service: str
    unit_path: str
    unit: str
    argv: list[str]
    version: str
    venv: str
    lock_sha256: str | None
    launcher: str
    endpoint: str
    metrics: str
    worker_urls: list[str]


@dataclass(frozen=True)
class Rendered:
    """Everything the host gets for one profile; `files` maps host path -> content."""

    argv: list[str]
    unit: str
    nccl_env: str
    manifest: str
    files: dict[str, str]
    # With `replicas:` (render/replicas.py): `unit` is the template <service>@.service, `argv` and
    # `nccl_env` are replica 0's, and each replica and the gateway are described here.
    replicas: tuple[RenderedReplica, ...] = ()
    gateway: RenderedGateway | None = None


def manifest_base(profile: Profile, layout, module: str, argv: list[str]) -> dict:
    """What every launch manifest says: the profile, versions, argv, model, venv."""
    data = profile.data
    return {"profile": profile.name, "content_hash": profile.content_hash, "profile_files": list(profile.files),
            "dsv4deploy_version": __version__, "sglang_version": data["sglang"]["version"],
            "patchset": layout.patchset, "module": module, "argv": argv,
            "model": {"repo": data["model"]["repo"], "revision": data["model"]["revision"], "path": layout.model_dir},
            "venv": layout.venv}


def manifest_text(doc: dict, files: dict[str, str]) -> str:
    """The manifest as written: DOC plus the sha256 of every other rendered file."""
    return json.dumps({**doc, "files": {path: hashlib.sha256(text.encode()).hexdigest()
                                        for path, text in sorted(files.items())}}, indent=2, sort_keys=True) + "\n"
