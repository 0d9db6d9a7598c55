"""What a CT200 twin cannot hold, and the stand-in it uses instead: shared by the inventories of
the twins (inventory/sim.py, the default twins; inventory/fleet-sim.py, an isolated fleet).
The profiles stay identical. Everything twin-specific reaches the deploy as host data `stand_ins`
(and `weights_source`): the product reads it and names no part of the twin.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import dsv4deploy

from ct200twin.host.layout import sim_dir

# The launch check: SGLang's own, in the real host's venv (its lock, installed by the same command:
# 9.5 GB with CUDA torch, which imports without a GPU; tasks/venv.py installs). DSV4_SIM_LAUNCH_CHECK=twin
# keeps the twin's own parser instead (SGLang's flags and their arity, no value checks: a stand-in) and
# a venv without torch, e.g. for the isolated twins that test the rollout's order (the fleet's three,
# the lab's: tests/sim_fixtures.py LAB_ENV).
LAUNCH_CHECK = os.environ.get("DSV4_SIM_LAUNCH_CHECK") or "sglang"
OWN_PARSER = LAUNCH_CHECK == "sglang"

TWIN_DIR = Path(__file__).resolve().parents[1]            # ct200twin/
PRODUCT_DIR = Path(dsv4deploy.__file__).resolve().parent   # dsv4deploy/


def launch_check_problem() -> str | None:
    """What is wrong with DSV4_SIM_LAUNCH_CHECK, if anything (the twins' inventories refuse with it)."""
    if LAUNCH_CHECK in ("sglang", "twin"):
        return None
    return (f"DSV4_SIM_LAUNCH_CHECK={ascii(LAUNCH_CHECK)}: expected 'sglang' (SGLang's own parser, the default) "
            "or 'twin' (the twin's parser)")


def host_lock_pins(*names: str) -> list[str]:
    """NAME==VERSION for each of NAMES as the newest real-host lock pins it (data/sglang/<v>.lock):
    the twin's hub client is the real host's (huggingface_hub and hf-xet: the transfer route),
    named once, in the lock."""
    def version_key(path: Path) -> tuple:
        return tuple(int(p) if p.isdigit() else -1 for p in path.name.removesuffix(".lock").split("."))

    locks = sorted((p for p in (PRODUCT_DIR / "data" / "sglang").glob("*.lock") if not p.name.endswith(".parser.lock")),
                   key=version_key)
    pins = {m[1].lower().replace("_", "-"): f"{m[1]}=={m[2]}"     # `name==version ; marker \` (hashes below)
            for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", locks[-1].read_text(), re.M)}
    return [pins[n.lower().replace("_", "-")] for n in names]


STAND_INS: dict[str, Any] = {
    # SGLang with CUDA torch -> this project's twin server (same argv, same HTTP API), shipped as
    # one archive (server_archive(); its path is added by host_data()) put on the venv's path.
    "server_module": "ct200twin.server.main",
    "launch_check_module": "ct200twin.server.args",          # with OWN_PARSER off
    # (and huggingface_hub with hf-xet for `hf download`, which SGLang's own requirements bring on a
    # real host): the server's packages, each a pin of the real host's lock, so with own_parser the
    # lock's install holds them all and the twin's venv is exactly the real host's (tasks/venv.py)
    "sglang": {"requirements": ["aiohttp==3.14.5", "pyyaml==6.0.4", *host_lock_pins("huggingface_hub", "hf-xet")],
               "own_parser": OWN_PARSER,
               # what the venv takes on disk, for the deploy's disk check: with own_parser it is the real
               # host's (the version data's figure counts); without, the server's packages (180 MB seen)
               **({} if OWN_PARSER else {"venv_gib": 0.25})},
    # NVIDIA's apt repository and kernel modules -> the twin's nvidia-smi at the profile's branch
    # (the command the deploy runs instead; {branch} is the profile's driver branch).
    "driver": {"install": "dsv4deploy-twin-driver install {branch}.95.05"},
    # GPUs for an NCCL all-reduce -> none: the probe is skipped with a note (it ran on real GPUs,
    # see docs/preflight.md).
    "skip_nccl_probe": "the twin has no GPUs (the probe is proven on real GPUs: docs/preflight.md)",
}


def server_archive() -> bytes:
    """The twin server as one reproducible tar.gz: only what it imports (ct200twin/server, the
    product's patches module, its memory facts and its flag data), so an unrelated change in the project does not
    restart the twin; same files, same bytes (mtime 0, fixed modes, sorted)."""
    members = [(PRODUCT_DIR, PRODUCT_DIR / "__init__.py"), (PRODUCT_DIR, PRODUCT_DIR / "sglang" / "__init__.py"),
               (PRODUCT_DIR, PRODUCT_DIR / "sglang" / "patches.py"),
               (PRODUCT_DIR, PRODUCT_DIR / "profile" / "__init__.py"),
               (PRODUCT_DIR, PRODUCT_DIR / "profile" / "memory_facts.py"), (TWIN_DIR, TWIN_DIR / "__init__.py")]
    for top, part in ((TWIN_DIR, TWIN_DIR / "server"), (PRODUCT_DIR, PRODUCT_DIR / "data")):
        members += [(top, p) for p in sorted(part.rglob("*"))
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top, path in members:
            info = tarfile.TarInfo(path.relative_to(top.parent).as_posix())
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    # the fastest level: built at every inventory load (2 ms, not 15 at the default level 9),
    # 87 KB not 63 (loopback, uploaded only when its hash differs from the host's)
    return gzip.compress(buf.getvalue(), compresslevel=1, mtime=0)


def server_archive_file() -> Path:
    """server_archive() written under the twins' state dir (only when its bytes changed, replaced
    whole): the path the deploy uploads from (host data stand_ins.sglang.bundle)."""
    data = server_archive()
    path = sim_dir() / "stand-in" / "server.tar.gz"
    try:
        if path.read_bytes() == data:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def host_data() -> dict[str, Any]:
    """Host data `stand_ins` for a twin: STAND_INS plus the server archive's path. DSV4_SIM_DRIVER=apt
    leaves the driver's stand-in out: the driver step's real apt commands then run, against the
    repository that host data cuda_repo_url names (tests/apt_repo.py serves one of dummy packages)."""
    parts = {**STAND_INS, "sglang": {**STAND_INS["sglang"], "bundle": str(server_archive_file())}}
    if os.environ.get("DSV4_SIM_DRIVER") == "apt":
        del parts["driver"]
    return parts


def weights_source() -> dict[str, Any]:
    """149 GiB of weights -> a small checkpoint of the same layout, made under .sim/checkpoints
    (checkpoint_for), pushed over SSH; or, with DSV4_SIM_HUB=http://127.0.0.1:PORT
    (`python -m ct200twin hub` serving .sim/checkpoints), downloaded by the real `hf download`
    from that local hub (source: hf; pin the profile against it first: HF_ENDPOINT=... dsv4deploy
    pin PROFILE)."""
    if os.environ.get("DSV4_SIM_HUB"):
        os.environ.setdefault("HF_ENDPOINT", os.environ["DSV4_SIM_HUB"])   # huggingface_hub's own calls too
        return {"type": "hf", "endpoint": os.environ["DSV4_SIM_HUB"], "size_gib": 0.01}
    return {"type": "rsync", "path": ".sim/checkpoints/{repo}", "size_gib": 0.01}


def checkpoint_for(profile: dict[str, Any], weights: dict[str, Any]) -> None:
    """Make (once) the stand-in checkpoint that WEIGHTS (weights_source()) pushes for the profile
    that PROFILE (the inventory's host data `profile`) names, when pyinfra's CLI deploys it: the
    deploy only reads its files. A profile that does not load is left to the deploy to refuse."""
    from dsv4deploy.cli.inventories import deploys_a_profile, pyinfra_cli_params
    from dsv4deploy.profile.errors import ProfileError
    from dsv4deploy.profile.load import load_profile

    from ct200twin.host.checkpoint import make_checkpoint

    params = pyinfra_cli_params()
    if weights.get("type") != "rsync" or not profile.get("profile") or params is None \
            or not deploys_a_profile(params.get("operations") or ()):
        return
    try:
        repo = load_profile(str(profile["profile"]), profile["settings"].profiles).data["model"]["repo"]
    except (ProfileError, KeyError, TypeError):
        return
    make_checkpoint(repo)
