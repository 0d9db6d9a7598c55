"""Model weights at the pinned revision, verified complete, never fetched twice.

Complete means every shard named in `model.safetensors.index.json` is present with the
expected size (from the source's listing). A marker with those sizes is written after the
check; a later run re-checks sizes against the marker and downloads nothing.
Sources: `hf` (hf download with the token from the host's 0600 token file, resumable), `local` (a
folder already on the host), `rsync` (a folder on the control node, pushed over SSH).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import DeployError, FactBase, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import StateStage
from pyinfra.operations import files, server

from ..profiles import REPO_ROOT
from ..rollout import Rollout

MARKER = ".dsv4deploy-complete.json"

# Runs on the host with its system python3: prints {"complete": bool, "problems": [...]}.
CHECK = r'''
import json, os, sys
d, expected = sys.argv[1], json.loads(sys.argv[2] or "{}")
out = {"complete": False, "problems": []}
index = os.path.join(d, "model.safetensors.index.json")
marker = os.path.join(d, ".dsv4deploy-complete.json")
if not os.path.isfile(index):
    out["problems"].append("model.safetensors.index.json missing")
else:
    shards = sorted(set(json.load(open(index))["weight_map"].values()))
    want = dict(expected)
    if not want and os.path.isfile(marker):
        want = json.load(open(marker)).get("sizes", {})
    for s in shards:
        p = os.path.join(d, s)
        if not os.path.isfile(p):
            out["problems"].append(f"{s} missing")
        elif s in want and os.path.getsize(p) != want[s]:
            out["problems"].append(f"{s} has {os.path.getsize(p)} bytes, expected {want[s]}")
        elif os.path.getsize(p) == 0:
            out["problems"].append(f"{s} is empty")
    out["shards"] = {s: os.path.getsize(os.path.join(d, s)) for s in shards if os.path.isfile(os.path.join(d, s))}
    out["complete"] = not out["problems"]
    out["marker"] = os.path.isfile(marker)
print(json.dumps(out))
'''


class Checkpoint(FactBase):
    """Completeness of a checkpoint folder on the host."""

    def command(self, path: str, expected: str = ""):
        return StringCommand("python3", "-c", shlex.quote(CHECK), shlex.quote(path), shlex.quote(expected or "{}"))

    def process(self, output):
        return json.loads(output[-1])


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
def weights(r: Rollout) -> list[OperationMeta]:
    src = r.weights_source
    dest = r.layout.model_dir
    repo, rev = r.data["model"]["repo"], r.data["model"]["revision"]
    done = host.get_fact(Checkpoint, path=dest)
    changed: list[OperationMeta] = []
    expected = ""
    if done.get("marker") and done["complete"]:
        host.noop(f"{repo}@{rev[:12]} complete at {dest}")
    elif src["type"] == "rsync":
        folder = Path(src["path"])
        folder = folder if folder.is_absolute() else REPO_ROOT / folder
        expected = json.dumps(_local_sizes(folder))
        files.directory(name="model dir", path=dest)
        changed.append(files.sync(name=f"push {folder} (rsync source)", src=str(folder), dest=dest))
    elif src["type"] == "local":
        files.directory(name="model dir", path=dest)
        changed.append(_copy_local(src["path"], dest))
    else:
        hf = f"{r.layout.venv}/bin/hf"
        # huggingface_hub reads the token from the file HF_TOKEN_PATH names: never in argv or environment.
        token = shlex.quote(r.layout.hf_token_file)
        cmd = (f"if [ -s {token} ]; then export HF_TOKEN_PATH={token}; fi; "
               f"{hf} download {shlex.quote(repo)} --revision {shlex.quote(rev)} --local-dir {shlex.quote(dest)}")
        changed.append(server.shell(name=f"hf download {repo}@{rev[:12]} (resumable)", commands=[cmd]))
    checkpoint_marker(name="verify every shard is present with its size", path=dest, expected=expected)
    return changed


def _copy_local(path: str, dest: str) -> OperationMeta:
    return server.shell(name=f"copy {path} (local source on the host)",
                        commands=[f"cp -a --reflink=auto {shlex.quote(path)}/. {shlex.quote(dest)}/"])
