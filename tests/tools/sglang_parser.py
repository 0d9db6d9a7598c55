#!/usr/bin/env python3
"""SGLang's own launch-flag parser, on a CPU-only machine, for a pinned SGLang version.

Builds (once, cached) a venv under ``.cache/sglang-parser/<version>/`` holding ``sglang==<version>``
installed with ``--no-deps`` plus only what ``import sglang.srt.server_args`` needs (torch, triton,
numpy and a dozen small packages; see ``PARSER_IMPORTS``), every one of them a line of the host's
own lock (``dsv4deploy/data/sglang/<version>.lock``: same version, same sha256, from PyPI). Nothing
in SGLang is stubbed or patched: the parser that answers is the one ``sglang serve`` /
``python -m sglang.launch_server`` builds.

Command line::

    python tests/tools/sglang_parser.py ensure VERSION
    python tests/tools/sglang_parser.py prebuild                 # ensure each of PREBUILT (make test)
    python tests/tools/sglang_parser.py parse VERSION [--prepare] -- ARGV...
    python tests/tools/sglang_parser.py dump-flags VERSION [-o FILE]
    python tests/tools/sglang_parser.py dump-arity VERSION [-o FILE]   # FLAG 0|1|?|*|+
    python tests/tools/sglang_parser.py actions VERSION          # every action as JSON

``parse`` does what ``prepare_server_args(argv)`` does up to ``parse_args``:
``argparse.ArgumentParser(prog="sglang serve")``, ``ServerArgs.add_cli_args``, SGLang's
``ConfigArgumentMerger`` when ``--config`` is in argv, then ``parse_args``; it prints the
namespace as JSON, or argparse's message and exit status 2. ``--prepare`` calls the real
``prepare_server_args(argv)`` instead and prints the ServerArgs fields (cheap and GPU-free from
0.5.20 on; 0.5.17 resolves there and raises "No accelerator ...").

As a module: ``ensure(version)``, ``parse(version, argv)``, ``parse_many(version, argvs)``
(one subprocess for all), ``dump_flags(version)``, ``actions(version)``.

This file also runs inside the built venv as the worker (``_worker``); keep it stdlib-only.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE_ROOT = Path(os.environ.get("SGLANG_PARSER_CACHE", REPO / ".cache" / "sglang-parser"))
PIP_CACHE = REPO / ".cache" / "pip"
LOCKS = REPO / "dsv4deploy" / "data" / "sglang"
MARKER = ".complete.json"
# The versions `make test` builds ahead, in the background (test_sglang_parser, test_pr25820_patch):
# from the Makefile before the control venv installs, and again by tests/conftest.py (the same lock)
PREBUILT = ("0.5.23", "0.5.13.post1")
RECIPE_VERSION = 2

# What `import sglang.srt.server_args` + ServerArgs.add_cli_args import, found by installing
# `sglang --no-deps` and adding the missing module until the parser built (0.5.17 to 0.5.23).
# Imported at module level by sglang/__init__ -> srt/utils/common.py: numpy orjson psutil
# pybase64 requests torch triton packaging PIL starlette; arg_groups/*: msgspec;
# utils/msgspec_utils: pydantic_core; utils/network: zmq; sglang/utils.py: IPython pydantic
# tqdm; lang/backend/runtime_endpoint: aiohttp. pyyaml: ConfigArgumentMerger (--config).
# Installed with what they require, as the lock pins it (torch: the lock's CUDA build and its
# nvidia-* wheels, which import without a GPU).
PARSER_IMPORTS = ("numpy", "orjson", "psutil", "pybase64", "requests", "torch", "triton", "packaging",
                  "pillow", "starlette", "msgspec", "pydantic", "pyzmq", "tqdm", "ipython", "aiohttp",
                  "pyyaml")

# Releases before 0.5.23 also import, on the way to the parser: transformers (sglang/__init__
# and srt/configs), openai + partial_json_parser + xgrammar (function_call parsers, for the
# --tool-call-parser choices), sentencepiece (transformers' tokenizers), dill (torch datapipes
# once transformers is there) and torchvision (srt/utils/common.py: `from torchvision.io import
# decode_jpeg`, the lock's CUDA build, which loads next to the lock's torch).
LEGACY_BEFORE = (0, 5, 23)
LEGACY_IMPORTS = ("transformers", "openai", "partial-json-parser", "xgrammar", "sentencepiece", "dill",
                  "torchvision")


def _vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def is_legacy(version: str) -> bool:
    return _vtuple(version) < LEGACY_BEFORE


class ParserToolError(RuntimeError):
    pass


# --- the venv ---------------------------------------------------------------------------------

def lock_path(version: str) -> Path:
    """The host's lock of VERSION (dsv4deploy.sglang.versions.lock_file: this file stays
    stdlib-only, it also runs inside the built venv)."""
    return LOCKS / f"{version}.lock"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(lock_text: str, names) -> str:
    """The entries of LOCK_TEXT (a `uv export --hashes` requirements file: `name==version ; marker \\`
    then its `--hash=` lines) whose package is one of NAMES, whole (every marker variant kept)."""
    wanted = {_normal(name) for name in names}
    blocks = re.split(r"\n(?=[^\s#])", lock_text)
    picked = [block.rstrip() + "\n" for block in blocks
              if (m := re.match(r"([A-Za-z0-9_.-]+)==", block)) and _normal(m[1]) in wanted]
    found = {_normal(re.match(r"[A-Za-z0-9_.-]+", block)[0]) for block in picked}
    if found != wanted:
        raise ParserToolError(f"not in the lock: {', '.join(sorted(wanted - found))}")
    return "".join(picked)


def parser_packages(version: str) -> tuple[str, ...]:
    """The packages installed with their dependencies (SGLang itself goes in with --no-deps)."""
    return PARSER_IMPORTS + (LEGACY_IMPORTS if is_legacy(version) else ())


def _recipe(version: str) -> dict:
    lock = lock_path(version)
    return {"recipe": RECIPE_VERSION, "sglang": version, "packages": list(parser_packages(version)),
            "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None}


def _recipe_hash(version: str) -> str:
    return hashlib.sha256(json.dumps(_recipe(version), sort_keys=True).encode()).hexdigest()[:16]


def venv_dir(version: str) -> Path:
    return CACHE_ROOT / version


def venv_python(version: str) -> Path:
    return venv_dir(version) / "bin" / "python"


def is_complete(version: str) -> bool:
    marker = venv_dir(version) / MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return info.get("recipe_hash") == _recipe_hash(version) and venv_python(version).exists()


def _base_python() -> str:
    """A CPython 3.11 (the lock is resolved for 3.11 and 3.12): this interpreter if it is one."""
    explicit = os.environ.get("SGLANG_PARSER_PYTHON")
    if explicit:
        return explicit
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if not found:
        raise ParserToolError("need CPython 3.11 (set SGLANG_PARSER_PYTHON)")
    return found


def _installer(python: str) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of `uv pip install --require-hashes` into the venv of PYTHON: the
    project's pinned uv and its cache (.cache/uv-cache: one file system with the venvs, so both
    parser venvs and the cache share files as hardlinks), from PyPI only, with this machine's pip
    and uv configuration (local wheel folders, mirrors) ignored, as the lock was resolved."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dsv4deploy.host import uvpip
    from sglang_lock import INDEX, clean_env
    home = uvpip.UvHome.of(os.environ, REPO)
    return ([str(uvpip.uv(home)), "pip", "install", "--quiet", "--python", python, "--cache-dir", str(home.cache),
             "--index-url", INDEX, "--system-certs", "--only-binary", ":all:", "--require-hashes"],
            clean_env())


def _run(cmd: list[str], log, **kw) -> None:
    log(f"$ {' '.join(cmd)}")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode != 0:
        raise ParserToolError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
                              + proc.stdout[-4000:])


def _install(venv: Path, version: str, log) -> None:
    """SGLang alone from its lock line (--no-deps keeps its CUDA stack out: flashinfer,
    sgl-kernel, ...), then what its parser imports, resolved under the whole lock as constraints:
    every package a lock line, checked against its sha256. The requirement files stay in the venv."""
    lock = lock_path(version)
    if not lock.is_file():
        raise ParserToolError(f"{lock}: no lock for sglang {version} (tests/tools/sglang_lock.py {version} writes one)")
    text = lock.read_text()
    own = venv / "sglang.requirements"
    own.write_text(lock_entries(text, ["sglang"]))
    imports = venv / "parser-imports.requirements"
    imports.write_text(lock_entries(text, parser_packages(version)))
    uv, env = _installer(str(venv / "bin" / "python"))
    _run(uv + ["--no-deps", "-r", str(own)], log, env=env)
    _run(uv + ["-c", str(lock), "-r", str(imports)], log, env=env)


def ensure(version: str, log=None) -> Path:
    """The venv python for `version`, building the venv first if it is missing or stale.

    Built in a temporary folder beside the final one and renamed into place with its marker,
    under a lock, so a half-built venv is never used and two builders do not collide.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if is_complete(version):
        return venv_python(version)
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(version):
            return venv_python(version)
        started = time.monotonic()
        final = venv_dir(version)
        # a builder that died (a pytest run that ended mid-build) left its folder: under the lock
        # no other builder is at work, so every one there is stale
        for stale in CACHE_ROOT.glob(f".{version}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = CACHE_ROOT / f".{version}.building-{os.getpid()}"
        try:
            # python -m venv, not uv's: the venv has pip (test_pr25820_patch installs with it)
            _run([_base_python(), "-m", "venv", str(tmp)], log)
            _install(tmp, version, log)
            # Proof of completeness: the parser builds and has the version asked for (and its
            # first call writes the bytecode of exactly the modules the parser imports).
            out = _worker_call(tmp / "bin" / "python", "info", {})
            if out.get("version") != version:
                raise ParserToolError(f"built venv reports sglang {out.get('version')}")
            info = {**_recipe(version), "recipe_hash": _recipe_hash(version),
                    "build_seconds": round(time.monotonic() - started, 1),
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"sglang-parser {version}: built in {time.monotonic() - started:.0f} s at {final}")
    return venv_python(version)


# --- talking to the worker ----------------------------------------------------------------------

def _worker_call(python: Path, mode: str, payload) -> dict | list:
    # Bytecode is written into the venv (the build's first call writes it for exactly the
    # modules the parser imports): importing torch + SGLang from source costs ~10 s, from
    # bytecode ~4 s.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([str(python), str(Path(__file__).resolve()), "_worker", mode],
                          input=json.dumps(payload), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        raise ParserToolError(f"worker {mode} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def query(version: str, argvs: list[list[str]], prepare: bool = False) -> dict:
    """One subprocess: {"version", "flags": every option string, "results": one per argv}.
    An argv may also be {"argv": [...], "prepare": True} (per-argv choice). A result is
    {"ok": True, "values": {dest: value}, "stderr": "...", "argv": [...]} or
    {"ok": False, "exit_code": 2, "error": "<usage + argparse message>"}."""
    items = [a if isinstance(a, dict) else list(a) for a in argvs]
    return _worker_call(ensure(version), "parse", {"argvs": items, "prepare": prepare})


def parse_many(version: str, argvs: list[list[str]], prepare: bool = False) -> list[dict]:
    """Parse every argv in one subprocess; see query() for the result format."""
    return query(version, argvs, prepare)["results"]


def parse(version: str, argv: list[str], prepare: bool = False) -> dict:
    return parse_many(version, [argv], prepare)[0]


def actions(version: str) -> list[dict]:
    return _worker_call(ensure(version), "actions", {})


def dump_flags(version: str) -> list[str]:
    """Every option string, in parser order (as `0.5.23.flags` has them, -h/--help included)."""
    return [opt for action in actions(version) for opt in action["option_strings"]]


def arity(action: dict) -> str:
    """How many argv words an option takes: 0, 1, '?', '*', '+' (argparse's nargs; None is 1)."""
    nargs = action["nargs"]
    return "1" if nargs is None else str(nargs)


def dump_arity(version: str) -> list[str]:
    """`FLAG ARITY` per option string, parser order (`<version>.arity`, read by the validator to
    tell a flag's value from a bare positional in extra_args)."""
    return [f"{opt} {arity(action)}" for action in actions(version) for opt in action["option_strings"]]


# --- the worker (runs inside the built venv) -----------------------------------------------------

def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "value") and isinstance(getattr(value, "value"), (str, int)):  # enums
        return value.value
    return repr(value) if callable(value) else str(value)


def _server_args_fields(sa_mod, server_args) -> dict:
    """The fields of a ServerArgs record: 0.5.23 assembles it from field namespaces
    (record_fields), older releases make it a plain dataclass."""
    import dataclasses
    if hasattr(sa_mod, "record_fields"):
        names = [f.name for f in sa_mod.record_fields(type(server_args))]
    elif dataclasses.is_dataclass(server_args):
        names = [f.name for f in dataclasses.fields(server_args)]
    else:
        names = [k for k in vars(server_args) if not k.startswith("_")]
    return {name: getattr(server_args, name) for name in names}


def _worker(mode: str) -> int:
    payload = json.loads(sys.stdin.read() or "{}")
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever SGLang prints on import stays off the JSON channel
    from sglang.srt import server_args as sa_mod
    from sglang.srt.server_args import ServerArgs

    try:
        from sglang.version import __version__ as sglang_version
    except ImportError:  # pragma: no cover
        from importlib.metadata import version as _v
        sglang_version = _v("sglang")

    def build_parser() -> argparse.ArgumentParser:
        # Exactly what prepare_server_args() builds.
        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        return parser

    def parse_one(argv: list[str], prepare: bool) -> dict:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                if prepare:
                    server_args = sa_mod.prepare_server_args(list(argv))
                    values = _server_args_fields(sa_mod, server_args)
                else:
                    parser = build_parser()
                    if "--config" in argv:  # as prepare_server_args does
                        try:  # 0.5.20+
                            from sglang.srt.utils.server_args_config_parser import (
                                ConfigArgumentMerger)
                        except ImportError:  # 0.5.17
                            from sglang.srt.server_args_config_parser import ConfigArgumentMerger
                        argv = ConfigArgumentMerger(parser).merge_config_with_args(list(argv))
                    values = vars(parser.parse_args(argv))
            return {"ok": True, "values": _jsonable(values), "stderr": err.getvalue(),
                    "argv": list(argv)}
        except SystemExit as exc:  # argparse's error(): usage + message, exit 2
            return {"ok": False, "exit_code": exc.code if isinstance(exc.code, int) else 1,
                    "error": err.getvalue()}
        except Exception as exc:  # e.g. ConfigArgumentMerger's ValueError
            return {"ok": False, "exit_code": 1, "error": f"{type(exc).__name__}: {exc}",
                    "stderr": err.getvalue()}

    if mode == "info":
        result = {"version": sglang_version, "actions": len(build_parser()._actions)}
    elif mode == "parse":
        result = {
            "version": sglang_version,
            "flags": [opt for a in build_parser()._actions for opt in a.option_strings],
            # an entry is an argv, or {"argv": [...], "prepare": bool} to choose per argv
            "results": [parse_one(item["argv"], item.get("prepare", False))
                        if isinstance(item, dict)
                        else parse_one(item, payload.get("prepare", False))
                        for item in payload["argvs"]],
        }
    elif mode == "actions":
        result = [{
            "option_strings": list(a.option_strings),
            "dest": a.dest,
            "default": _jsonable(a.default),
            "choices": _jsonable(list(a.choices)) if a.choices is not None else None,
            "nargs": _jsonable(a.nargs),
            "type": getattr(a.type, "__name__", None) if a.type is not None else None,
            "action": type(a).__name__,
            "required": a.required,
            "help": a.help if isinstance(a.help, str) else None,
        } for a in build_parser()._actions]
    else:
        raise SystemExit(f"unknown worker mode {mode}")
    out.write(json.dumps(result))
    out.flush()
    return 0


# --- command line -------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        return _worker(argv[1])
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    cli = argparse.ArgumentParser(prog="sglang_parser", description=__doc__.split("\n\n")[0])
    sub = cli.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure", help="build the venv for VERSION if missing").add_argument("version")
    sub.add_parser("prebuild", help=f"ensure each of {', '.join(PREBUILT)} (what make test needs)")
    p_parse = sub.add_parser("parse", help="parse ARGV (after --) with VERSION's parser")
    p_parse.add_argument("version")
    p_parse.add_argument("--prepare", action="store_true",
                         help="call prepare_server_args(argv) instead of parse_args")
    p_dump = sub.add_parser("dump-flags", help="print every option string, parser order")
    p_dump.add_argument("version")
    p_dump.add_argument("-o", "--output", type=Path)
    p_arity = sub.add_parser("dump-arity", help="print 'FLAG ARITY' (0 1 ? * +) per option string")
    p_arity.add_argument("version")
    p_arity.add_argument("-o", "--output", type=Path)
    sub.add_parser("actions", help="every parser action as JSON").add_argument("version")
    args = cli.parse_args(argv)
    try:
        if args.cmd in ("ensure", "prebuild"):
            for version in [args.version] if args.cmd == "ensure" else PREBUILT:
                started = time.monotonic()
                print(ensure(version))
                print(f"ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
        elif args.cmd == "parse":
            result = parse(args.version, rest, prepare=args.prepare)
            if not result["ok"]:
                sys.stderr.write(result["error"])
                return result["exit_code"]
            sys.stderr.write(result.get("stderr", ""))
            print(json.dumps(result["values"], indent=2, sort_keys=True))
        elif args.cmd == "dump-flags":
            text = "".join(f"{flag}\n" for flag in dump_flags(args.version))
            if args.output:
                args.output.write_text(text)
            else:
                sys.stdout.write(text)
        elif args.cmd == "dump-arity":
            text = "".join(f"{line}\n" for line in dump_arity(args.version))
            if args.output:
                args.output.write_text(text)
            else:
                sys.stdout.write(text)
        elif args.cmd == "actions":
            print(json.dumps(actions(args.version), indent=1))
    except ParserToolError as exc:
        print(f"sglang_parser: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
