#!/usr/bin/env python3
"""Where SGLang shows its server args, what does it show? Runs INSIDE the sglang-parser venv.

Used by tests/test_sglang_mask_patch.py with ``PYTHONPATH=<a copy of site-packages>`` so that
the ``sglang`` imported is that copy (patched or pristine). Stdin: JSON ``{"argvs": [[...],
...]}`` (argvs for ``prepare_server_args``, e.g. with ``--config FILE``). Stdout: JSON
``{"sglang_file", "version", "results": [...]}``, one result per argv: what each surface shows.

Everything shown is computed by SGLang's own code from the imported copy:

* the ``ServerArgs`` record comes from the real ``prepare_server_args(argv)`` (``--config``
  merge, parse, record; resolution needs the model and the GPU stack, so it is not run);
* the startup log lines are the f-strings of the ``logger.info(f"server_args=...")`` calls in
  ``srt/entrypoints/engine.py`` together with its ``_server_args_for_logging``: engine.py cannot
  be imported without the GPU stack (uvloop, zmq servers, ...), so both are taken from its
  source with ``ast`` and evaluated as written, against the copy's own helpers;
* ``/server_info`` and ``/get_server_info`` are the handler functions of
  ``srt/entrypoints/http_server.py``, taken the same way and awaited with a stand-in for the
  process state (``_global_state``: the tokenizer manager's ``server_args``, a scheduler info,
  and one DP rank's internal state, which the scheduler starts from
  ``get_context().resolved_server_args_dict()``, i.e. ``server_args.resolved_dict()`` plus the
  control plane's overrides, none here).

Keep this stdlib-only apart from SGLang itself.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import sys
import typing
from pathlib import Path


def _source_tree(module_file: str) -> ast.Module:
    return ast.parse(Path(module_file).read_text(), filename=module_file)


def _function(tree: ast.Module, name: str, namespace: dict, filename: str):
    """Compile the module-level function `name` from `tree` (decorators dropped) in `namespace`."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            node = ast.fix_missing_locations(
                type(node)(**{**{f: getattr(node, f) for f in node._fields}, "decorator_list": []}))
            code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec")
            exec(code, namespace)
            return namespace[name]
    raise LookupError(f"{filename}: no function {name}")


def _server_args_log_calls(tree: ast.Module) -> list[ast.Call]:
    """Every ``logger.info(f"server_args=...")`` call, in source order."""
    calls = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "info" and node.args
                and isinstance(node.args[0], ast.JoinedStr)
                and isinstance(node.args[0].values[0], ast.Constant)
                and str(node.args[0].values[0].value).startswith("server_args=")):
            calls.append(node)
    return sorted(calls, key=lambda n: n.lineno)


class _TokenizerManager:
    def __init__(self, server_args, internal_state):
        self.server_args = server_args
        self.startup_time = 12.5
        self._internal_state = internal_state

    async def get_internal_state(self):
        return [self._internal_state]


class _GlobalState:
    def __init__(self, tokenizer_manager, scheduler_info):
        self.tokenizer_manager = tokenizer_manager
        self.scheduler_info = scheduler_info


def main() -> int:
    payload = json.loads(sys.stdin.read())
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever SGLang prints stays off the JSON channel

    import sglang
    from sglang.srt.sampling.watermarking import core as wm_core
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    from sglang.srt.utils import common
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins
    from sglang.version import __version__

    srt = Path(sglang.__file__).parent / "srt"
    engine_py = str(srt / "entrypoints" / "engine.py")
    engine_tree = _source_tree(engine_py)
    engine_ns = {"__name__": "sglang_mask_probe.engine", "ServerArgs": ServerArgs,
                 "redact_watermark_secrets": wm_core.redact_watermark_secrets,
                 "Dict": typing.Dict, "Any": typing.Any}
    _function(engine_tree, "_server_args_for_logging", engine_ns, engine_py)
    log_calls = _server_args_log_calls(engine_tree)
    http_py = str(srt / "entrypoints" / "http_server.py")
    http_tree = _source_tree(http_py)

    def probe(argv: list[str]) -> dict:
        server_args = prepare_server_args(list(argv))
        result = {
            "api_key": server_args.api_key,
            "admin_api_key": server_args.admin_api_key,
            "ssl_keyfile_password": server_args.ssl_keyfile_password,
            "repr": repr(server_args),
            "self_documenting": f"{server_args=}",
            "launch_command": server_args.launch_command,
        }
        # (a) the startup log lines, as engine.py writes them
        result["log_lines"] = [
            {"line": call.lineno, "source": ast.unparse(call.args[0]),
             "text": eval(compile(ast.Expression(body=call.args[0]), engine_py, "eval"),
                          engine_ns, {"server_args": server_args})}
            for call in log_calls]
        # (b) /server_info and /get_server_info, as http_server.py answers them
        internal_state = msgspec_to_builtins(server_args.resolved_dict())
        http_ns = {
            "__name__": "sglang_mask_probe.http_server",
            "_global_state": _GlobalState(_TokenizerManager(server_args, internal_state),
                                          {"status": "ready", "max_total_num_tokens": 1000,
                                           "max_req_input_len": 999}),
            "build_server_info": common.build_server_info,
            "redact_watermark_secrets": wm_core.redact_watermark_secrets,
            "msgspec_to_builtins": msgspec_to_builtins,
            "__version__": __version__,
            "logger": logging.getLogger("sglang_mask_probe"),
            "List": typing.List, "Dict": typing.Dict, "Any": typing.Any,
        }
        server_info = _function(http_tree, "server_info", http_ns, http_py)
        get_server_info = _function(http_tree, "get_server_info", http_ns, http_py)
        for name, handler in (("server_info", server_info), ("get_server_info", get_server_info)):
            answer = asyncio.run(handler())
            result[name] = answer
            result[f"{name}_json"] = json.dumps(answer, default=str)  # what the client gets
        return result

    result = {"sglang_file": sglang.__file__, "version": __version__,
              "results": [probe(argv) for argv in payload["argvs"]]}
    out.write(json.dumps(result, default=str))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
