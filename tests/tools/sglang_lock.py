#!/usr/bin/env python3
"""Write dsv4deploy/data/sglang/<version>.lock (or data/smg/<version>.lock): every package the
venv of `sglang==<version>` holds on Linux x86_64, pinned, with the sha256 of every file PyPI
serves for it, resolved once for Python 3.11 (Debian 12, the twin) and 3.12 (Ubuntu 24.04).

    python3 tests/tools/sglang_lock.py 0.5.23 [--extra NAME ...]
    python3 tests/tools/sglang_lock.py 1.13.0 --package smg    # the gateway: data/smg/<version>.lock
    python3 tests/tools/sglang_lock.py --all                   # every lock shipped (make lock)

Resolved by the pinned uv (dsv4deploy/host/uvpip.py) as a throw-away project (`uv lock` with
environments = Linux x86_64, requires-python 3.11-3.12, then `uv export --hashes`), from PyPI
only: this machine's pip and uv configuration (local wheel folders, mirrors) is ignored, so the
lock says what PyPI gives a real host. The host installs it whole with hash checking
(`uv pip install --require-hashes -r`: tasks/venv.py, tasks/replicas.py), and the venv's name
hashes it (layout.venv_id), so a refreshed lock is a new venv, never an upgrade in place.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dsv4deploy.host.uvpip import UV_VERSION, UvHome, uv  # noqa: E402

DATA = REPO / "dsv4deploy" / "data"
INDEX = "https://pypi.org/simple"
PYTHONS = ">=3.11,<3.13"
ENVIRONMENT = "sys_platform == 'linux' and platform_machine == 'x86_64'"


def clean_env() -> dict[str, str]:
    """This environment without pip's and uv's own settings (indexes, find-links, config files)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1"}


def resolve(package: str, version: str, extras: list[str]) -> str:
    """`uv export` of a project that depends on PACKAGE[EXTRAS]==VERSION: requirements with
    markers and hashes (the package itself included)."""
    spec = f"{package}[{','.join(extras)}]=={version}" if extras else f"{package}=={version}"
    tool = str(uv(UvHome.of(os.environ, REPO)))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pyproject.toml").write_text(
            f'[project]\nname = "dsv4deploy-lock"\nversion = "0"\nrequires-python = "{PYTHONS}"\n'
            f'dependencies = ["{spec}"]\n\n[tool.uv]\npackage = false\nenvironments = ["{ENVIRONMENT}"]\n')
        common = ["--no-config", "--directory", tmp]
        subprocess.run([tool, "lock", "--quiet", *common, "--index-url", INDEX], check=True, env=clean_env())
        out = subprocess.run([tool, "export", "--quiet", *common, "--frozen", "--format", "requirements-txt",
                              "--no-emit-project", "--no-annotate", "--no-header"],
                             check=True, env=clean_env(), capture_output=True, text=True).stdout
    return out


def write(package: str, version: str, extras: list[str]) -> Path:
    body = resolve(package, version, extras)
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", body, re.M)
    if not any(name.lower() == package for name, _ in pins):
        raise SystemExit(f"{package}=={version}: not in the resolution")
    header = [f"# {package}=={version}{' [' + ','.join(extras) + ']' if extras else ''}: every package its venv "
              f"holds, with the sha256 of every file PyPI serves for it,",
              f"# for Linux x86_64, Python 3.11 and 3.12 (tests/tools/sglang_lock.py, uv {UV_VERSION}, "
              f"index {INDEX} only; make lock).",
              "# Installed whole with hash checking: uv pip install --require-hashes -r this file.",
              "# The venv's name hashes this file: a refreshed lock makes a new venv."]
    out = DATA / package / f"{version}.lock"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(header) + "\n" + body)
    names = {n.lower(): v for n, v in pins}
    shown = ", ".join(f"{n}=={names[n]}" for n in ("torch", "sglang-kernel", "flashinfer-python") if n in names)
    print(f"{out.relative_to(REPO)}: {len(set(n.lower() for n, _ in pins))} packages{f' ({shown})' if shown else ''}")
    return out


def shipped() -> list[tuple[str, str]]:
    """(package, version) of every lock shipped in data/sglang/ and data/smg/."""
    found = [(pkg, p.name[:-len(".lock")]) for pkg in ("sglang", "smg") for p in sorted((DATA / pkg).glob("*.lock"))]
    return [(pkg, v) for pkg, v in found if re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", v)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version", nargs="?")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--package", default="sglang", choices=["sglang", "smg"],
                    help="sglang (data/sglang/) or smg, the gateway (data/smg/)")
    ap.add_argument("--all", action="store_true", help="refresh every lock shipped")
    args = ap.parse_args(argv)
    if args.all == bool(args.version):
        ap.error("give a VERSION or --all")
    for package, version in shipped() if args.all else [(args.package, args.version)]:
        write(package, version, args.extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
