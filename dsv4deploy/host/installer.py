"""The host's installer: uv, pinned by the sha256 of its wheels (data/uv.requirements), in a venv
of its own that the host's pip makes once (`--require-hashes`). It fills the SGLang and gateway
venvs: the same pinned packages as pip installs, several times faster (SGLang's own install
guide uses `uv pip install`; docs/testing.md has the figures). uvpip.py travels with it and runs
there with that venv's python, so uv takes what the host's pip configuration says (indexes,
find-links, certificate, proxy), as on the control node.
"""

from __future__ import annotations

import shlex
from importlib.resources import files as package_files
from pathlib import Path

from dsv4deploy.host import uvpip
from dsv4deploy.render.layout import OPT
from dsv4deploy.host import ISOLATED

TOOL = f"{OPT}/tools/uv-{uvpip.UV_VERSION}"
VENV = f"{TOOL}/venv"
UV = f"{VENV}/bin/uv"
REQUIREMENTS = f"{TOOL}/uv.requirements"
PROGRAM = f"{TOOL}/uvpip.py"
INSTALLED = f"{TOOL}/.installed"          # a copy of the requirements, written once uv is in
CACHE = "/var/cache/dsv4deploy/uv"        # root's; uv hardlinks from it into the venvs

q = shlex.quote


def requirements() -> bytes:
    return (Path(str(package_files("dsv4deploy"))) / "data" / "uv.requirements").read_bytes()


def program() -> bytes:
    return Path(uvpip.__file__).read_bytes()


def paths() -> list[str]:
    """What the host's one read compares (host/state.py managed_paths)."""
    return [REQUIREMENTS, PROGRAM, INSTALLED]


def bootstrap_commands() -> list[str]:
    """A fresh tool venv with the pinned uv (REQUIREMENTS written before); INSTALLED last, so an
    interrupted bootstrap is redone."""
    return [f"rm -rf {q(VENV)} {q(INSTALLED)} && python3 {ISOLATED} -m venv {q(VENV)} && "
            f"{q(VENV)}/bin/python {ISOLATED} -m pip install "
            f"--disable-pip-version-check -q --no-deps --require-hashes -r {q(REQUIREMENTS)} && "
            f"cp {q(REQUIREMENTS)} {q(INSTALLED)}"]


def venv_command(path: str) -> str:
    """An empty venv with the host's python3 (no pip in it: uv fills and freezes it)."""
    return f"{q(UV)} venv -q --allow-existing --no-python-downloads --python python3 {q(path)}"


def install_command(venv: str, args: list[str]) -> str:
    """`uv pip install ARGS` into VENV, with what the host's pip configuration says. Isolated,
    as every python root starts here: the login's directory and PYTHONPATH reach neither uvpip.py
    nor the `pip config list` it runs (uvpip.py passes -I on)."""
    return (f"DSV4_UV_HOME={q(VENV)} UV_CACHE_DIR={q(CACHE)} {q(VENV)}/bin/python {ISOLATED} {q(PROGRAM)} install "
            f"--python {q(venv + '/bin/python')} {' '.join(q(a) for a in args)}")


def freeze_command(venv: str) -> str:
    """What the venv holds, as `pip freeze` lists it."""
    return f"{q(UV)} pip freeze -q --python {q(venv + '/bin/python')}"
