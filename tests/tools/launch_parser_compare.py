#!/usr/bin/env python3
"""Runs inside an SGLang parser venv (tests/tools/sglang_parser.py) for tests/test_launch_parser_sglang.py:
SGLang's own parser against the one dsv4deploy/sglang/launch_parser.py rebuilds from its captured table,
argv by argv, in one process (one SGLang import). Reads {"program": path, "argvs": [[...]]} on
stdin; prints {"table": {...}, "results": [{"real": verdict, "rebuilt": verdict}]} where a verdict
is {"code": 0 | 2, "message": argparse's last stderr line} and rebuilt may also be "sglang" (the
argv uses an opaque flag: SGLang's own parser decides)."""

import contextlib
import importlib.util
import io
import json
import sys


def rebuilt_verdict(lp, parser, opaque, argv):
    code, said = lp.decide(parser, opaque, argv)
    if code is None:
        return "sglang"
    lines = said.strip().splitlines()
    return {"code": code, "message": lines[-1] if lines else ""}


def verdict(parser, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines()
        return {"code": exc.code, "message": lines[-1] if lines else ""}
    except Exception as exc:            # an action of SGLang's own that asserts (LoRAPathAction)
        return {"code": "exception", "message": f"{type(exc).__name__}: {exc}"}
    return {"code": 0, "message": ""}


def main() -> int:
    payload = json.loads(sys.stdin.read())
    spec = importlib.util.spec_from_file_location("launch_parser", payload["program"])
    lp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lp)
    out = sys.stdout
    sys.stdout = sys.stderr
    real = lp.sglang_parser()
    table = json.loads(json.dumps(lp.capture(real, "compare")))      # as written and read back
    rebuilt, opaque = lp.rebuild(table)
    results = [{"real": verdict(real, argv), "rebuilt": rebuilt_verdict(lp, rebuilt, opaque, argv)} for argv in payload["argvs"]]
    out.write(json.dumps({"table": table, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
