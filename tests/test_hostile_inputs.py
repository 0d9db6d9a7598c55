"""Hostile input (issue 9): every way a profile, a profile name or an --out target can be
wrong ends in exit 2 with a message naming file, line and key, no traceback, nothing written,
in under 2 s. Cases run the real CLI entry point in-process; a few go through a subprocess to
prove the exit code, a clean stderr and the 200 MB memory bound."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4deploy.cli.main import main
from dsv4deploy.sglang.patches import MASK_SECRETS_PATCH

BASE = "extends: nvfp4-ctx8k\n"
# the shipped profiles carry an API key, which needs the mask patch next to any other patch
MASK_ENTRY = "    - {{name: {name}, file: {file}, sha256: {sha256}}}\n".format(**MASK_SECRETS_PATCH).replace("{", "{{").replace("}", "}}")
SHA = "a" * 64


def q(value: str) -> str:
    """A YAML double-quoted scalar (JSON's escapes are YAML's: \\n, \\u2028, \\u0000, ...)."""
    return json.dumps(value)


def write(profile_dir, text: str | bytes, name: str = "case") -> Path:
    path = profile_dir.path / f"{name}.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


def refused(capsys, tmp_path, args: list[str], file: str | None, key: str | None, contains: str = "",
            line: bool = True) -> str:
    """Run the CLI; assert exit 2, a `file:line: key: message` line, no traceback, nothing
    written under tmp_path/out, and an answer in under 2 s of CPU (the time the tool spends; wall
    time on make test's shared 2 cores also counts the other pytest processes). Returns the output."""
    out = tmp_path / "out"
    if args[0] == "render" and "--out" not in args:
        args = args + ["--out", str(out)]
    started = time.process_time()
    rc = main(args)
    elapsed = time.process_time() - started
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert rc == 2, text
    assert "Traceback" not in text
    assert elapsed < 2.0, f"{elapsed:.2f} CPU s"
    assert not out.exists(), "nothing may be written for bad input"
    where = re.escape(file) + (r":\d+: " if line else r"(:\d+)?: ") if file else r"\S+:\d+: "
    pattern = r"(^|/)" + where + (r"(warning: )?" + re.escape(key) if key else "")
    assert re.search(pattern, text, re.M), f"no {pattern!r} in:\n{text}"
    assert contains in text, f"{contains!r} not in:\n{text}"
    return text


# --- injection into every string that reaches a file, an argv word or a shell ---------------------

# field: (YAML after BASE with {} for the value, a valid sample, key path as printed, strict)
# strict fields refuse quotes, backslashes, $, %, ; and spaces too; free-text fields take them
# (the round-trip test proves those reach the unit exactly) and refuse only what is unprintable.
FIELDS = {
    "model.repo": ("model:\n  repo: {}\n", "nvidia/DeepSeek-V4-Flash-NVFP4", "model.repo", True),
    "served_model_name": ("model:\n  served_model_name: {}\n", "dsv4", "model.served_model_name", True),
    "source.path": ("model:\n  source:\n    type: local\n    path: {}\n", "/srv/ckpt", "model.source.path", False),
    "sglang.version": ("sglang:\n  version: {}\n", "0.5.23", "sglang.version", True),
    "sglang.extras": ("sglang:\n  extras: [{}]\n", "blackwell", "sglang.extras[0]", True),
    "sglang.index_url": ("sglang:\n  index_url: {}\n", "https://pypi.org/simple", "sglang.index_url", True),
    "sglang.indexes.url": ("sglang:\n  indexes:\n    - {{name: pt, url: {}, packages: [torch]}}\n",
                           "https://x.invalid/simple", "sglang.indexes[0].url", True),
    "sglang.indexes.name": ("sglang:\n  indexes:\n    - {{name: {}, url: 'https://x.invalid/simple', packages: [torch]}}\n",
                            "pytorch", "sglang.indexes[0].name", True),
    "sglang.indexes.packages": ("sglang:\n  indexes:\n    - {{name: pt, url: 'https://x.invalid/simple', packages: [{}]}}\n",
                                "torch", "sglang.indexes[0].packages[0]", True),
    "patch.name": ("sglang:\n  patches:\n    - {{name: {}, url: 'https://x.invalid/p.diff', sha256: " + SHA + "}}\n" + MASK_ENTRY,
                   "p1", "sglang.patches[0].name", True),
    "patch.url": ("sglang:\n  patches:\n    - {{name: p1, url: {}, sha256: " + SHA + "}}\n" + MASK_ENTRY,
                  "https://x.invalid/p.diff", "sglang.patches[0].url", True),
    "patch.file": ("sglang:\n  patches:\n    - {{name: p1, file: {}, sha256: " + SHA + "}}\n" + MASK_ENTRY,
                   "patches/p1.diff", "sglang.patches[0].file", True),
    "server.host": ("server:\n  host: {}\nservice:\n  allow_clients: [10.0.0.0/8]\n", "0.0.0.0", "server.host", True),
    "allow_clients": ("service:\n  allow_clients: [{}]\n", "10.0.0.0/8", "service.allow_clients[0]", True),
    "allow_egress": ("service:\n  allow_egress: [{}]\n", "fd00::/8", "service.allow_egress[0]", True),
    "extra_args": ("server:\n  extra_args: [--chat-template, {}]\n", "tpl", "server.extra_args[1]", False),
    "env.value": ("server:\n  env:\n    SGLANG_X: {}\n", "1", "server.env.SGLANG_X", False),
    "env.key": ("server:\n  env:\n    {}: '1'\n", "SGLANG_X", "server.env", True),
    "nccl.value": ("nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_DEBUG: {}\n", "INFO",
                   "nccl.overrides.NCCL_DEBUG", True),
    "nccl.key": ("nccl:\n  preset: ll-ring\n  overrides:\n    {}: '1'\n", "NCCL_X", "nccl.overrides", True),
    "driver.cuda_toolkit": ("driver:\n  cuda_toolkit: {}\n", "cuda-toolkit-13-0", "driver.cuda_toolkit", True),
    "service.name": ("service:\n  name: {}\n", "sglang-x", "service.name", True),
    "service.user": ("service:\n  user: {}\n", "sglang-x", "service.user", True),
    "description": ("description: {}\n", "a profile", "description", False),
    "calibration.measured": ("calibration:\n  measured: {}\n", "ct200 2026-05-01", "calibration.measured", False),
    "hardening_off_reason": ("service:\n  hardening: 'off'\n  hardening_off_reason: {}\n", "no seccomp on this kernel",
                             "service.hardening_off_reason", False),
    "gateway.host": ("replicas:\n  count: 2\n  gateway:\n    host: {}\n", "127.0.0.1", "replicas.gateway.host", True),
    "gateway.version": ("replicas:\n  count: 2\n  gateway:\n    version: {}\n", "1.13.0", "replicas.gateway.version",
                        True),
}
UNPRINTABLE = {"lf": "\n", "cr": "\r", "nel": "\x85", "ls": "\u2028", "ps": "\u2029", "nul": "\x00",
               "tab": "\t", "esc": "\x1b", "del": "\x7f", "rlo": "\u202e"}
SHELLISH = {"dq": '"', "sq": "'", "bs": "\\", "dollar": "$", "pct": "%", "semi": ";", "space": " "}
URL_FIELDS = {"sglang.index_url", "sglang.indexes.url", "patch.url"}


def _injections():
    for field, (_, _, _, strict) in FIELDS.items():
        for name, char in UNPRINTABLE.items():
            yield pytest.param(field, char, id=f"{field}-{name}")
        if strict:
            for name, char in SHELLISH.items():
                if not (field in URL_FIELDS and char == "%") and not (field == "nccl.value" and char == "%"):
                    yield pytest.param(field, char, id=f"{field}-{name}")
    yield pytest.param("extends", "\n", id="extends-lf")
    yield pytest.param("extends", "/../x", id="extends-dotdot")
    yield pytest.param("extends", "$x", id="extends-dollar")


INJECTIONS = list(_injections())


@pytest.mark.parametrize("field,char", INJECTIONS)
def test_injection_is_refused(profile_dir, tmp_path, capsys, field, char):
    if field == "extends":
        write(profile_dir, f"extends: {q('nvfp4-ctx8k' + char)}\n")
        refused(capsys, tmp_path, ["render", "case"], "case.yaml", "extends", "invalid profile name")
        return
    template, sample, key, _ = FIELDS[field]
    write(profile_dir, BASE + template.format(q(sample + char)))
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", key)


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_the_samples_themselves_render(profile_dir, tmp_path, capsys, field):
    """Each injection above differs from an accepted value only by the injected character."""
    template, sample, _, _ = FIELDS[field]
    write(profile_dir, BASE + template.format(q(sample)))
    assert main(["render", "case", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err


def test_a_trailing_newline_in_extra_args_cannot_add_a_directive(profile_dir, tmp_path, capsys):
    """The issue's reproduction: ExecStartPre=+... (run as root) through a value ending in \\n."""
    write(profile_dir, BASE + 'server:\n  extra_args: ["--lora-paths", "x\\n", "ExecStartPre=+/bin/touch", "/tmp/p"]\n')
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", "server.extra_args[1]", "newline")


# --- YAML level ------------------------------------------------------------------------------------

BOMB = "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9 if i else ["x"] * 9) + "]\n" for i in range(10))
YAML_CASES = {
    "alias-bomb": (BOMB, None, "alias bomb"),
    "self-alias-map": (BASE + "server: &s\n  env: *s\n", "server.env", "self-referencing alias"),
    "self-alias-seq": (BASE + "server:\n  extra_args: &x [--a, *x]\n", "server.extra_args[1]", "self-referencing"),
    "deep-flow": ("x: " + "[" * 100_000, None, "nested deeper than 50"),
    "deep-block": ("".join(" " * i + f"k{i}:\n" for i in range(80)), None, "nested deeper than 50"),
    "deep-via-aliases": ("a: &a " + "[" * 40 + "1" + "]" * 40 + "\nb: &b " + "[" * 30 + "*a" + "]" * 30 + "\n",
                         None, "deeper than 50"),
    "too-many-values": (BASE + "server:\n  extra_args: [" + "1, " * 12_000 + "1]\n", None, "10,000 values"),
    "huge-file": (BASE + "#" + "x" * (300 * 1024) + "\n", None, "larger than 256 KiB"),
    "huge-string": (BASE + "description: " + "x" * (200 * 1024) + "\n", "description", "too long"),
    "huge-argv-word": (BASE + "server:\n  extra_args: [--chat-template, " + "x" * (100 * 1024) + "]\n",
                       "server.extra_args[1]", "too long"),
    "many-aliased-strings": ("s: &s " + "x" * 120_000 + "\nd: [" + ", ".join(["*s"] * 20) + "]\n", None,
                             "characters of text"),
    "nul-byte": (BASE + "description: a\x00b\n", None, "U+0000"),
    "escape-byte": (BASE + "description: a\x1bb\n", None, "U+001B"),
    "raw-nel": (BASE + "description: a\x85b\n", None, "malformed YAML"),
    "raw-line-separator": (BASE + "description: a\u2028b\n", None, "malformed YAML"),
    "raw-cr-directive": (BASE + "description: a\rExecStartPre=/bin/sh\n", None, "malformed YAML"),
    "raw-paragraph-separator": (BASE + "description: 'a\u2029b'\n", "description", "U+2029"),
    "raw-bidi-override": (BASE + "description: a\u202eb\n", "description", "U+202E"),
    "block-scalar": (BASE + "model:\n  served_model_name: |\n    abc\n", "model.served_model_name", "newline"),
    "folded-scalar": (BASE + "description: >\n  a\n\n  b\n", "description", "newline"),
    "two-documents": (BASE + "---\nserver: {}\n", None, "malformed YAML"),
    "merge-key": (BASE + "server:\n  <<: {tp_size: 8}\n", None, "merge keys"),
    "python-tag": (BASE + "description: !!python/object/apply:os.system [ls]\n", "description", "not supported"),
    "set-tag": (BASE + "server:\n  env: !!set {A, B}\n", "server.env", "not supported"),
    "binary-tag": (BASE + "server:\n  env:\n    SGLANG_X: !!binary aGk=\n", "server.env.SGLANG_X", "expected"),
    "undefined-alias": (BASE + "description: *nope\n", None, "undefined alias"),
    "duplicate-key": (BASE + "server:\n  tp_size: 4\n  tp_size: 8\n", "server.tp_size", "duplicate key"),
    "complex-key": (BASE + "? [a, b]\n: 1\n", None, "plain strings"),
    "int-5000-digits": (BASE + "server:\n  tp_size: " + "9" * 5000 + "\n", "server.tp_size", "cannot read"),
    "top-level-list": ("- a\n- b\n", None, "mapping of profile keys"),
    "empty": ("", None, "empty file"),
    "timestamp": (BASE + "description: 2026-05-01\n", "description", "expected a string"),
    "missing-required": ("description: nothing else\n", "model.repo", "missing required key"),
}


@pytest.mark.parametrize("case", sorted(YAML_CASES))
def test_yaml_level(profile_dir, tmp_path, capsys, case):
    text, key, contains = YAML_CASES[case]
    write(profile_dir, text)
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", key, contains)


BYTES_CASES = {
    "latin-1": (BASE.encode() + b"description: caf\xe9\n", 2),
    "overlong-utf8": (BASE.encode() + b"server:\n  env:\n    SGLANG_X: \xc0\xaf\n", 4),
    "utf-16": ("description: x\n".encode("utf-16"), 1),
    "lone-continuation": (b"description: ok\n" * 3 + b"x: \x80\n", 4),
}


@pytest.mark.parametrize("case", sorted(BYTES_CASES))
def test_not_utf8_names_the_line(profile_dir, tmp_path, capsys, case):
    data, line = BYTES_CASES[case]
    write(profile_dir, data)
    refused(capsys, tmp_path, ["validate", "case"], f"case.yaml:{line}", None, "not UTF-8", line=False)


# --- types and ranges --------------------------------------------------------------------------------

VALUE_CASES = {
    # types: integers are integers (4.0 and true are not), numbers are numbers
    "tp-size-float": ("server:\n  tp_size: 4.0\n", "server.tp_size", "write 4"),
    "tp-size-bool": ("server:\n  tp_size: true\n", "server.tp_size", "expected an integer"),
    "tp-size-string": ("server:\n  tp_size: '4'\n", "server.tp_size", "expected an integer"),
    "port-float": ("server:\n  port: 30000.5\n", "server.port", "expected an integer"),
    "context-float": ("server:\n  context_length: 8192.0\n", "server.context_length", "write 8192"),
    "timeout-float": ("service:\n  timeout_start_s: 1800.0\n", "service.timeout_start_s", "write 1800"),
    "budget-float": ("gate:\n  budget_s: 1800.0\n", "gate.budget_s", "expected an integer"),
    "fraction-string": ("server:\n  mem_fraction_static: '0.7'\n", "server.mem_fraction_static", "expected a number"),
    "nccl-float": ("nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_MIN_NCHANNELS: 4.0\n",
                   "nccl.overrides.NCCL_MIN_NCHANNELS", "write 4"),
    "nccl-bool": ("nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_P2P_DISABLE: true\n",
                  "nccl.overrides.NCCL_P2P_DISABLE", "expected a string or an integer"),
    "nccl-empty": ("nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_DEBUG: ''\n", "nccl.overrides.NCCL_DEBUG",
                   "empty"),
    "nccl-int-huge": ("nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_BUFFSIZE: " + "9" * 30 + "\n",
                      "nccl.overrides.NCCL_BUFFSIZE", "too large"),
    "env-float": ("server:\n  env:\n    SGLANG_X: 1.5\n", "server.env.SGLANG_X", "expected"),
    # a float has no one rendering (1.0 is not "1"): refused, never normalized (issue 37)
    "env-float-one": ("server:\n  env:\n    SGLANG_X: 1.0\n", "server.env.SGLANG_X", "write 1"),
    "nccl-p2p-float-one": ("nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_P2P_DISABLE: 1.0\n",
                           "nccl.overrides.NCCL_P2P_DISABLE", "write 1"),
    "hardening-bare-off": ("service:\n  hardening: off\n", "service.hardening", "quote it"),
    "env-list": ("server:\n  env:\n    SGLANG_X: [a]\n", "server.env.SGLANG_X", "expected"),
    "extra-args-string": ("server:\n  extra_args: --enable-metrics\n", "server.extra_args", "expected a list"),
    "extra-args-int": ("server:\n  extra_args: [--watchdog-timeout, 600]\n", "server.extra_args[1]", "string"),
    "levels-mapping": ("gate:\n  levels: {a: 1}\n", "gate.levels", "expected a list"),
    "bool-as-string": ("server:\n  disable_custom_all_reduce: 'yes'\n", "server.disable_custom_all_reduce",
                       "true or false"),
    # finite numbers everywhere, calibration included (memory.py must never see NaN)
    "kv-nan": ("calibration:\n  kv_bytes_per_token: .nan\n", "calibration.kv_bytes_per_token", "finite"),
    "kv-inf": ("calibration:\n  kv_bytes_per_token: .inf\n", "calibration.kv_bytes_per_token", "finite"),
    "kv-minus-inf": ("calibration:\n  kv_bytes_per_token: -.inf\n", "calibration.kv_bytes_per_token", "finite"),
    "kv-tiny": ("calibration:\n  kv_bytes_per_token: 1.0e-300\n", "calibration.kv_bytes_per_token", ">= 1"),
    "kv-zero": ("calibration:\n  kv_bytes_per_token: 0\n", "calibration.kv_bytes_per_token", ">= 1"),
    "kv-huge": ("calibration:\n  kv_bytes_per_token: 1.0e+30\n", "calibration.kv_bytes_per_token", "too large"),
    "kv-above-max": ("calibration:\n  kv_bytes_per_token: 1.0e+9\n", "calibration.kv_bytes_per_token", "<="),
    "kv-request-nan": ("calibration:\n  kv_bytes_per_request: .nan\n", "calibration.kv_bytes_per_request", "finite"),
    "weights-tiny": ("calibration:\n  weights_gib_per_gpu: 1.0e-300\n", "calibration.weights_gib_per_gpu", ">="),
    "weights-nan": ("calibration:\n  weights_gib_per_gpu: .nan\n", "calibration.weights_gib_per_gpu", "finite"),
    "graph-inf": ("calibration:\n  graph_reserve_mib: .inf\n", "calibration.graph_reserve_mib", "finite"),
    "graph-negative": ("calibration:\n  graph_reserve_mib: -1\n", "calibration.graph_reserve_mib", ">="),
    "fraction-nan": ("server:\n  mem_fraction_static: .nan\n", "server.mem_fraction_static", "finite"),
    "fraction-zero": ("server:\n  mem_fraction_static: 0\n", "server.mem_fraction_static", "> 0"),
    "fraction-above-1": ("server:\n  mem_fraction_static: 1.5\n", "server.mem_fraction_static", "<= 0.99"),
    "tp-zero": ("server:\n  tp_size: 0\n", "server.tp_size", ">= 1"),
    "tp-huge": ("server:\n  tp_size: 100000000000000000000\n", "server.tp_size", "too large"),
    "port-high": ("server:\n  port: 70000\n", "server.port", "<= 65535"),
    "failed-requests-huge": ("gate:\n  max_failed_requests: 1000000000\n", "gate.max_failed_requests", "<="),
    # gate floors and ceilings: finite and positive
    "floor-nan": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, min_output_throughput: .nan}\n",
                  "gate.levels[0].min_output_throughput", "finite"),
    "floor-inf": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, min_output_throughput: .inf}\n",
                  "gate.levels[0].min_output_throughput", "finite"),
    "floor-zero": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, min_output_throughput: 0}\n",
                   "gate.levels[0].min_output_throughput", "> 0"),
    "floor-negative": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, min_output_throughput: -5}\n",
                       "gate.levels[0].min_output_throughput", "> 0"),
    "ttft-nan": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, max_p99_ttft_ms: .nan}\n",
                 "gate.levels[0].max_p99_ttft_ms", "finite"),
    "ttft-zero": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, max_p99_ttft_ms: 0}\n",
                  "gate.levels[0].max_p99_ttft_ms", "> 0"),
    "tpot-inf": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, max_p99_tpot_ms: .inf}\n",
                 "gate.levels[0].max_p99_tpot_ms", "finite"),
    "tpot-minus-inf": ("gate:\n  levels:\n    - {concurrency: 1, num_prompts: 8, max_p99_tpot_ms: -.inf}\n",
                       "gate.levels[0].max_p99_tpot_ms", "finite"),
    "description-long": ("description: " + "x" * 2000 + "\n", "description", "too long"),
    "env-value-long": ("server:\n  env:\n    SGLANG_X: " + "x" * 20000 + "\n", "server.env.SGLANG_X", "too long"),
    "service-name-long": ("service:\n  name: " + "s" * 100 + "\n", "service.name", "too long"),
}


@pytest.mark.parametrize("case", sorted(VALUE_CASES))
def test_types_and_ranges(profile_dir, tmp_path, capsys, case):
    text, key, contains = VALUE_CASES[case]
    write(profile_dir, BASE + text)
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", key, contains)


def test_a_nan_calibration_is_blamed_on_its_own_file_and_key(profile_dir, tmp_path, capsys):
    write(profile_dir, BASE + "calibration:\n  measured: ct200\n", name="calibrated")
    write(profile_dir, "extends: calibrated\ncalibration:\n  kv_bytes_per_token: .nan\n")
    text = refused(capsys, tmp_path, ["validate", "case"], "case.yaml", "calibration.kv_bytes_per_token", "finite")
    assert "calibrated.yaml" not in text and "defaults.yaml" not in text


# --- what the profile means: secrets, accounts, flags, driver, bases ----------------------------------

API = "server.api_key: true"
HF = "DSV4_HF_TOKEN_FILE=path or DSV4_HF_TOKEN"
SEMANTIC_CASES = {
    "env-hf-token": ("server:\n  env:\n    HF_TOKEN: x\n", "server.env.HF_TOKEN", HF),
    "env-hub-token": ("server:\n  env:\n    HUGGING_FACE_HUB_TOKEN: x\n", "server.env.HUGGING_FACE_HUB_TOKEN", HF),
    "env-api-key": ("server:\n  env:\n    OPENAI_API_KEY: x\n", "server.env.OPENAI_API_KEY", API),
    "env-some-token": ("server:\n  env:\n    WANDB_TOKEN: x\n", "server.env.WANDB_TOKEN", API),
    "env-secret": ("server:\n  env:\n    MY_SECRET_THING: x\n", "server.env.MY_SECRET_THING", HF),
    "env-password": ("server:\n  env:\n    DB_PASSWORD: x\n", "server.env.DB_PASSWORD", API),
    "flag-api-key": ("server:\n  extra_args: [--api-key, sk-x]\n", "server.extra_args[0]", API),
    "flag-api-key-eq": ("server:\n  extra_args: [--api-key=sk-x]\n", "server.extra_args[0]", API),
    "flag-admin-api-key": ("server:\n  extra_args: [--admin-api-key, x]\n", "server.extra_args[0]", API),
    "flag-keyfile-password": ("server:\n  extra_args: [--ssl-keyfile-password, x]\n", "server.extra_args[0]",
                              "secret"),
    "value-hf-token": ("description: hf_abcdefghijklmnopqrstuvwxyzABCDEF12\n", "description", HF),
    "value-sk-key": ("server:\n  extra_args: [--chat-template, sk-abcdefghijklmnopqrstuvwxyz]\n",
                     "server.extra_args[1]", API),
    "user-root": ("service:\n  user: root\n", "service.user", "dedicated unprivileged user"),
    "user-daemon": ("service:\n  user: daemon\n", "service.user", "dedicated unprivileged user"),
    "user-nobody": ("service:\n  user: nobody\n", "service.user", "dedicated unprivileged user"),
    "user-bin": ("service:\n  user: bin\n", "service.user", "dedicated unprivileged user"),
    "user-sys": ("service:\n  user: sys\n", "service.user", "dedicated unprivileged user"),
    "user-sshd": ("service:\n  user: sshd\n", "service.user", "dedicated unprivileged user"),
    "user-systemd": ("service:\n  user: systemd-network\n", "service.user", "dedicated unprivileged user"),
    "user-ubuntu": ("service:\n  user: ubuntu\n", "service.user", "dedicated unprivileged user"),
    "name-ssh": ("service:\n  name: ssh\n", "service.name", "collides"),
    "name-sshd": ("service:\n  name: sshd\n", "service.name", "collides"),
    "name-systemd": ("service:\n  name: systemd-journald\n", "service.name", "collides"),
    "name-dbus": ("service:\n  name: dbus\n", "service.name", "collides"),
    "name-cron": ("service:\n  name: cron\n", "service.name", "collides"),
    "name-getty": ("service:\n  name: getty\n", "service.name", "collides"),
    "name-networking": ("service:\n  name: networking\n", "service.name", "collides"),
    "name-releases": ("service:\n  name: releases\n", "service.name", "collides"),
    "name-hf-home": ("service:\n  name: hf-home\n", "service.name", "collides"),      # root's HF_HOME
    "name-secrets": ("service:\n  name: secrets\n", "service.name", "collides"),      # the secrets' folder
    "user-gate": ("service:\n  user: dsv4deploy-gate\n", "service.user", "the gate's own user"),
    "user-fetch": ("service:\n  user: dsv4deploy-fetch\n", "service.user", "owns the checkpoints"),
    "name-dot-service": ("service:\n  name: sglang.service\n", "service.name", "not valid here"),
    "args-single-dash-h": ("server:\n  extra_args: [-h]\n", "server.extra_args[0]", "single-dash"),
    "args-single-dash-x": ("server:\n  extra_args: [-x]\n", "server.extra_args[0]", "single-dash"),
    "args-double-dash": ("server:\n  extra_args: ['--']\n", "server.extra_args[0]", "ends the options"),
    "args-help": ("server:\n  extra_args: [--help]\n", "server.extra_args[0]", "prints the usage"),
    "args-positional": ("server:\n  extra_args: [oops]\n", "server.extra_args[0]", "positional"),
    "args-after-switch": ("server:\n  extra_args: [--enable-metrics-for-all-schedulers, oops]\n",
                          "server.extra_args[1]", "positional"),
    "args-switch-with-value": ("server:\n  extra_args: [--enable-metrics-for-all-schedulers=1]\n",
                               "server.extra_args[0]", "takes no value"),
    "args-missing-value": ("server:\n  extra_args: [--watchdog-timeout]\n", "server.extra_args[0]", "needs a value"),
    "args-value-is-a-flag": ("server:\n  extra_args: [--watchdog-timeout, --enable-metrics-for-all-schedulers]\n",
                             "server.extra_args[0]", "needs a value"),
    "args-too-many-values": ("server:\n  extra_args: [--watchdog-timeout, '1', '2']\n", "server.extra_args[2]",
                             "positional"),
    "args-unknown": ("server:\n  extra_args: [--turbo]\n", "server.extra_args[0]", "has no flag --turbo"),
    "args-abbreviation": ("server:\n  extra_args: [--watchdog-time, '1']\n", "server.extra_args[0]", "abbreviations"),
    "args-managed": ("server:\n  extra_args: [--port, '1']\n", "server.extra_args[0]", "managed by the profile"),
    "args-config": ("server:\n  extra_args: [--config, /tmp/x.yaml]\n", "server.extra_args[0]", "managed"),
    "env-managed-path": ("server:\n  env:\n    PATH: /tmp\n", "server.env.PATH", "set by the rendered unit"),
    "env-nccl": ("server:\n  env:\n    NCCL_DEBUG: INFO\n", "server.env.NCCL_DEBUG", "nccl.overrides"),
    # rules see values, not YAML spellings (issue 37): each spelling nccl.env holds as 1
    **{f"p2p-off-{name}": ("nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_P2P_DISABLE: " + spelling + "\n",
                           "nccl.overrides.NCCL_P2P_DISABLE", "needs server.disable_custom_all_reduce: true")
       for name, spelling in {"int": "1", "single-quoted": "'1'", "double-quoted": '"1"', "hex": "0x1",
                              "octal": "01", "string-octal": "'01'", "string-hex": "'0x1'",
                              "string-plus": "'+1'"}.items()},
    "p2p-off-nop2p-int": ("nccl:\n  preset: nop2p\n  overrides:\n    NCCL_P2P_DISABLE: 1\n",
                          "nccl.overrides.NCCL_P2P_DISABLE", "needs server.disable_custom_all_reduce: true"),
    "hardening-off-no-reason": ("service:\n  hardening: 'off'\n", "service.hardening", "hardening_off_reason"),
    "hardening-off-blank-reason": ("service:\n  hardening: 'off'\n  hardening_off_reason: '  '\n",
                                   "service.hardening", "hardening_off_reason"),
    "hardening-off-empty-reason": ("service:\n  hardening: 'off'\n  hardening_off_reason: ''\n",
                                   "service.hardening_off_reason", "empty"),
    "driver-570": ("driver:\n  branch: 570\n", "driver.branch", "CUDA 13"),
    "driver-535": ("driver:\n  branch: 535\n", "driver.branch", ">= 580"),
    "patch-file-dotdot": ("sglang:\n  patches:\n    - {name: p, file: ../../etc/shadow, sha256: " + SHA + "}\n",
                          "sglang.patches[0].file", "no '..'"),
    "patch-file-absolute": ("sglang:\n  patches:\n    - {name: p, file: /etc/shadow, sha256: " + SHA + "}\n",
                            "sglang.patches[0].file", "relative"),
    "source-path-option": ("model:\n  source:\n    type: local\n    path: --reflink=never\n", "model.source.path",
                           "not starting with '-'"),
    "host-option": ("server:\n  host: --x\n", "server.host", "not valid here"),
}


@pytest.mark.parametrize("case", sorted(SEMANTIC_CASES))
def test_semantic_refusals(profile_dir, tmp_path, capsys, case):
    text, key, contains = SEMANTIC_CASES[case]
    write(profile_dir, BASE + text)
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", key, contains)


@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_shared_base_is_not_deployable(profile_dir, tmp_path, capsys, command):
    refused(capsys, tmp_path, [command, "_ct200-base"], "_ct200-base.yaml", "profile", "is a shared base")


# --- the command line --------------------------------------------------------------------------------

NAMES = {
    "trailing-newline": "nvfp4-ctx8k\n",
    "newline-inside": "nvfp4\nctx8k",
    "dotdot": "../etc/passwd",
    "slash": "profiles/nvfp4-ctx8k",
    "too-long": "a" * 300,
    "empty": "",
    "space": "nvfp4-ctx8k ",
    "nul": "nvfp4\x00ctx8k",
    "dot-first": ".hidden",
    "line-separator": "nvfp4-ctx8k\u2028",
}


@pytest.mark.parametrize("case", sorted(NAMES))
@pytest.mark.parametrize("command", ["validate", "render"])
def test_profile_names_on_the_command_line(profile_dir, tmp_path, capsys, case, command):
    refused(capsys, tmp_path, [command, NAMES[case]], "<command line>", "profile", "profile name", line=False)


def test_an_extends_name_too_long_for_the_file_system(profile_dir, tmp_path, capsys):
    write(profile_dir, "extends: " + "a" * 300 + "\n")
    refused(capsys, tmp_path, ["validate", "case"], "case.yaml", "extends", "too long")


def _out_targets(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "file").write_text("keep me\n")
    (tmp_path / "tree/etc/systemd/system/sglang.service").mkdir(parents=True)
    (tmp_path / "linked/etc/systemd/system").mkdir(parents=True)
    (tmp_path / "linked/etc/systemd/system/sglang.service").symlink_to(tmp_path / "file")
    return {"existing-file": str(tmp_path / "file"), "below-a-file": str(tmp_path / "file/sub"),
            "proc": "/proc/self", "sys": "/sys/kernel", "dev": "/dev/null", "root": "/",
            "folder-in-the-way": str(tmp_path / "tree"), "symlink-in-the-way": str(tmp_path / "linked"),
            "newline": str(tmp_path / "a\nb")}


@pytest.mark.parametrize("case", ["existing-file", "below-a-file", "proc", "sys", "dev", "root",
                                  "folder-in-the-way", "symlink-in-the-way", "newline"])
def test_render_out_targets(tmp_path, capsys, case):
    target = _out_targets(tmp_path)[case]
    before = {p: (p.read_bytes() if p.is_file() and not p.is_symlink() else None) for p in tmp_path.rglob("*")}
    refused(capsys, tmp_path, ["render", "nvfp4-ctx8k", "--out", target], "<command line>", "--out", line=False)
    after = {p: (p.read_bytes() if p.is_file() and not p.is_symlink() else None) for p in tmp_path.rglob("*")}
    assert after == before, "nothing written, nothing changed"


def test_render_into_an_unwritable_folder(tmp_path, capsys, monkeypatch):
    import tempfile

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", denied)  # root may write anywhere: simulate the refusal
    refused(capsys, tmp_path, ["render", "nvfp4-ctx8k", "--out", str(tmp_path / "ro")], "<command line>", "--out",
            "Permission denied", line=False)
    assert not (tmp_path / "ro").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a 0555 folder")
def test_render_into_a_read_only_folder_for_real(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    refused(capsys, tmp_path, ["render", "nvfp4-ctx8k", "--out", str(ro / "x")], "<command line>", "--out",
            line=False)


# --- through a real process: exit code, clean stderr, memory ------------------------------------------

WRAPPER = ("import resource, runpy, sys\n"
           "sys.argv = ['dsv4deploy'] + sys.argv[1:]\n"
           "try:\n    runpy.run_module('dsv4deploy', run_name='__main__')\n"
           "finally:\n    u = resource.getrusage(resource.RUSAGE_SELF)\n"
           "    print('maxrss_kib', u.ru_maxrss, 'cpu_s', u.ru_utime + u.ru_stime, file=sys.stderr)\n")


@pytest.mark.parametrize("case", ["alias-bomb", "deep-flow", "huge-file", "huge-string", "too-many-values",
                                  "self-alias-map"])
def test_through_a_process_under_2s_and_200mb(profile_dir, tmp_path, case):
    text, _, contains = YAML_CASES[case]
    write(profile_dir, text)
    proc = subprocess.run([sys.executable, "-c", WRAPPER, "render", "case", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env={**os.environ, "DSV4_PROFILES_DIR": str(profile_dir.path)})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert contains in proc.stderr and re.search(r"case\.yaml:\d+: ", proc.stderr)
    rss = int(re.search(r"maxrss_kib (\d+)", proc.stderr).group(1))
    assert rss < 200 * 1024, f"{rss} KiB"
    cpu_s = float(re.search(r"cpu_s ([0-9.]+)", proc.stderr).group(1))
    assert cpu_s < 2.0, f"{cpu_s:.2f} CPU s, interpreter start-up included"
    assert not (tmp_path / "out").exists()


def test_a_newline_profile_name_through_a_process(profile_dir, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dsv4deploy", "validate", "nvfp4-ctx8k\n"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("<command line>: profile: invalid profile name: contains a newline")


def test_at_least_150_hostile_cases():
    count = (len(INJECTIONS) + len(YAML_CASES) + len(BYTES_CASES) + len(VALUE_CASES) + len(SEMANTIC_CASES)
             + 2 + 2 * len(NAMES) + 9 + 1 + 6)
    assert count >= 150, count


# --- replicas and the gateway (issue 13) -----------------------------------------------------------

R = "replicas:\n  count: 2\n"
REPLICA_CASES = {
    "count-zero": ("replicas: {count: 0}\n", "replicas.count", ">= 1"),
    "count-bool": ("replicas: {count: true}\n", "replicas.count", "expected an integer"),
    "count-float": ("replicas: {count: 2.0}\n", "replicas.count", "write 2"),
    "count-string": ("replicas: {count: '2'}\n", "replicas.count", "expected an integer"),
    "count-huge": ("replicas: {count: 100000000000000000000}\n", "replicas.count", "too large"),
    "count-missing": ("replicas: {base_port: 31001}\n", "replicas.count", "missing required key"),
    "replicas-null": ("replicas:\n", "replicas", "expected a mapping"),
    "replicas-list": ("replicas: [2]\n", "replicas", "expected a mapping"),
    "unknown-key": (R + "  replica: 3\n", "replicas.replica", "unknown key"),
    "gateway-unknown-key": (R + "  gateway: {prometheus_host: 0.0.0.0}\n", "replicas.gateway.prometheus_host",
                            "unknown key"),
    "more-gpus-than-host": ("replicas: {count: 3}\n", "replicas.count", "the host has 8"),
    "gpu-negative": (R + "  gpus: [[-1, 0, 1, 2], [4, 5, 6, 7]]\n", "replicas.gpus[0][0]", ">= 0"),
    "gpu-float": (R + "  gpus: [[0.0, 1, 2, 3], [4, 5, 6, 7]]\n", "replicas.gpus[0][0]", "write 0"),
    "gpu-string": (R + "  gpus: [['0', 1, 2, 3], [4, 5, 6, 7]]\n", "replicas.gpus[0][0]", "expected an integer"),
    "gpu-nested": (R + "  gpus: [[[0]], [4, 5, 6, 7]]\n", "replicas.gpus[0][0]", "expected an integer"),
    "gpus-range-string": (R + "  gpus: 0-7\n", "replicas.gpus", "expected a list"),
    "gpu-set-empty": (R + "  gpus: [[], [4, 5, 6, 7]]\n", "replicas.gpus[0]", "empty"),
    "gpu-overlap": (R + "  gpus: [[0, 1, 2, 3], [3, 4, 5, 6]]\n", "replicas.gpus[1][0]", "disjoint"),
    "gpu-twice": (R + "  gpus: [[0, 1, 1, 2], [4, 5, 6, 7]]\n", "replicas.gpus[0][2]", "listed twice"),
    "gpu-beyond-host": (R + "  gpus: [[0, 1, 2, 3], [4, 5, 6, 8]]\n", "replicas.gpus[1][3]", "does not exist"),
    "gpu-beyond-schema": (R + "  gpus: [[0, 1, 2, 3], [4, 5, 6, 64]]\n", "replicas.gpus[1][3]", "<= 63"),
    "gpu-set-not-tp": (R + "  gpus: [[0, 1], [4, 5, 6, 7]]\n", "replicas.gpus[0]", "server.tp_size is 4"),
    "gpu-sets-count": (R + "  gpus: [[0, 1, 2, 3]]\n", "replicas.gpus", "1 GPU sets for replicas.count 2"),
    "base-port-zero": (R + "  base_port: 0\n", "replicas.base_port", ">= 1"),
    "base-port-privileged": (R + "  base_port: 80\n", "replicas.base_port", "below 1024"),
    "base-port-float": (R + "  base_port: 31001.0\n", "replicas.base_port", "write 31001"),
    "base-port-past-end": (R + "  base_port: 65535\n", "replicas.base_port", "past 65535"),
    "replica-on-gateway-port": (R + "  base_port: 29999\n", "replicas.base_port", "is replica 1's port"),
    "metrics-on-replica-port": (R + "  gateway: {metrics_port: 30001}\n", "replicas.gateway.metrics_port",
                                "is replica 0's port"),
    "metrics-on-gateway-port": (R + "  gateway: {port: 31000, metrics_port: 31000}\n",
                                "replicas.gateway.metrics_port", "also replicas.gateway.port"),
    "gateway-port-high": (R + "  gateway: {port: 70000}\n", "replicas.gateway.port", "<= 65535"),
    "policy-typo": (R + "  gateway: {policy: cache-aware}\n", "replicas.gateway.policy", "did you mean cache_aware"),
    "version-unshipped": (R + "  gateway: {version: '1.12.0'}\n", "replicas.gateway.version", "no lock file"),
    "version-path": (R + "  gateway: {version: '../../sglang/0.5.23'}\n", "replicas.gateway.version", "not valid"),
    "drain-negative": (R + "  drain_timeout_s: -1\n", "replicas.drain_timeout_s", ">= 0"),
    "server-public": ("server: {host: 0.0.0.0}\n" + R, "server.host", "loopback"),
    "public-gateway-no-key": ("server: {api_key: false}\n" + R + "  gateway: {host: 0.0.0.0}\n", "server.api_key",
                              "control plane"),
    "metrics-off": ("server: {enable_metrics: false}\n" + R, "server.enable_metrics", "/metrics"),
    "cuda-visible-in-env": ("server:\n  env: {CUDA_VISIBLE_DEVICES: '0'}\n" + R, "server.env.CUDA_VISIBLE_DEVICES",
                            "set per replica"),
    "port-var-in-env": ("server:\n  env: {DSV4_REPLICA_PORT: '1'}\n" + R, "server.env.DSV4_REPLICA_PORT",
                        "set per replica"),
    "multi-node": ("server: {nnodes: 2, tp_size: 8}\n" + R, "replicas", "single-host"),
}


@pytest.mark.parametrize("case", sorted(REPLICA_CASES))
def test_replica_inputs(profile_dir, tmp_path, capsys, case):
    text, key, contains = REPLICA_CASES[case]
    write(profile_dir, BASE + text)
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", key, contains)


def test_a_bad_replica_profile_leaves_an_existing_render_untouched(profile_dir, tmp_path, capsys):
    out = tmp_path / "rendered"
    assert main(["render", "nvfp4-ctx8k-dp2", "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    write(profile_dir, "extends: nvfp4-ctx8k-dp2\nreplicas: {count: 2, gpus: [[0, 1, 2, 3], [0, 1, 2, 3]]}\n")
    capsys.readouterr()
    assert main(["render", "case", "--out", str(out)]) == 2
    assert "replicas.gpus[1][0]" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


# --- issue 37: packages come over https only, each from the one index named for it ------------------

@pytest.mark.parametrize("template,key", [
    ("sglang:\n  index_url: http://mirror.invalid/simple\n", "sglang.index_url"),
    ("sglang:\n  index_url: HTTP://mirror.invalid/simple\n", "sglang.index_url"),
    ("sglang:\n  indexes:\n    - {name: pt, url: 'http://x.invalid/simple', packages: [torch]}\n",
     "sglang.indexes[0].url"),
    ("sglang:\n  extra_index_urls: [http://x.invalid/simple]\n", "sglang.extra_index_urls[0]"),
])
def test_an_index_over_http_is_refused(profile_dir, tmp_path, capsys, template, key):
    write(profile_dir, BASE + template)
    refused(capsys, tmp_path, ["validate", "case"], "case.yaml", key, "https://")


def test_an_extra_index_that_names_no_packages_is_refused(profile_dir, tmp_path, capsys):
    write(profile_dir, BASE + "sglang:\n  extra_index_urls: [https://download.pytorch.org/whl/cu130]\n")
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", "sglang.extra_index_urls",
            "must name the packages that come from it")


@pytest.mark.parametrize("template,key,contains", [
    ("    - {name: a, url: 'https://a.invalid/simple', packages: [torch]}\n"
     "    - {name: b, url: 'https://b.invalid/simple', packages: [Torch]}\n",
     "sglang.indexes[1].packages[0]", "already named for index a"),
    ("    - {name: a, url: 'https://a.invalid/simple', packages: [torch]}\n"
     "    - {name: a, url: 'https://b.invalid/simple', packages: [triton]}\n",
     "sglang.indexes[1].name", "given twice"),
    ("    - {name: a, url: 'https://a.invalid/simple', packages: []}\n", "sglang.indexes[0].packages", ""),
    ("    - {name: a, url: 'https://a.invalid/simple'}\n", "sglang.indexes[0]", "packages"),
])
def test_an_index_list_that_is_ambiguous_is_refused(profile_dir, tmp_path, capsys, template, key, contains):
    write(profile_dir, BASE + "sglang:\n  indexes:\n" + template)
    refused(capsys, tmp_path, ["render", "case"], "case.yaml", key, contains)
