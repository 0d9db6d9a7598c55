#!/usr/bin/env python3
"""Write dsv4deploy/data/sglang/<version>.lock: every package `pip install sglang==<version>`
puts in a venv on Linux x86_64, pinned, as pip itself resolves it (`--dry-run --report`, wheel
metadata only: nothing is downloaded but metadata, nothing installed).

    python3 tests/tools/sglang_lock.py 0.5.23 [--extra NAME ...] [--python 3.12]
    python3 tests/tools/sglang_lock.py 1.13.0 --package smg    # the gateway: data/smg/<version>.lock

The machine's pip configuration (caps, local indexes) is ignored (PIP_CONFIG_FILE=/dev/null):
the lock says what PyPI gives a real host. The deploy installs SGLang with `-c` this file, and the
venv's name hashes it (layout.venv_id), so a refreshed lock is a new venv, never an upgrade in place.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "dsv4deploy" / "data" / "sglang"


def resolve(version: str, extras: list[str], python: str | None, package: str = "sglang") -> list[tuple[str, str]]:
    spec = f"{package}[{','.join(extras)}]=={version}" if extras else f"{package}=={version}"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--only-binary=:all:", "--report", str(report)]
        if python:
            cmd += ["--python-version", python, "--target", str(Path(tmp) / "t")]
            for glibc in range(39, 16, -1):          # manylinux_2_39 (Ubuntu 24.04) down to 2_17
                cmd += ["--platform", f"manylinux_2_{glibc}_x86_64"]
            cmd += ["--platform", "manylinux2014_x86_64", "--platform", "linux_x86_64"]
        cmd.append(spec)
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        subprocess.run(cmd, check=True, env=env)
        doc = json.loads(report.read_text())
    return sorted((item["metadata"]["name"].lower(), item["metadata"]["version"]) for item in doc["install"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--python", default=None, help="resolve for this Python (default: this one)")
    ap.add_argument("--package", default="sglang", choices=["sglang", "smg"],
                    help="sglang (data/sglang/) or smg, the gateway (data/smg/)")
    args = ap.parse_args(argv)
    pkg = args.package
    pins = resolve(args.version, args.extra, args.python, pkg)
    py = args.python or ".".join(map(str, sys.version_info[:2]))
    header = [f"# {pkg}=={args.version}{' [' + ','.join(args.extra) + ']' if args.extra else ''}: every package "
              f"its venv holds, as pip resolves it from PyPI",
              f"# for Linux x86_64, Python {py} (tests/tools/sglang_lock.py; pip install -c this file).",
              "# The venv's name hashes this file: a refreshed lock makes a new venv."]
    out = DATA.parent / pkg / f"{args.version}.lock"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(header + [f"{name}=={ver}" for name, ver in pins if name != pkg]) + "\n")
    print(f"{out.relative_to(REPO)}: {len(pins) - 1} packages "
          f"({', '.join(f'{n}=={v}' for n, v in pins if n in ('torch', 'sgl-kernel', 'flashinfer-python'))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
