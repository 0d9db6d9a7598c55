#!/usr/bin/env python3
# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""The launch check's parser: SGLang's own argument parser (`sglang serve`'s, built by
`ServerArgs.add_cli_args`), captured as data the first time a venv checks an argv, and rebuilt
from that data for the next argv without importing SGLang.

Importing `sglang.srt.server_args` imports torch: 3-5 s of CPU on the twin for every argv a
deploy has not checked before (a new context length, a new flag), before the old release may
be stopped. The parser it builds is plain argparse: option strings, arity, builtin types and
choices. Those are captured, and so is a type function of SGLang's own (`human_readable_int`, which
reads `--context-length 128k`) whose code needs nothing beyond the standard library: its source
text and the standard-library names it uses, compiled again from the same text. An action that
is neither (a custom Action class, a type that needs a third-party module, `--help`) is captured
as *opaque*: its arity only. An argv that uses no opaque flag gets argparse's own verdict, the
same message included, from the rebuilt parser in about 0.1 s; an argv that uses one, or a venv
without a captured table (or one captured for a different venv state: KEY), is parsed by
SGLang's own parser, which captures the table for the next time. The table is written and read
by the launch check alone, as the service account in the server's sandbox, in the venv's folder
that account owns (tasks/venv.py PARSER_DIR; the server's own unit sees it read-only): a type's
source in it runs only where that account runs SGLang's code from that venv anyway, and root
never opens it.

    python launch_parser.py check [--prepare] TABLE KEY ARGV...     # tasks/venv.py runs it as python -c SOURCE

With --prepare (a release whose ServerArgs can be built without a GPU: versions.yaml
prepare_without_gpu), an argv the parser takes then goes through SGLang's own start checks:
`prepare_server_args(argv)` (the --config merge and the ServerArgs record, as `sglang serve`
builds it) and, where the release has it (0.5.23: `ServerArgs.resolve_once`, which
prepare_server_args leaves to the launcher), the resolution run on the same argv with
`--model-path dummy`: SGLang runs every model-independent validation before its dummy-model
return, and nothing after it (the checkpoint's config, GPU memory: "No accelerator ..." without
a GPU). An argv that parses but that SGLang would refuse at start is refused here, before the
old server stops.

Runs with the venv's python (the interpreter, so argparse, is SGLang's). Exit 0: parsed; 2:
refused, argparse's (or ServerArgs') message on stderr (without the 500-line usage); 1: SGLang
could not be imported. stdout says which parser decided. SGLang is imported only when the table
cannot decide or --prepare asks (sglang_parser: the venv holds it).
"""

from __future__ import annotations

import __future__
import argparse
import builtins
import contextlib
import dis
import hashlib
import importlib
import inspect
import io
import json
import os
import sys

PROG = "sglang serve"
SCHEMA = 1
KINDS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
         "_StoreConstAction": "store_const", "BooleanOptionalAction": "boolean_optional",
         "_AppendAction": "append", "_CountAction": "count"}
TYPES = {"str": str, "int": int, "float": float, "json": json.loads}
SCALARS = (str, int, float, bool, type(None))


def _type_name(t) -> str | None:
    if t is None:
        return None
    return next((name for name, known in TYPES.items() if t is known), "opaque")


def _globals_used(code) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _globals_used(const)
    return names


def capture_function(fn) -> dict | None:
    """A plain module-level function as {name, source, sha256, globals: {name: [module, attribute]}},
    when everything it reads is the standard library; else None."""
    if not inspect.isfunction(fn) or fn.__closure__ or fn.__defaults__ or fn.__kwdefaults__:
        return None
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    if not source.startswith(f"def {fn.__name__}("):
        return None
    refs: dict[str, list] = {}
    for name in sorted(_globals_used(fn.__code__)):
        if name not in fn.__globals__:
            if not hasattr(builtins, name):
                return None
            continue
        value = fn.__globals__[name]
        if inspect.ismodule(value):
            where = [value.__name__, None]
        else:
            module, attr = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
            if not (isinstance(module, str) and isinstance(attr, str) and "." not in attr):
                return None
            if getattr(sys.modules.get(module), attr, None) is not value:
                return None
            where = [module, attr]
        if where[0].split(".")[0] not in sys.stdlib_module_names:
            return None
        refs[name] = where
    return {"name": fn.__name__, "module": fn.__module__, "source": source,
            "sha256": hashlib.sha256(source.encode()).hexdigest(), "globals": refs}


def compile_function(doc: dict):
    """capture_function's record -> the function, compiled again from its source text."""
    if hashlib.sha256(doc["source"].encode()).hexdigest() != doc["sha256"]:
        raise ValueError(f"{doc['name']}: source does not match its sha256")
    ns: dict = {"__builtins__": builtins, "__name__": doc["module"]}
    for name, (module, attr) in doc["globals"].items():
        if module.split(".")[0] not in sys.stdlib_module_names:
            raise ValueError(f"{doc['name']}: reads {module}, not the standard library")
        value = importlib.import_module(module)
        ns[name] = getattr(value, attr) if attr else value
    code = compile(doc["source"], f"<{doc['module']}.{doc['name']} as captured>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    fn = ns[doc["name"]]
    if not inspect.isfunction(fn):
        raise ValueError(f"{doc['name']}: not a function")
    return fn


def capture(parser: argparse.ArgumentParser, key: str) -> dict:
    """PARSER as data: every action's flags, destination, kind, arity, builtin type, choices."""
    actions = []
    for a in parser._actions:
        kind = KINDS.get(type(a).__name__) if type(a).__module__ == "argparse" else None
        choices = list(a.choices) if a.choices is not None else None
        typ = _type_name(a.type)
        function = capture_function(a.type) if typ == "opaque" else None
        if function is not None:
            typ = "function"
        if choices is not None and not all(isinstance(c, SCALARS) for c in choices):
            typ = "opaque"
        const = a.const if isinstance(a.const, SCALARS) else None
        actions.append({"flags": list(a.option_strings), "dest": a.dest, "kind": kind or "opaque",
                        "nargs": a.nargs, "const": const, "type": typ, "choices": choices,
                        "required": bool(a.required), **({"function": function} if function else {})})
    index = {id(a): i for i, a in enumerate(parser._actions)}
    exclusive = [[index[id(a)] for a in g._group_actions] for g in parser._mutually_exclusive_groups]
    return {"schema": SCHEMA, "key": key, "prog": parser.prog, "allow_abbrev": parser.allow_abbrev,
            "prefix_chars": parser.prefix_chars, "actions": actions, "exclusive": exclusive}


def _opaque(e: dict) -> bool:
    return e["kind"] == "opaque" or e["type"] == "opaque"


def rebuild(doc: dict) -> tuple[argparse.ArgumentParser, dict[str, list[str]]]:
    """(the parser DOC describes, {destination: option strings} of its opaque actions). An opaque
    action keeps its arity and stores under a destination of its own only when the argv uses it."""
    p = argparse.ArgumentParser(prog=doc["prog"], allow_abbrev=doc["allow_abbrev"],
                                prefix_chars=doc["prefix_chars"], add_help=False)
    p.print_usage = lambda file=None: None
    groups = {}
    for members in doc["exclusive"]:
        g = p.add_mutually_exclusive_group()
        groups.update({i: g for i in members})
    opaque: dict[str, list[str]] = {}
    for i, e in enumerate(doc["actions"]):
        where = groups.get(i, p)
        names = e["flags"] or [e["dest"]]
        kw: dict = {} if not e["flags"] else {"dest": e["dest"], "required": e["required"]}
        kind = e["kind"]
        typ = None
        if e["type"] == "function":
            try:
                typ = compile_function(e["function"])
            except Exception:               # anything at all: that flag goes to SGLang's own parser
                e = {**e, "type": "opaque"}
        elif e["type"] in TYPES:
            typ = TYPES[e["type"]]
        elif e["type"] is not None:
            e = {**e, "type": "opaque"}
        if _opaque(e):
            if not e["flags"]:
                raise ValueError(f"{e['dest']}: an opaque positional")
            # its own destination (several actions may share one): present only when the argv uses it
            kw["dest"] = f"opaque {i} {e['dest']}"
            opaque[kw["dest"]] = e["flags"]
            kw["default"] = argparse.SUPPRESS
            if e["nargs"] == 0:
                kw.update(action="store_const", const=True)
            else:
                kw.update(action="store", nargs=e["nargs"])
        elif kind in ("store", "append"):
            kw.update(action=kind, nargs=e["nargs"], choices=e["choices"], const=e["const"])
            if typ is not None:
                kw["type"] = typ
        elif kind == "store_const":
            kw.update(action="store_const", const=e["const"])
        elif kind == "boolean_optional":
            names = [f for f in e["flags"] if not f.startswith("--no-")]
            kw["action"] = argparse.BooleanOptionalAction
        else:                                   # store_true, store_false, count
            kw["action"] = kind
        action = where.add_argument(*names, **kw)
        if list(action.option_strings) != e["flags"] or action.nargs != e["nargs"]:
            raise ValueError(f"{e['dest']}: rebuilt as {action.option_strings} nargs={action.nargs!r}")
    return p, opaque


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs   # the venv's SGLang: imports torch

    p = argparse.ArgumentParser(prog=PROG)
    ServerArgs.add_cli_args(p)
    p.print_usage = lambda file=None: None
    return p


def _read(table: str, key: str) -> dict | None:
    try:
        with open(table) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA and doc.get("key") == key else None


def _write(table: str, doc: dict) -> None:
    tmp = f"{table}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=0, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, table)


def _mentions(argv: list[str], flags: list[str], prefix_chars: str) -> list[str]:
    """The option strings of FLAGS that a word of ARGV may stand for: the flag itself, `flag=value`,
    a prefix of it (argparse takes unique prefixes) or a short flag with its value attached."""
    found = []
    for word in argv:
        if not word[:1] or word[0] not in prefix_chars:
            continue
        head = word.split("=", 1)[0]
        found += [f for f in flags if f.startswith(head) or (len(f) == 2 and f[1] not in prefix_chars
                                                              and word.startswith(f))]
    return sorted(set(found))


def decide(parser: argparse.ArgumentParser, opaque: dict[str, list[str]], argv: list[str]) -> tuple[int | None, str]:
    """The rebuilt PARSER's verdict on ARGV: (0, "") parsed; (2, argparse's message) refused;
    (None, why) when an opaque action takes part, whose own behaviour only SGLang has (--help
    exits at once, an Action may assert): SGLang's own parser decides."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            given = vars(parser.parse_args(argv))
    except SystemExit as exc:
        mentioned = _mentions(argv, [f for flags in opaque.values() for f in flags], parser.prefix_chars)
        if mentioned:
            return None, f"{', '.join(mentioned)} (not captured as plain argparse) may take part"
        return (exc.code if isinstance(exc.code, int) else 2), err.getvalue()
    used = sorted(opaque[d][0] for d in opaque if d in given)
    if used:
        return None, f"{', '.join(used)}: not captured as plain argparse"
    return 0, ""


def prepare(argv: list[str]) -> int:
    """SGLang's own start checks that need no GPU (see the module's docstring): 0, or 2 with
    ServerArgs' message. Their log lines are kept out of the output (a record's repr holds the
    API key)."""
    from sglang.srt.server_args import prepare_server_args

    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            prepare_server_args(argv)
            probe = prepare_server_args([*argv, "--model-path", "dummy"])
            if hasattr(probe, "resolve_once"):
                probe.resolve_once()
    except SystemExit as exc:                                # argparse inside, after the --config merge
        sys.stderr.write(said.getvalue()[-2000:])
        return exc.code if isinstance(exc.code, int) and exc.code else 2
    except Exception as exc:                                 # ServerArgs' own refusal, as SGLang raises it
        print(f"SGLang's ServerArgs refuses this argv: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print("passed SGLang's own start checks (prepare_server_args; the model-independent resolution)")
    return 0


def check(table: str, key: str, argv: list[str], with_prepare: bool = False) -> int:
    code = parse(table, key, argv)
    return prepare(argv) if code == 0 and with_prepare else code


def parse(table: str, key: str, argv: list[str]) -> int:
    """The parser's verdict: the captured table's when it decides, else SGLang's own, imported."""
    doc = _read(table, key)
    if doc is not None:
        try:
            parser, opaque = rebuild(doc)
        except (ValueError, TypeError, KeyError, argparse.ArgumentError):
            parser, opaque = None, {}
        if parser is not None:
            code, said = decide(parser, opaque, argv)
            if code == 0:
                print(f"parsed by SGLang's parser as captured in {table}")
                return 0
            if code is not None:
                sys.stderr.write(said)              # argparse's own message, as SGLang's parser says it
                return code
            print(f"{said}: SGLang's own parser decides")
    try:
        parser = sglang_parser()
    except ImportError as exc:
        print(f"SGLang's parser cannot be imported: {exc}", file=sys.stderr)
        return 1
    try:
        _write(table, capture(parser, key))
    except OSError as exc:                                    # the check itself stands without it
        print(f"the parser table was not written ({exc})", file=sys.stderr)
    parser.parse_args(argv)                                   # a refusal exits 2 here
    print("parsed by SGLang's own parser (imported)")
    return 0


def main(argv: list[str]) -> int:
    with_prepare = argv[1:2] == ["--prepare"]
    if with_prepare:
        argv = argv[:1] + argv[2:]
    if len(argv) < 3 or argv[0] != "check":
        print("usage: launch_parser.py check [--prepare] TABLE KEY ARGV...", file=sys.stderr)
        return 2
    return check(argv[1], argv[2], argv[3:], with_prepare)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
