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
import shlex

from pyinfra import host
from pyinfra.api import DeployError, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import StateStage
from pyinfra.operations import files, server

from dsv4deploy.host import ops
from dsv4deploy.host.facts import Checkpoint, checker_command
from dsv4deploy.host.state import HostState
from dsv4deploy.render.layout import STATE
from dsv4deploy.release.rollout import Rollout
from dsv4deploy.weights.source import hub_expectation, local_expectation, rsync_folder

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


@deploy("Weights")
def weights(r: Rollout, state: HostState) -> list[OperationMeta]:
    src = r.weights_source
    dest = r.layout.model_dir
    repo, rev = r.data["model"]["repo"], r.data["model"]["revision"]
    if state.checkpoint_complete:
        host.noop(f"{repo}@{rev[:12]} complete at {dest}")
        if src["type"] == "rsync" and (state["checkpoint"] or {}).get("hashed"):
            folder = rsync_folder(src, r.settings.checkout)
            # complete, but some file was hashed (no marker yet, e.g. pushed by an older release of
            # this tool): record the marker once, so a re-deploy hashes nothing. Not a change.
            verified_checkpoint(name="record the verified checkpoint's marker", path=dest,
                                expected=json.dumps(local_expectation(folder, r.settings.cache)),
                                source=str(folder))
        return []
    if src["type"] == "hf":
        return [hf_checkpoint(name=f"{repo}@{rev[:12]} from the hub, verified by size and sha256", path=dest,
                              repo=repo, revision=rev, expected=json.dumps(hub_expectation(src, repo, rev, r.settings)),
                              hf=f"{r.layout.venv}/bin/hf", token_file=r.layout.hf_token_file,
                              endpoint=src.get("endpoint") or r.settings.hf_endpoint)]
    changed: list[OperationMeta] = []
    expected = ""
    ops.directory(name="model dir", path=dest, state=state.file(dest))
    if src["type"] == "rsync":
        folder = rsync_folder(src, r.settings.checkout)
        expected = json.dumps(local_expectation(folder, r.settings.cache))
        # files.sync uploads every file whose sha1 differs: a truncated or corrupted copy is replaced
        changed.append(files.sync(name=f"push {folder} (rsync source)", src=str(folder), dest=dest))
        verified_checkpoint(name="verify every file by size and sha256 against the source", path=dest,
                            expected=expected, source=str(folder))
        return changed
    changed.append(_copy_local(src["path"], dest))   # local
    checkpoint_marker(name="verify every shard is present with its size", path=dest, expected=expected)
    return changed


# --- source: rsync --------------------------------------------------------------------------------
# The source folder on the control node is the truth: every file's size and sha256 (hashed once and
# kept under .cache/rsync-digests/ by size, mtime and inode, so a re-deploy hashes nothing) is what
# the host's copy must match, checked by weights_check.py on the host exactly as for the hub.

@operation()
def verified_checkpoint(path: str, expected: str, source: str):
    """Prove every file of the pushed checkpoint by size and sha256 and leave weights_check's marker;
    otherwise fail naming the files (only added when the host's state says it is not complete)."""
    q = shlex.quote
    yield (f"{checker_command(path, expected, '--write-marker')} >&2 || {{ echo {q(f'{path} does not match {source} after the push (size or sha256): see the files named above; deploy again')} >&2; exit 1; }}")


# --- source: hf ---------------------------------------------------------------------------------
# The hub's metadata for the pinned commit (every file's size, sha256 for LFS shards, git blob id
# for the rest) is fetched once on the control node and kept under .cache/hub-metadata/: it never
# changes for a commit, so a re-deploy needs no hub. weights_check.py (stdlib only) runs on the host
# with its system python3 and checks every byte; hf download fetches what is missing or wrong.

HF_ENV = ("HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 "
          f"HF_HUB_DISABLE_XET=1 HF_HOME={STATE}/hf-home")   # plain HTTP + Range: the route the twin proves


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
