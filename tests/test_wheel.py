"""The product as an operator installs it (`pip install .`, no twin extra): its wheel holds
dsv4deploy only, and installed into a fresh venv with the lock's pins it validates a profile and
loads the real host's inventory far enough to connect, without the twin (ct200twin/, a test
bench in this repository) or its dependencies anywhere on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dsv4deploy.host import uvpip

REPO = Path(__file__).resolve().parent.parent
PINNED = "b" * 40
CLOSED_PORT = 9           # discard: nothing listens on the loopback here, the connection is refused


def _run(argv: list, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_wheel_holds_the_product_only_and_deploys_to_a_real_inventory_without_the_twin(tmp_path):
    # the sources as packaged: a copy (a build writes build/ and egg-info beside them), twin included
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    for package in ("dsv4deploy", "ct200twin"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    home = uvpip.UvHome.of(os.environ, REPO)
    env = {**uvpip.install_command(sys.executable, [], home, os.environ)[1], "UV_CACHE_DIR": str(home.cache)}
    built = _run([uvpip.uv(home), "build", "--wheel", "--out-dir", tmp_path / "dist", src], tmp_path, env)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("dsv4deploy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("ct200twin")], "the twin is in the product's wheel"
    assert "dsv4deploy/cli/main.py" in names and "dsv4deploy/render/templates/sglang.service.j2" in names

    venv = tmp_path / "venv"
    assert _run([sys.executable, "-I", "-m", "venv", "--without-pip", venv], tmp_path).returncode == 0
    argv, env = uvpip.install_command(str(venv / "bin" / "python"), ["-c", str(REPO / "requirements.lock"), str(wheel)],
                                      home, os.environ)
    installed = _run(argv, tmp_path, env)
    assert installed.returncode == 0, installed.stderr
    missing = _run([venv / "bin" / "python", "-I", "-c", "import importlib.util as u; "
                    "print([m for m in ('ct200twin', 'aiohttp') if u.find_spec(m)])"], tmp_path)
    assert missing.stdout.strip() == "[]", missing.stdout + missing.stderr

    # an operator's folder: the inventory, the deploy files and the profiles, no package sources
    work = tmp_path / "work"
    shutil.copytree(REPO / "deploy", work / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    (work / "inventory").mkdir()
    shutil.copy(REPO / "inventory" / "ct200.py", work / "inventory")
    shutil.copytree(REPO / "profiles", work / "profiles")
    (work / "profiles" / "pinned.yaml").write_text(f'extends: nvfp4-ctx8k\nmodel:\n  revision: "{PINNED}"\n')
    (work / "known_hosts").write_text("")
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DSV4_PROFILES_DIR": str(work / "profiles"),
             "CT200_HOST": "127.0.0.1", "CT200_PORT": str(CLOSED_PORT), "CT200_KNOWN_HOSTS": str(work / "known_hosts")}

    valid = _run([venv / "bin" / "dsv4deploy", "validate", "nvfp4-ctx8k"], work, clean)
    assert valid.returncode == 0 and "nvfp4-ctx8k: valid" in valid.stdout, valid.stdout + valid.stderr

    pyinfra = [venv / "bin" / "pyinfra", "--dry", "inventory/ct200.py", "deploy/serve.py", "--data"]
    placeholder = _run([*pyinfra, "profile=nvfp4-ctx8k"], work, clean)     # the product's own refusal
    assert placeholder.returncode == 2 and "placeholder revision" in placeholder.stderr, placeholder.stderr
    assert "Connecting" not in placeholder.stdout
    deploy = _run([*pyinfra, "profile=pinned"], work, clean)
    out = deploy.stdout + deploy.stderr
    assert "inventory/ct200.py: profile pinned (from --data profile=)" in out, out   # loaded, checked
    assert f"Could not connect ([Errno None] Unable to connect to port {CLOSED_PORT} on 127.0.0.1)" in out, out
    assert deploy.returncode == 1 and "Traceback" not in out and "ct200twin" not in out
