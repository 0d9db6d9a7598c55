"""The launch check's captured parser (dsv4deploy/sglang/launch_parser.py) against SGLang 0.5.23's own, in
the CPU parser venv (tests/tools/sglang_parser.py): every shipped profile's rendered argv, and for
every flag of the 532 argparse actions SGLang defines, the flag bare and with a handful of values
(good and bad), must get the same verdict and the same message from both, or be handed to SGLang's
own parser (an opaque flag). One SGLang import for all of it (tests/tools/launch_parser_compare.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import sglang_parser  # noqa: E402

from checkout import list_profiles, load_profile  # noqa: E402
from dsv4deploy.render.argv import server_args  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "dsv4deploy" / "sglang" / "launch_parser.py"
COMPARE = REPO / "tests" / "tools" / "launch_parser_compare.py"
VERSION = "0.5.23"
VALUES = ["x", "1", "0", "-1", "1.5", "128k", "1.5Ki", "[1, 2]", '{"a": 1}', "None", ""]
BASE = ["--model-path", "/m"]


def compare(argvs: list[list[str]]) -> dict:
    python = sglang_parser.ensure(VERSION)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run([str(python), str(COMPARE)], input=json.dumps({"program": str(PROGRAM), "argvs": argvs}),
                          capture_output=True, text=True, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def shipped_argvs() -> dict[str, list[str]]:
    return {name: list(server_args(load_profile(name))) for name in list_profiles()
            if load_profile(name).data["sglang"]["version"] == VERSION}


@pytest.fixture(scope="module")
def table() -> dict:
    return compare([])["table"]


@pytest.fixture(scope="module")
def verdicts(table) -> list[tuple[list[str], dict]]:
    argvs = [*shipped_argvs().values()]
    for action in table["actions"]:
        for flag in action["flags"]:
            argvs.append([*BASE, flag])
            argvs += [[*BASE, flag, value] for value in VALUES]
            argvs += [[*BASE, f"{flag}={value}"] for value in VALUES[:3]]
            argvs += [[*BASE, flag, str(c)] for c in (action["choices"] or [])[:2]]
        argvs.append([*BASE, action["flags"][0][:-1]] if action["flags"] else BASE)   # a prefix of it
    argvs += [[], ["--bogus"], [*BASE, "positional"], ["--tp", "8", *BASE], ["--model", "/m"]]
    out = compare(argvs)
    return list(zip(argvs, out["results"]))


def test_every_shipped_argv_is_decided_by_the_table_as_sglang_decides_it(verdicts):
    shipped = shipped_argvs()
    assert shipped
    for argv, result in verdicts[:len(shipped)]:
        assert result["real"] == {"code": 0, "message": ""}, (argv, result)
        assert result["rebuilt"] == result["real"], (argv, result)     # no SGLang import for these


def test_every_flag_gets_sglangs_verdict_or_goes_to_sglangs_parser(table, verdicts):
    opaque = {f for a in table["actions"] if a["kind"] == "opaque" or a["type"] == "opaque" for f in a["flags"]}
    handed, refused = 0, 0
    for argv, result in verdicts:
        if result["rebuilt"] == "sglang":
            assert any(w.split("=")[0] in opaque or any(f.startswith(w.split("=")[0]) for f in opaque)
                       for w in argv if w.startswith("-")), argv
            handed += 1
            continue
        assert result["rebuilt"] == result["real"], argv
        refused += result["real"]["code"] != 0
    print(f"{len(verdicts)} argvs: {refused} refused, {handed} handed to SGLang's own parser, "
          f"{len(opaque)} opaque option strings of {sum(len(a['flags']) for a in table['actions'])}")
    assert refused > len(verdicts) / 3 and handed < len(verdicts) / 20


def test_sglangs_own_type_for_sizes_is_captured_from_its_source(table):
    """--context-length takes 128k (human_readable_int): that flag must not need SGLang's import."""
    (ctx,) = [a for a in table["actions"] if "--context-length" in a["flags"]]
    assert ctx["type"] == "function" and ctx["function"]["name"] == "human_readable_int"
    assert set(ctx["function"]["globals"]) <= {"re", "argparse", "Decimal"}
