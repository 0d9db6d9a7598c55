"""What a checkpoint on the host must hold, file by file (size and sha256), per source, computed
on the control node: the hub's metadata for the pinned commit (fetched once, kept under the
run's cache folder, hub-metadata/: it never changes for a commit, so a re-deploy needs no hub), or
an rsync source folder's own digests (hashed once, kept under rsync-digests/ there). The host checks its
files against it (weights_check.py); the deploy reads it before its one read of the host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api import DeployError

from dsv4deploy.cli.settings import Settings
from dsv4deploy.weights import check as weights_check


@dataclass(frozen=True)
class HubCheckpoint:
    """A checkpoint on a hub, as the host's download fetches it: the repo, the pinned commit and
    the hub's address (its own endpoint or HF_ENDPOINT, else huggingface.co)."""

    repo: str
    revision: str
    endpoint: str


def hub_expectation(src: dict, repo: str, revision: str, settings: Settings) -> dict:
    """{"commit", "files"} for repo@revision, from the cache or the hub (DeployError when it
    cannot); the hub is the source's endpoint, else the control node's (SETTINGS: its cache
    folder, HF_ENDPOINT and HF token)."""
    cache = settings.cache / "hub-metadata" / f"{repo.replace('/', '--')}--{revision}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    import httpx2      # huggingface_hub's HTTP client: an unreachable hub raises its errors
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    from dsv4deploy.weights.hftoken import HfTokenError, hf_token_from_env

    endpoint = src.get("endpoint") or settings.hf_endpoint
    try:
        info = HfApi(endpoint=endpoint, token=hf_token_from_env(settings.environ) or False).model_info(
            repo, revision=revision, files_metadata=True)
    except HfTokenError as exc:
        raise DeployError(str(exc)) from None
    except RevisionNotFoundError:
        raise DeployError(f"{repo} has no revision {revision} on {endpoint or 'huggingface.co'}: "
                          "pin one that exists (make pin PROFILE=...)") from None
    except RepositoryNotFoundError:
        raise DeployError(f"{repo} not found on {endpoint or 'huggingface.co'} (or the token cannot see it)") from None
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
        raise DeployError(f"cannot read {repo}@{revision[:12]}'s file list from {endpoint or 'huggingface.co'}: "
                          f"{str(exc).splitlines()[0]}") from None
    doc = weights_check.expected_from_model_info(info)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(doc, sort_keys=True))
    return doc


def _local_sizes(folder: Path) -> dict[str, int]:
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise DeployError(f"{folder}: no model.safetensors.index.json (not a safetensors checkpoint)")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise DeployError(f"{folder}: shards missing at the source: {', '.join(missing[:5])}")
    return {s: (folder / s).stat().st_size for s in shards}


def rsync_folder(src: dict, checkout: Path) -> Path:
    """An rsync source's folder: a relative path is the CHECKOUT's."""
    folder = Path(src["path"])
    return folder if folder.is_absolute() else checkout / folder


def local_expectation(folder: Path, cache_dir: Path) -> dict:
    """{"commit": None, "files": {name: {size, sha256}}} of the source folder (DeployError when it
    is not a complete safetensors checkpoint); digests kept under CACHE_DIR/rsync-digests/."""
    import hashlib

    _local_sizes(folder)                     # index present, every shard it names present
    cache = cache_dir / "rsync-digests" / (hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16] + ".json")
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    out, fresh = {}, {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not any(
            part.startswith(".") for part in p.relative_to(folder).parts)):
        rel = str(path.relative_to(folder))
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        seen = known.get(rel)
        if isinstance(seen, dict) and seen.get("stat") == key:
            digest = seen["sha256"]
        else:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(8 << 20):
                    h.update(chunk)
            digest = h.hexdigest()
        fresh[rel] = {"stat": key, "sha256": digest}
        out[rel] = {"size": st.st_size, "sha256": digest}
    if fresh != known:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(fresh, sort_keys=True))
    return {"commit": None, "files": out}
