"""The model and GPU catalog (data/catalog.yaml): facts profiles should not repeat."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import yaml

from dsv4deploy import PACKAGE_DATA
from dsv4deploy.profile import memory_facts

# The Flash checkpoints' memory figures live in memory_facts (with their sources), which the
# twin's server computes from too; a catalog entry may still name its own.
MEMORY_DEFAULTS = {"size_gib": memory_facts.WEIGHTS_TOTAL_GIB, "replicated_gib": memory_facts.REPLICATED_GIB,
                   "kv_bytes_per_token": memory_facts.KV_BYTES_PER_TOKEN}


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    memory_mib: int
    compute_cap: str
    min_driver_branch: int
    interconnect: str


@dataclass(frozen=True)
class Model:
    repo: str
    description: str
    size_gib: float
    shards: int
    replicated_gib: float
    max_context: int
    attention_heads: int
    kv_bytes_per_token: float
    quantization_flag: str | None
    architecture: str


@cache
def _catalog() -> dict:
    return yaml.safe_load((PACKAGE_DATA / "catalog.yaml").read_text())


def gpu(key: str) -> Gpu:
    return Gpu(key=key, **_catalog()["gpus"][key])


def model(repo: str) -> Model | None:
    entry = _catalog()["models"].get(repo)
    return Model(repo=repo, **{**MEMORY_DEFAULTS, **entry}) if entry else None


def model_repos() -> list[str]:
    return sorted(_catalog()["models"])
