"""What a CT200 twin cannot hold, and the stand-in it uses instead: shared by the inventories of
the twins (inventory/sim.py, the default twins; inventory/fleet-sim.py, an isolated fleet).
The profiles stay identical.
"""

from __future__ import annotations

import os
from typing import Any

# The launch check: SGLang's own parser, in the venv with CPU torch (2.3 GB, seconds of uv per
# venv, uncompiled: tasks/venv.py installs). DSV4_SIM_LAUNCH_CHECK=twin keeps the twin's own parser
# instead (SGLang's flags and their arity, no value checks: a stand-in), e.g. for the isolated twins
# that test the rollout's order (the fleet's three, the lab's: tests/sim_fixtures.py LAB_ENV).
LAUNCH_CHECK = os.environ.get("DSV4_SIM_LAUNCH_CHECK") or "sglang"
OWN_PARSER = LAUNCH_CHECK == "sglang"


def launch_check_problem() -> str | None:
    """What is wrong with DSV4_SIM_LAUNCH_CHECK, if anything (the twins' inventories refuse with it)."""
    if LAUNCH_CHECK in ("sglang", "twin"):
        return None
    return (f"DSV4_SIM_LAUNCH_CHECK={ascii(LAUNCH_CHECK)}: expected 'sglang' (SGLang's own parser, the default) "
            "or 'twin' (the twin's parser)")

STAND_INS: dict[str, Any] = {
    # SGLang with CUDA torch -> this project's twin server (same argv, same HTTP API).
    "server_module": "ct200twin.server.main",
    "launch_check_module": "ct200twin.server.args",          # without a parser lock, or OWN_PARSER off
    # (and huggingface_hub for `hf download`, which SGLang's own requirements bring on a real host);
    # with own_parser, the venv also holds data/sglang/<version>.parser.lock (tasks/venv.py)
    "sglang": {"requirements": ["aiohttp==3.14.5", "pyyaml==6.0.4", "huggingface_hub==2.4.0"],
               "own_parser": OWN_PARSER},
    # NVIDIA's apt repository and kernel modules -> the twin's nvidia-smi at the profile's branch.
    "driver": True,
    # GPUs for an NCCL all-reduce -> none: the probe is skipped with a note (it ran on real GPUs,
    # see docs/preflight.md).
    "skip_nccl_probe": "the twin has no GPUs (the probe is proven on real GPUs: docs/preflight.md)",
}


def weights_source() -> dict[str, Any]:
    """149 GiB of weights -> a small checkpoint of the same layout, made once under .sim/checkpoints,
    pushed over SSH; or, with DSV4_SIM_HUB=http://127.0.0.1:PORT (`dsv4deploy sim hub` serving
    .sim/checkpoints), downloaded by the real `hf download` from that local hub (source: hf; pin
    the profile against it first: HF_ENDPOINT=... dsv4deploy pin PROFILE)."""
    if os.environ.get("DSV4_SIM_HUB"):
        os.environ.setdefault("HF_ENDPOINT", os.environ["DSV4_SIM_HUB"])   # huggingface_hub's own calls too
        return {"type": "hf", "endpoint": os.environ["DSV4_SIM_HUB"], "size_gib": 0.01}
    return {"type": "rsync", "path": ".sim/checkpoints/{repo}", "size_gib": 0.01}
