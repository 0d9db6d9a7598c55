# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""The control node's installer: uv, pinned, bootstrapped with pip, installing with what pip's own
configuration says (indexes, find-links, certificate, proxy) so that a machine set up for pip
needs nothing more.

Why not pip: a fresh venv of this project's lock takes pip 82 s on an idle 2-core machine and
uv 17 s (byte-compiled); a parser venv for the tests (2.2 GB, CPU torch) 113 s against 40 s,
11 s of it the install. Both install the same pinned wheels. Stdlib only: the Makefile runs it with bare python3, before any
venv exists::

    python3 -m dsv4deploy.host.uvpip install --python .venv/bin/python --compile-bytecode -c requirements.lock -e '.[test,twin]'
    python3 -m dsv4deploy.host.uvpip path          # the uv it runs (bootstrapped if missing)

As a module: ``uv(home)`` (its path), ``install_command(python, args, home, environ)``,
``pip_settings()``; ``UvHome.of(environ, root)`` says where uv and its cache live (main reads
DSV4_UV_HOME and UV_CACHE_DIR, else .cache/ of the working directory: the checkout, for make).
It also runs on the GPU host (host/installer.py: the host's uv, pinned, fills the venvs there;
the installer's command sets both variables).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

UV_VERSION = "0.13.9"


@dataclass(frozen=True)
class UvHome:
    """Where the pinned uv lives (TOOLS: a venv of its own) and where it caches (CACHE)."""

    tools: Path
    cache: Path

    @classmethod
    def of(cls, environ: Mapping[str, str], root: Path) -> "UvHome":
        """DSV4_UV_HOME and UV_CACHE_DIR of ENVIRON, else under ROOT/.cache: in the checkout, not
        ~/.cache (a fresh clone starts cold, as CI does; one file system with the venvs it fills,
        so uv hardlinks from it)."""
        return cls(tools=Path(environ.get("DSV4_UV_HOME") or root / ".cache" / f"uv-{UV_VERSION}"),
                   cache=Path(environ.get("UV_CACHE_DIR") or root / ".cache" / "uv-cache"))

# pip's keys that say where packages come from, and how to reach it; (uv's option, repeated?)
_INDEX_KEYS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}
_ENV_KEYS = {"cert": "SSL_CERT_FILE", "proxy": "HTTPS_PROXY"}
_LINE = re.compile(r"(?P<section>[^.]*)\.(?P<key>[a-z0-9_-]+)='(?P<value>.*)'\Z")
_PRECEDENCE = {"global": 0, "install": 1, ":env:": 2}   # later wins, as in pip


def pip_settings(listing: str) -> dict[str, list[str]]:
    """From `pip config list` output: key -> values, the highest-precedence section's only
    (pip does not merge a key across sections: install.* over global.*, PIP_* over both)."""
    best: dict[str, tuple[int, list[str]]] = {}
    for line in listing.splitlines():
        m = _LINE.fullmatch(line.strip())
        if not m:
            continue
        key = m["key"].replace("_", "-")
        rank = _PRECEDENCE.get(m["section"], 0)
        if (key in _INDEX_KEYS or key in _ENV_KEYS) and rank >= best.get(key, (-1, []))[0]:
            best[key] = (rank, m["value"].split())
    return {key: values for key, (_, values) in best.items()}


def uv_arguments(settings: dict[str, list[str]], given: list[str] = ()) -> tuple[list[str], dict[str, str]]:
    """(uv pip install options, environment) that say what SETTINGS say to pip. pip takes the
    best match across every index it is given; so does uv with unsafe-best-match (its default
    stops at the first index that has the name). An --index-url or --index-strategy the command
    itself GIVEN (a profile's index) wins over the configuration's, as on pip's command line."""
    args: list[str] = []
    for key, option in _INDEX_KEYS.items():
        if option == "--index-url" and option in given:
            continue
        for value in settings.get(key, []):
            args += [option, value]
    if settings.get("extra-index-url") and "--index-strategy" not in given:
        args += ["--index-strategy", "unsafe-best-match"]
    env = {var: settings[key][0] for key, var in _ENV_KEYS.items() if settings.get(key)}
    return args, env


def uv(home: UvHome) -> Path:
    """The pinned uv, in a venv of its own under HOME.tools (bootstrapped with pip once)."""
    tools = home.tools
    path = tools / "bin" / "uv"
    if path.is_file():
        return path
    tmp = tools.with_name(f".{tools.name}.{os.getpid()}")
    try:
        subprocess.run([sys.executable, "-I", "-m", "venv", str(tmp)], check=True)
        subprocess.run([str(tmp / "bin" / "python"), "-I", "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", f"uv=={UV_VERSION}"], check=True)
        # renamed whole once complete: the venv's own scripts then name a folder that is gone,
        # but uv is a static binary and runs from anywhere
        os.rename(tmp, tools)
    except (OSError, subprocess.CalledProcessError):
        if not path.is_file():       # another builder's rename wins the race: use its uv
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


# -I: on the host root runs this; a `pip/` in the login's directory or a PYTHONPATH would otherwise
# answer for pip (its PIP_* variables and configuration files still count)
PIP_CONFIG = [sys.executable, "-I", "-m", "pip", "config", "list"]


def install_command(python: str, args: list[str], home: UvHome,
                    environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of `uv pip install ARGS` into the venv of PYTHON, with pip's settings:
    the environment is ENVIRON (the caller's) with what pip's configuration says added."""
    listing = subprocess.run(PIP_CONFIG, capture_output=True, text=True).stdout
    extra, env = uv_arguments(pip_settings(listing), args)
    return ([str(uv(home)), "pip", "install", "--quiet", "--python", python, "--cache-dir", str(home.cache),
             *extra, *args], {**environ, **env})


def main(argv: list[str]) -> int:
    home = UvHome.of(os.environ, Path.cwd())
    if argv[:1] != ["path"] and (argv[:2] != ["install", "--python"] or len(argv) < 3):
        print("usage: python3 -m dsv4deploy.host.uvpip install --python PYTHON ARGS... | path", file=sys.stderr)
        return 2
    try:
        if argv[:1] == ["path"]:
            print(uv(home))
            return 0
        cmd, env = install_command(argv[2], argv[3:], home, os.environ)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"dsv4deploy: could not bootstrap uv {UV_VERSION} under {home.tools} with {sys.executable} -m pip "
              f"({exc}); pip's own output is above. Is PyPI (or pip's configured index) reachable?", file=sys.stderr)
        return 1
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
