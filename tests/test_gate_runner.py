"""run_gate plumbing without a server: runner choice, the built-in command (no key in it),
a client that crashes or prints garbage, an SSH call that times out."""

import json

import pytest

from dsv4deploy.gate.result import FAILED, GateResult, LevelResult
from dsv4deploy.gate.runner import (CLIENT_PATH, builtin_command, choose_runner, parse_client_output,
                                    run_gate)
from dsv4deploy.gate.spec import GateSpec, LevelSpec

SPEC = GateSpec(levels=(LevelSpec(1, 8, min_output_throughput=10), LevelSpec(64, 128, min_output_throughput=400)),
                budget_s=600)


def test_choose_runner():
    assert choose_runner("builtin", None, "/x")[0] == "builtin"
    assert choose_runner("auto", lambda c, t: (0, "", ""), "/v/bin/python")[0] == "bench_serving"
    assert choose_runner("auto", lambda c, t: (1, "", ""), "/v/bin/python")[0] == "builtin"

    def boom(c, t):
        raise TimeoutError("ssh timed out")
    r, why = choose_runner("auto", boom, "/v/bin/python")
    assert r == "builtin" and "ssh timed out" in why


def test_builtin_command_sources_the_key_on_the_host():
    cmd = builtin_command(SPEC, remote_client_path="/tmp/c.py", base_url="http://127.0.0.1:30000", budget_s=590)
    assert cmd.startswith("set -a; [ -r /etc/dsv4deploy/secrets.env ] && . /etc/dsv4deploy/secrets.env; set +a; "
                          "python3 /tmp/c.py --base-url http://127.0.0.1:30000 --levels ")
    assert "--api-key-env SGLANG_API_KEY" in cmd and "--budget-s 590.000" in cmd and "--fail-fast" in cmd
    levels = json.loads(cmd.split("--levels ")[1].split(" --api-key-env")[0].strip("'"))
    assert [lv["concurrency"] for lv in levels] == [64, 1]           # highest concurrency first


def test_client_is_stdlib_only():
    src = CLIENT_PATH.read_text()
    assert "dsv4deploy" not in src.split('"""', 2)[2].split("SCHEMA")[0]   # no package imports
    imports = {line.split()[1].split(".")[0] for line in src.splitlines()
               if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
    assert imports <= {"argparse", "asyncio", "collections", "json", "math", "os", "random", "resource",
                       "signal", "ssl", "sys", "time", "urllib"}, imports


def test_client_garbage_or_crash_is_a_failed_gate():
    res = parse_client_output(1, "", "Traceback ...\nSyntaxError: invalid syntax", SPEC)
    assert res.error.startswith("client wrote no JSON result; exit 1; stderr:") and "SyntaxError" in res.error
    assert all(lv.status == FAILED for lv in res.levels)
    res = parse_client_output(0, '{"schema": "other"}', "", SPEC)
    assert "not a gate result" in res.error
    good = GateResult("builtin", [LevelResult(64, 128, output_throughput=500.0, completed=128),
                                  LevelResult(1, 8, output_throughput=20.0, completed=8)])
    res = parse_client_output(0, "progress noise\n" + good.to_json(indent=None), "", SPEC)
    assert res.error is None and res.level(64).output_throughput == 500.0


def test_run_gate_ssh_timeout_is_a_failure(tmp_path):
    calls = []

    def execute(cmd, timeout_s):
        calls.append(timeout_s)
        raise TimeoutError(f"command timed out after {timeout_s} s")

    out = run_gate(SPEC, execute, base_url="http://127.0.0.1:30000", model_path="/m", venv_python="/v",
                   runner="builtin", upload=lambda a, b: None)
    assert not out.passed
    assert out.verdict.failures[0].startswith("gate runner (builtin) failed: client wrote no JSON result; exit None")
    assert 600 < calls[0] <= 600 + 30                                  # just above the budget
    with pytest.raises(ValueError):
        run_gate(SPEC, execute, base_url="http://x:1", model_path="/m", venv_python="/v", runner="builtin")
