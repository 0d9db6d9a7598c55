"""Model weights at the pinned revision, verified complete, never fetched twice.

Complete means every shard named in `model.safetensors.index.json` is present with the
expected size (from the source's listing). A marker with those sizes is written after the
check; a later run re-checks sizes against the marker and downloads nothing.
Sources: `hf` (hf download with the token from the host's 0600 token file; every file checked
by size and sha256 against the hub's metadata), `local` (a folder already on the host), `rsync`
(a folder on the control node, pushed over SSH).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import DeployError, FactBase, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import StateStage
from pyinfra.operations import files, server

from .. import weights_check
from ..host import ops
from ..host.facts import Checkpoint, checker_command
from ..host.state import HostState
from ..layout import STATE
from ..profiles import REPO_ROOT
from ..rollout import Rollout

MARKER = ".dsv4deploy-complete.json"


@operation()
def checkpoint_marker(path: str, expected: str = ""):
    """Write the completeness marker, or fail naming what is missing."""
    state = host.get_fact(Checkpoint, path=path, expected=expected)
    if state.get("marker") and state["complete"]:
        host.noop("checkpoint complete (marker present, sizes match)")
        return
    if not state["complete"] and host.state.current_stage >= StateStage.Execute:
        raise DeployError(f"checkpoint at {path} is incomplete: " + "; ".join(state["problems"][:5]))
    doc = json.dumps({"sizes": state.get("shards", {})})  # at plan time: the write it will do
    yield StringCommand(f"printf '%s\\n' {shlex.quote(doc)} > {shlex.quote(path + '/' + MARKER)}")


def _local_sizes(folder: Path) -> dict[str, int]:
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise DeployError(f"{folder}: no model.safetensors.index.json (not a safetensors checkpoint)")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise DeployError(f"{folder}: shards missing at the source: {', '.join(missing[:5])}")
    return {s: (folder / s).stat().st_size for s in shards}


@deploy("Weights")
def weights(r: Rollout, state: HostState) -> list[OperationMeta]:
    src = r.weights_source
    dest = r.layout.model_dir
    repo, rev = r.data["model"]["repo"], r.data["model"]["revision"]
    if state.checkpoint_complete:
        host.noop(f"{repo}@{rev[:12]} complete at {dest}")
        return []
    if src["type"] == "hf":
        return [hf_checkpoint(name=f"{repo}@{rev[:12]} from the hub, verified by size and sha256", path=dest,
                              repo=repo, revision=rev, expected=json.dumps(hub_expectation(src, repo, rev)),
                              hf=f"{r.layout.venv}/bin/hf", token_file=r.layout.hf_token_file,
                              endpoint=src.get("endpoint") or os.environ.get("HF_ENDPOINT"))]
    changed: list[OperationMeta] = []
    expected = ""
    ops.directory(name="model dir", path=dest, state=state.file(dest))
    if src["type"] == "rsync":
        folder = Path(src["path"])
        folder = folder if folder.is_absolute() else REPO_ROOT / folder
        expected = json.dumps(_local_sizes(folder))
        changed.append(files.sync(name=f"push {folder} (rsync source)", src=str(folder), dest=dest))
    else:  # local
        changed.append(_copy_local(src["path"], dest))
    checkpoint_marker(name="verify every shard is present with its size", path=dest, expected=expected)
    return changed


# --- source: hf ---------------------------------------------------------------------------------
# The hub's metadata for the pinned commit (every file's size, sha256 for LFS shards, git blob id
# for the rest) is fetched once on the control node and kept under .cache/hub-metadata/: it never
# changes for a commit, so a re-deploy needs no hub. weights_check.py (stdlib only) runs on the host
# with its system python3 and checks every byte; hf download fetches what is missing or wrong.

HF_ENV = ("HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 "
          f"HF_HUB_DISABLE_XET=1 HF_HOME={STATE}/hf-home")   # plain HTTP + Range: the route the twin proves


def hub_expectation(src: dict, repo: str, revision: str) -> dict:
    """{"commit", "files"} for repo@revision, from the cache or the hub (DeployError when it cannot)."""
    cache = REPO_ROOT / ".cache" / "hub-metadata" / f"{repo.replace('/', '--')}--{revision}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    from ..hftoken import HfTokenError, hf_token_from_env

    endpoint = src.get("endpoint") or os.environ.get("HF_ENDPOINT")
    try:
        info = HfApi(endpoint=endpoint, token=hf_token_from_env() or False).model_info(
            repo, revision=revision, files_metadata=True)
    except HfTokenError as exc:
        raise DeployError(str(exc)) from None
    except RevisionNotFoundError:
        raise DeployError(f"{repo} has no revision {revision} on {endpoint or 'huggingface.co'}: "
                          "pin one that exists (make pin PROFILE=...)") from None
    except RepositoryNotFoundError:
        raise DeployError(f"{repo} not found on {endpoint or 'huggingface.co'} (or the token cannot see it)") from None
    except (HfHubHTTPError, OSError) as exc:
        raise DeployError(f"cannot read {repo}@{revision[:12]}'s file list from {endpoint or 'huggingface.co'}: "
                          f"{str(exc).splitlines()[0]}") from None
    doc = weights_check.expected_from_model_info(info)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(doc, sort_keys=True))
    return doc


@operation()
def hf_checkpoint(path: str, repo: str, revision: str, expected: str, hf: str, token_file: str,
                  endpoint: str | None = None):
    """Download what is missing or wrong, then prove every file by size and sha256. A run killed
    mid-download leaves partial files: they are removed first (hf download starts them again; the
    files it finished are kept), as are files whose bytes do not match the hub. (Only added when
    the host's state says the checkpoint is not complete.)"""
    q = shlex.quote
    yield (f"mkdir -p {q(path)} && find {q(path)}/.cache/huggingface/download -name '*.incomplete' -delete "
           f"2>/dev/null; {checker_command(path, expected, '--remove-bad')} >/dev/null; true")
    env = HF_ENV + (f" HF_ENDPOINT={q(endpoint)}" if endpoint else "")
    # huggingface_hub reads the token from the file HF_TOKEN_PATH names: never in argv or environment
    yield (f"if [ -s {q(token_file)} ]; then export HF_TOKEN_PATH={q(token_file)}; fi; env {env} {q(hf)} download "
           f"{q(repo)} --revision {q(revision)} --local-dir {q(path)} --quiet")
    yield (f"{checker_command(path, expected, '--write-marker')} || {{ echo {q(f'{repo}@{revision[:12]}: the download does not match the hub (size or sha256): the files named above were removed; deploy again to fetch them')} >&2; "
           f"{checker_command(path, expected, '--remove-bad')} >/dev/null; exit 1; }}")


def _copy_local(path: str, dest: str) -> OperationMeta:
    return server.shell(name=f"copy {path} (local source on the host)",
                        commands=[f"cp -a --reflink=auto {shlex.quote(path)}/. {shlex.quote(dest)}/"])
