"""The launch check's parser table (dsv4deploy/sglang/launch_parser.py) on a parser made here, no SGLang:
captured once by the check that imports the real parser, then used for the next argv (same
verdict, same message), not used when the venv's key changed or the file is damaged, and handing
any argv that touches a flag it cannot rebuild to the real parser. Against SGLang's own parser:
tests/test_launch_parser_sglang.py."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat

import pytest
import yaml

from dsv4deploy.sglang import launch_parser as lp


def size(value: str) -> int:
    """A type function of the server's own that needs only the standard library (like SGLang's
    human_readable_int): captured from its source."""
    m = re.fullmatch(r"(\d+)k", value)
    if m:
        return int(m.group(1)) * 1000
    return int(value)


def yaml_value(value: str):
    """A type function that needs a third-party module: opaque."""
    return yaml.safe_load(value)


class Shout(argparse.Action):
    """A custom action: opaque (only its arity is captured)."""

    def __call__(self, parser, namespace, values, option_string=None):
        assert values == values.upper(), "must shout"
        setattr(namespace, self.dest, values)


def server_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=lp.PROG)
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--attention-backend", choices=["fa3", "flashinfer", "triton"])
    p.add_argument("--context-length", type=size)
    p.add_argument("--json-args", type=json.loads)
    p.add_argument("--yaml-args", type=yaml_value)
    p.add_argument("--shout", action=Shout)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction)
    p.add_argument("--cuda-graph-bs", type=int, nargs="+")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--log-requests", action="store_true")
    g.add_argument("--no-log", dest="log_requests", action="store_false")
    p.print_usage = lambda file=None: None
    return p


ARGVS = [
    ["--model-path", "/m", "--tp-size", "4", "--context-length", "128k", "--cuda-graph-bs", "1", "2", "4"],
    ["--model", "/m", "--tp", "4"],                               # a prefix
    ["--model-path=/m", "--mem-fraction-static", "0.85", "--no-cuda-graph", "--enable-metrics"],
    ["--model-path", "/m", "--json-args", '{"a": 1}'],
    ["--model-path", "/m", "--attention-backend", "bogus"],
    ["--model-path", "/m", "--tp-size", "four"],
    ["--model-path", "/m", "--context-length", "12x"],
    ["--model-path", "/m", "--json-args", "{"],
    ["--model-path", "/m", "--cuda-graph-bs"],
    ["--model-path", "/m", "--log-requests", "--no-log"],
    ["--tp-size", "4"],                                           # required missing
    ["--model-path", "/m", "--bogus", "1"],
    ["--model-path", "/m", "--m", "x"],                           # ambiguous prefix
]


def real_verdict(argv, capsys) -> tuple[int, str]:
    try:
        server_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code, capsys.readouterr().err
    return 0, ""


@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: " ".join(a)[:40])
def test_the_rebuilt_parser_gives_the_real_verdict_and_message(argv, capsys):
    table = json.loads(json.dumps(lp.capture(server_parser(), "k")))      # through its JSON, as on the host
    parser, opaque = lp.rebuild(table)
    want = real_verdict(argv, capsys)
    assert lp.decide(parser, opaque, argv) == want
    if want[0]:
        assert want[1].startswith("sglang serve: error: ") and "usage" not in want[1]


def test_what_cannot_be_rebuilt_is_opaque_and_hands_the_argv_on():
    table = lp.capture(server_parser(), "k")
    kinds = {a["flags"][0]: (a["kind"], a["type"]) for a in table["actions"]}
    assert kinds["--context-length"] == ("store", "function") and kinds["--json-args"] == ("store", "json")
    assert kinds["--yaml-args"][1] == "opaque" and kinds["--shout"][0] == "opaque" and kinds["-h"][0] == "opaque"
    parser, opaque = lp.rebuild(table)
    for argv in (["--model-path", "/m", "--shout", "quiet"],       # Shout would refuse: only it can say
                 ["--model-path", "/m", "--yaml-args", "[1]"],
                 ["--model-path", "/m", "-h", "stray"],           # --help exits 0 before 'stray'
                 ["--model-path", "/m", "--sh", "x"]):             # a prefix of an opaque flag
        code, why = lp.decide(parser, opaque, argv)
        assert code is None and "not captured as plain argparse" in why, argv


def test_a_function_that_reads_more_than_the_standard_library_is_not_captured():
    assert lp.capture_function(size)["globals"] == {"re": ["re", None]}
    assert lp.capture_function(yaml_value) is None
    assert lp.capture_function(lambda v: v) is None
    doc = lp.capture_function(size)
    assert lp.compile_function(doc)("3k") == 3000
    with pytest.raises(ValueError):
        lp.compile_function({**doc, "source": doc["source"].replace("1000", "1024")})   # not its sha256
    with pytest.raises(ValueError):
        lp.compile_function({**doc, "globals": {"re": ["yaml", None]}})


@pytest.fixture
def host(monkeypatch, tmp_path):
    """The check as the host runs it, the real parser being server_parser (counted)."""
    imports = []

    def imported():
        imports.append(1)
        return server_parser()

    monkeypatch.setattr(lp, "sglang_parser", imported)
    return tmp_path / "venv" / "dsv4deploy.parser.json", imports


def run_check(table, key, argv, capsys) -> tuple[int, str, str]:
    try:
        code = lp.check(str(table), key, argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_first_check_imports_and_captures_the_next_ones_use_the_table(host, capsys):
    table, imports = host
    table.parent.mkdir()
    good, bad = ARGVS[0], ARGVS[4]
    code, out, _ = run_check(table, "k1", good, capsys)
    assert (code, out.strip(), len(imports)) == (0, "parsed by SGLang's own parser (imported)", 1)
    assert stat.S_IMODE(os.stat(table).st_mode) == 0o644 and json.loads(table.read_text())["key"] == "k1"
    code, out, _ = run_check(table, "k1", ARGVS[2], capsys)
    assert (code, len(imports)) == (0, 1) and "as captured in" in out
    code, _, err = run_check(table, "k1", bad, capsys)
    assert (code, len(imports)) == (2, 1)
    assert err.strip() == "sglang serve: error: argument --attention-backend: invalid choice: 'bogus' " \
                          "(choose from 'fa3', 'flashinfer', 'triton')"
    code, out, _ = run_check(table, "k1", ["--model-path", "/m", "--shout", "LOUD"], capsys)
    assert (code, len(imports)) == (0, 2) and "--shout: not captured as plain argparse" in out


def test_a_table_of_another_key_or_a_damaged_one_is_not_used(host, capsys):
    table, imports = host
    table.parent.mkdir()
    run_check(table, "k1", ARGVS[0], capsys)
    run_check(table, "k2", ARGVS[0], capsys)                      # the venv changed: captured again
    assert len(imports) == 2 and json.loads(table.read_text())["key"] == "k2"
    table.write_text("{not json")
    code, _, _ = run_check(table, "k2", ARGVS[0], capsys)
    assert code == 0 and len(imports) == 3 and json.loads(table.read_text())["key"] == "k2"
    doc = json.loads(table.read_text())
    doc["actions"][1]["nargs"] = "bogus"                         # rebuilds to something else: not used
    table.write_text(json.dumps(doc))
    assert run_check(table, "k2", ARGVS[0], capsys)[0] == 0 and len(imports) == 4


def test_a_table_that_cannot_be_written_leaves_the_check_standing(host, capsys):
    table, imports = host                                        # its folder does not exist
    code, out, err = run_check(table, "k1", ARGVS[4], capsys)
    assert code == 2 and "the parser table was not written" in err and "invalid choice: 'bogus'" in err
