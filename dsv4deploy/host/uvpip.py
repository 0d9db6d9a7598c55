# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""The control node's installer: uv, pinned by the sha256 of its wheels (data/uv.requirements),
bootstrapped with pip, installing with what pip's own configuration says (indexes, find-links,
certificate, proxy) so that a machine set up for pip needs nothing more; an http:// index there
is refused (refused_locations).

Why not pip: a fresh venv of this project's lock takes pip 82 s on an idle 2-core machine and
uv 17 s (byte-compiled); a parser venv for the tests (2.2 GB, CPU torch) 113 s against 40 s,
11 s of it the install. Both install the same pinned wheels. Stdlib only: the Makefile runs it with bare python3, before any
venv exists::

    python3 -m dsv4deploy.host.uvpip install --python .venv/bin/python --compile-bytecode --require-hashes -r requirements.lock
    python3 -m dsv4deploy.host.uvpip path          # the uv it runs (bootstrapped if missing)

As a module: ``uv(home)`` (its path), ``install_command(python, args, home, environ)``,
``pip_settings()``; ``UvHome.of(environ, root)`` says where uv and its cache live (main reads
DSV4_UV_HOME and UV_CACHE_DIR, else .cache/ of the working directory: the checkout, for make).
It also runs on the GPU host (host/installer.py: the host's uv, pinned, fills the venvs there;
the installer's command sets both variables).
"""

from __future__ import annotations

import hashlib
import json
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
    if not settings.get("cert"):
        # pip trusts the system's certificate store (truststore); uv, by default, only the roots
        # built into it: a host behind a TLS-inspecting proxy whose CA is in the system store
        # reaches PyPI with pip and not with uv unless told (measured on the twin)
        args.append("--system-certs")
    return args, env


# Where packages may come from: https://, or this machine's own files (file://, a path). An index
# or wheel folder over http:// (or another scheme) can be answered by anyone on the way.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_TRUSTED = re.compile(r"(?i)(https|file)://")
_LOCATION_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--index", "--default-index"}
_INDEX_NAME = re.compile(r"[A-Za-z0-9._-]+=(?=[A-Za-z][A-Za-z0-9+.-]*://)")    # uv's `--index name=url`


class RefusedLocation(ValueError):
    """An install would fetch from a location anyone on the network path could answer for."""


def _untrusted(location: str) -> bool:
    location = _INDEX_NAME.sub("", location, count=1)
    return bool(_SCHEME.match(location)) and not _TRUSTED.match(location)


def refused_locations(settings: dict[str, list[str]], given: list[str] = ()) -> list[str]:
    """Each index or find-links location, of pip's configuration (SETTINGS) or of the command itself
    (GIVEN), that is neither https:// nor this machine's files, as the message names it. Refused,
    not dropped: dropping pip's index-url would send the install to PyPI unasked, dropping an extra
    index would leave a package its owner put there unfound; the operator fixes the setting."""
    found = [f"pip's configuration (`pip config list`, or PIP_{key.upper().replace('-', '_')}): {key} {value}"
             for key in _INDEX_KEYS for value in settings.get(key, []) if _untrusted(value)]
    found += [f"{option} {value}" for option, value in zip(given, given[1:])
              if option in _LOCATION_OPTIONS and _untrusted(value)]
    return found


PINNED_INDEX = "--pinned-index"      # ours, not uv's: NAME:PACKAGE,PACKAGE=URL
_PINNED = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*):(?P<packages>[A-Za-z0-9][A-Za-z0-9._,-]*)=(?P<url>\S+)")


def index_pins(given: list[str]) -> tuple[str | None, list[str]]:
    """(a pyproject.toml that pins packages to named indexes, or None; the other arguments).
    `--pinned-index pytorch:torch,triton=https://...` becomes an explicit index (no package comes
    from it unless named) and a source per package, which `uv pip install -r pyproject.toml`
    honours for that package wherever it appears in the resolution; uv's own --index has no such
    pin, and best match across indexes would take a name from whichever index has the newest."""
    rest, indexes = [], []
    args = iter(given)
    for arg in args:
        if arg != PINNED_INDEX:
            rest.append(arg)
            continue
        value = next(args, "")
        m = _PINNED.fullmatch(value)
        if not m or _untrusted(m["url"]) or not _TRUSTED.match(m["url"]):
            raise ValueError(f"{PINNED_INDEX} {value!r}: want NAME:PACKAGE,PACKAGE=https://URL")
        indexes.append((m["name"], m["packages"].split(","), m["url"]))
    if not indexes:
        return None, rest
    q = json.dumps                      # a JSON string is a TOML basic string
    packages = [p for _, names, _ in indexes for p in names]
    lines = ["[project]", 'name = "dsv4deploy-index-pins"', 'version = "0"',
             f"dependencies = [{', '.join(q(p) for p in packages)}]", "", "[tool.uv.sources]"]
    lines += [f"{q(p)} = {{ index = {q(name)} }}" for name, names, _ in indexes for p in names]
    for name, _, url in indexes:
        lines += ["", "[[tool.uv.index]]", f"name = {q(name)}", f"url = {q(url)}", "explicit = true"]
    return "\n".join(lines) + "\n", rest


def _pins_file(text: str, home: UvHome) -> Path:
    """TEXT as a pyproject.toml under HOME.cache, named by its hash (written whole, then renamed)."""
    folder = home.cache / "dsv4deploy-index-pins" / hashlib.sha256(text.encode()).hexdigest()[:16]
    path = folder / "pyproject.toml"
    if not (path.is_file() and path.read_text() == text):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".pyproject.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def requirements_file() -> Path:
    """uv's pin with the sha256 of each wheel: data/uv.requirements of the package, or beside this
    file where it runs alone (the host's tool folder, host/installer.py)."""
    here = Path(__file__).resolve()
    for path in (here.with_name("uv.requirements"), here.parent.parent / "data" / "uv.requirements"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"no uv.requirements beside {here} or in {here.parent.parent / 'data'}")


def uv(home: UvHome) -> Path:
    """The pinned uv, in a venv of its own under HOME.tools, bootstrapped with pip once: wheels
    only, each checked against the sha256 of requirements_file() (--require-hashes), so an index
    or a wheel folder that serves another file is refused."""
    tools = home.tools
    path = tools / "bin" / "uv"
    if path.is_file():
        return path
    requirements = requirements_file()
    tmp = tools.with_name(f".{tools.name}.{os.getpid()}")
    try:
        subprocess.run([sys.executable, "-I", "-m", "venv", str(tmp)], check=True)
        subprocess.run([str(tmp / "bin" / "python"), "-I", "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "--no-deps", "--require-hashes", "--only-binary", ":all:",
                        "-r", str(requirements)], check=True)
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
    pins, args = index_pins(args)
    listing = subprocess.run(PIP_CONFIG, capture_output=True, text=True).stdout
    settings = pip_settings(listing)
    refused = refused_locations(settings, args)
    if refused:
        raise RefusedLocation("; ".join(refused))
    extra, env = uv_arguments(settings, args)
    if pins:
        args = ["-r", str(_pins_file(pins, home)), *args]
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
    except RefusedLocation as exc:
        print(f"dsv4deploy: refused to install from {exc}: a package index or wheel folder over http:// can "
              "be answered by anyone on the way; use https:// (or file:// for a folder on this machine)",
              file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"dsv4deploy: {exc}", file=sys.stderr)
        return 2
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"dsv4deploy: could not bootstrap uv {UV_VERSION} under {home.tools} with {sys.executable} -m pip "
              f"({exc}); pip's own output is above. Is PyPI (or pip's configured index) reachable?", file=sys.stderr)
        return 1
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
