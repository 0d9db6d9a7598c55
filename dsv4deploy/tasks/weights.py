"""Model weights at the pinned revision, verified complete, never fetched twice.

Complete means every shard named in `model.safetensors.index.json` is present with the
expected size (from the source's listing). A marker with those sizes is written after the
check; a later run re-checks sizes against the marker and downloads nothing.
Sources: `hf` (weights_fetch.py, resuming a cut file, and `hf download` for the files the hub
offers through Xet, with the token from the host's 0600 token file as a systemd credential; every
file checked by size and sha256 against the hub's metadata), `local` (a folder already on the host), `rsync` (a folder on
the control node, pushed over SSH).

Hashing is a step of its own ("verify", one marker record per file as it goes), never part of
the host read, which checks sizes and the marker only: a re-run after a cut hashes only the files
not yet proven, in this step, with a progress line per file.

The download and the verify run as FETCH_USER in the server unit's sandbox (host/sandbox.py: the
download with network to the hub, the verify with none), each writing the checkpoint's folder and
nothing else; root only makes that folder FETCH_USER's. The server reads the files (0644) and can
never change them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import DeployError, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import StateStage
from pyinfra.operations import server

from dsv4deploy.host import HOST_PYTHON, ops, sandbox
from dsv4deploy.host.facts import CHECKER, Checkpoint
from dsv4deploy.host.state import HostState
from dsv4deploy.render.layout import FETCH_USER
from dsv4deploy.release.rollout import Rollout
from dsv4deploy.weights import fetch as weights_fetch
from dsv4deploy.weights.source import HubCheckpoint, hub_expectation, local_expectation, rsync_folder

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
        return []
    read = state["checkpoint"] or {}
    # all present at their sizes, only not yet proven (a cut verify, or an older marker): hash those
    only_unverified = bool(read.get("unverified")) and not read.get("problems")
    if src["type"] == "hf":
        expected = json.dumps(hub_expectation(src, repo, rev, r.settings))
        hub = HubCheckpoint(repo, rev, src.get("endpoint") or r.settings.hf_endpoint or DEFAULT_ENDPOINT)
        changed = [] if only_unverified else [hf_checkpoint(
            name=f"{repo}@{rev[:12]} from the hub (resumes a cut file)", path=dest, hub=hub, expected=expected,
            hf=f"{r.layout.venv}/bin/hf", token_file=r.layout.hf_token_file, unit=r.rendered.unit)]
        return changed + [verified_checkpoint(name="verify every file by size and sha256 (progress per file)",
                                              path=dest, expected=expected, source=f"the hub's {repo}@{rev[:12]}",
                                              unit=r.rendered.unit)]
    changed: list[OperationMeta] = []
    expected = ""
    if src["type"] == "rsync":
        ops.directory(name="model dir", path=dest, state=state.file(dest), user=FETCH_USER, group=FETCH_USER)
        folder = rsync_folder(src, r.settings.checkout)
        source = local_expectation(folder, r.settings.cache)
        expected = json.dumps(source)
        if read.get("unverified"):
            # copies of the right size not yet proven: hashed now, the wrong ones removed, so that
            # the push sends them again in this run (and the verify below hashes only what it sent)
            verified_checkpoint(name="verify the copies not yet proven (the wrong ones go, to be pushed again)",
                                path=dest, expected=expected, source=str(folder), unit=r.rendered.unit, repair=True)
        # every file the host lacks at its size (a cut or truncated copy too), through the private staging path
        changed.append(ops.tree(name=f"push {folder} (rsync source: what the host lacks)", folder=str(folder),
                                dest=dest, sizes={rel: f["size"] for rel, f in source["files"].items()},
                                user=FETCH_USER, group=FETCH_USER))
        changed.append(verified_checkpoint(name="verify every file by size and sha256 against the source",
                                           path=dest, expected=expected, source=str(folder), unit=r.rendered.unit))
        return changed
    ops.directory(name="model dir", path=dest, state=state.file(dest))
    changed.append(_copy_local(src["path"], dest))   # local
    checkpoint_marker(name="verify every shard is present with its size", path=dest, expected=expected)
    return changed


# --- source: rsync --------------------------------------------------------------------------------
# The source folder on the control node is the truth: every file's size and sha256 (hashed once and
# kept under .cache/rsync-digests/ by size, mtime and inode, so a re-deploy hashes nothing) is what
# the host's copy must match, checked by weights_check.py on the host exactly as for the hub.

def fetch_owns(path: str) -> str:
    """Root's part: PATH made, and it and everything in it FETCH_USER's (a folder an earlier release
    filled as root, or files pushed by root: rsync), 0755, so that the download and the verify,
    which run as FETCH_USER, may write it. No FETCH_USER process runs meanwhile (each is a transient
    unit that ended), and neither find nor chown -h follows a link."""
    q, u = shlex.quote, FETCH_USER
    return f"mkdir -p {q(path)} && find {q(path)} ! -user {u} -exec chown -h {u}:{u} {{}} + && chmod 755 {q(path)}"


@operation()
def verified_checkpoint(path: str, expected: str, source: str, unit: str, repair: bool = False):
    """Prove every file not yet proven by size and sha256, one progress line and one marker record
    per file (a cut here keeps what it proved); otherwise remove the bad files and fail naming them
    (only added when the host's state says the checkpoint is not complete). REPAIR: remove them and
    go on (a push follows that sends them again). Runs as FETCH_USER with no network, writing only
    PATH (host/sandbox.py "verify")."""
    q = shlex.quote
    yield fetch_owns(path)
    check = [*HOST_PYTHON.split(), "-c", CHECKER, path, "-", "--write-marker", "--progress", "--remove-bad"]
    verify = f"printf '%s' {q(expected)} | {sandbox.command(check, unit, 'verify', writable=(path,))} >&2"
    if repair:
        yield f"{verify} || true"
        return
    yield (f"{verify} || "
           f"{{ echo {q(f'{path} does not match {source} (size or sha256): the files named above were removed; deploy again to fetch them')} >&2; exit 1; }}")


# --- source: hf ---------------------------------------------------------------------------------
# The hub's metadata for the pinned commit (every file's size, sha256 for LFS shards, git blob id
# for the rest) is fetched once on the control node and kept under .cache/hub-metadata/: it never
# changes for a commit, so a re-deploy needs no hub. weights_check.py (stdlib only) runs on the host
# with its system python3 and checks every byte; hf download fetches what is missing or wrong.

# The hub's default route: Xet where the hub offers it (hf download with hf-xet), HTTP with Range
# resume across runs otherwise (docs/hub.md says why and what each resumes).
# hf download's home (its Xet cache) is the download's private /tmp: gone when it ends.
HF_ENV = {"HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
          "HF_HOME": f"{sandbox.HOME}/hf-home"}
TOKEN_CREDENTIAL = "hf-token"     # weights/fetch.py reads it from $CREDENTIALS_DIRECTORY
FETCHER = Path(weights_fetch.__file__).read_text()
DEFAULT_ENDPOINT = "https://huggingface.co"


@operation()
def hf_checkpoint(path: str, hub: HubCheckpoint, expected: str, hf: str, token_file: str, unit: str):
    """Fetch what is missing or of the wrong size (weights_fetch.py: a file cut by an earlier run
    resumes from its kept .part; the files the hub offers through Xet go to hf download). Its bytes
    are proven by the verify step next. (Only added when the host's state says files are missing.)
    Runs as FETCH_USER, writing only PATH, with network to the hub (host/sandbox.py "download")."""
    q = shlex.quote
    yield fetch_owns(path)
    fetch = [*HOST_PYTHON.split(), "-c", FETCHER, path, hub.endpoint, hub.repo, hub.revision, "--hf", hf]
    env = {**HF_ENV, "HF_ENDPOINT": hub.endpoint}
    # the token reaches it as a systemd credential from the root-only file: never in argv or environment
    with_token = sandbox.command(fetch, unit, "download", writable=(path,), env=env,
                                 credentials={TOKEN_CREDENTIAL: token_file})
    yield (f"printf '%s' {q(expected)} | if [ -s {q(token_file)} ]; then {with_token}; "
           f"else {sandbox.command(fetch, unit, 'download', writable=(path,), env=env)}; fi")


def _copy_local(path: str, dest: str) -> OperationMeta:
    return server.shell(name=f"copy {path} (local source on the host)",
                        commands=[f"cp -a --reflink=auto {shlex.quote(path)}/. {shlex.quote(dest)}/"])
