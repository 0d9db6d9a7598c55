"""Every launch argv the project renders parses under SGLang's OWN parser, with the values meant.

The parser is the real one (`ServerArgs.add_cli_args` + SGLang's `--config` merging, as
`prepare_server_args` does it), from `sglang==<version>` installed in a CPU-only venv that
tests/tools/sglang_parser.py builds under .cache/sglang-parser/ (about 1.5-2 min the first time
on a fresh machine; nothing is skipped when the cache is missing: it is built). All argv of this
module are parsed in ONE subprocess per SGLang version (importing SGLang costs ~5 s).
"""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import sglang_parser  # noqa: E402

from dsv4deploy.sglang.versions import facts  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
FLAGS_DIR = REPO / "dsv4deploy" / "data" / "sglang"
PARSER_VERSION = "0.5.23"
API_KEY = "sk-parser-test-0123456789"   # what the test's stand-in secret-args.yaml holds

# Profiles written for this test on top of the shipped ones, so that every optional branch of
# the renderer is parsed too (--config, --chunked-prefill-size, --disable-custom-all-reduce,
# --trust-remote-code, extra_args, non-default host/port/log level).
VARIANTS = {
    "zz-parser-every-option": """
        extends: nvfp4-ctx8k
        description: parser test, every optional server flag on
        server:
          api_key: true
          chunked_prefill_size: 4096
          trust_remote_code: true
          disable_custom_all_reduce: true
          max_running_requests: 32
          host: 0.0.0.0
          port: 31000
          log_level: debug
          extra_args: ["--watchdog-timeout", "600"]
    """,
}

# Negative controls: proof that the parser answering is SGLang's real one.
CONTROLS = {
    "old_cuda_graph_flag": ["--model-path", "/m", "--cuda-graph-max-bs", "32"],
    "nvfp4_is_no_quantization": ["--model-path", "/m", "--quantization", "nvfp4"],
    "si_context_length": ["--model-path", "/m", "--context-length", "128k"],
    "iec_context_length": ["--model-path", "/m", "--context-length", "128Ki"],
    "tp_abbreviation": ["--model-path", "/m", "--tp", "8"],
    "config_underscore_key": ["--model-path", "/m", "--config", "@UNDERSCORE_YAML@"],
}


def _renderer():
    """The project's renderer API, or a failure that says what is missing (never a skip)."""
    try:
        from checkout import list_profiles, load_profile
        from dsv4deploy.render.argv import server_args
    except ImportError as exc:  # pragma: no cover - only while the renderer is being written
        pytest.fail("the renderer API this test checks is missing: need "
                    "`from dsv4deploy.profile.load import load_profile, list_profiles` and "
                    f"`from dsv4deploy.render.argv import server_args` ({exc})", pytrace=False)
    return list_profiles, load_profile, server_args


@pytest.fixture(scope="session")
def sglang_parser_venv():
    """The SGLang 0.5.23 parser venv, built here if it is missing (CI starts without it)."""
    return sglang_parser.ensure(PARSER_VERSION)


@pytest.fixture(scope="module")
def parsed(sglang_parser_venv, tmp_path_factory):
    """Render every profile (shipped + VARIANTS), parse everything in one call per version."""
    list_profiles, load_profile, server_args = _renderer()
    root = tmp_path_factory.mktemp("sglang-parser")
    profiles_dir = root / "profiles"
    profiles_dir.mkdir()
    for src in (REPO / "profiles").glob("*.yaml"):
        (profiles_dir / src.name).write_text(src.read_text())
    for name, text in VARIANTS.items():
        (profiles_dir / f"{name}.yaml").write_text(textwrap.dedent(text).lstrip("\n"))
    # Stand-in for the host's 0600 secret-args.yaml: the YAML key is spelled like the flag.
    secret = root / "secret-args.yaml"
    secret.write_text(f"api-key: {API_KEY}\n")
    underscore = root / "underscore.yaml"
    underscore.write_text(f"api_key: {API_KEY}\n")

    rendered = {}
    for name in list_profiles(profiles_dir):
        profile = load_profile(name, profiles_dir)
        argv = list(server_args(profile))
        rendered[name] = (profile, argv, _with_local_config(argv, secret))
    assert set(VARIANTS) <= set(rendered), "list_profiles() did not list the test's variants"

    by_version: dict[str, list[str]] = {PARSER_VERSION: []}
    for name, (profile, _, _) in rendered.items():
        by_version.setdefault(profile.data["sglang"]["version"], []).append(name)
    results, flags = {}, {}
    controls = {f"control:{c}": [str(underscore) if w == "@UNDERSCORE_YAML@" else w for w in argv]
                for c, argv in CONTROLS.items()}
    for version, names in sorted(by_version.items()):
        batch = {n: rendered[n][2] for n in names}
        if version == PARSER_VERSION:   # these ride along in the same subprocess
            batch.update(controls)
            # and the real entry point, prepare_server_args(argv): GPU-free in 0.5.23
            batch.update({f"prepare:{n}": {"argv": rendered[n][2], "prepare": True} for n in names})
        out = sglang_parser.query(version, list(batch.values()))
        assert out["version"] == version
        flags[version] = out["flags"]
        results.update(zip(batch, out["results"]))
    return rendered, results, flags


def _with_local_config(argv: list[str], secret: Path) -> list[str]:
    """The rendered argv with the host path after `--config` pointed at the local stand-in."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word == "--config":
            out[i + 1] = str(secret)
    return out


def _ok(result: dict, what: str) -> dict:
    assert result["ok"], f"{what}: SGLang's parser rejected it (exit {result.get('exit_code')}):\n" \
        + "\n".join(result.get("error", "").strip().splitlines()[-3:])
    return result["values"]


# --- (a) what the project renders ---------------------------------------------------------------

def test_every_rendered_argv_parses(parsed):
    rendered, results, _ = parsed
    assert rendered, "no profiles rendered"
    for name, (_, argv, _) in rendered.items():
        _ok(results[name], f"profile {name}: {' '.join(argv)}")


def test_rendered_flags_are_exact_option_strings(parsed):
    """argparse also takes unique prefixes (`--tp`); the renderer must spell flags in full."""
    rendered, _, _ = parsed
    for name, (profile, argv, _) in rendered.items():
        version = profile.data["sglang"]["version"]
        flags = set((FLAGS_DIR / f"{version}.flags").read_text().split())
        for word in argv:
            if word.startswith("--"):
                assert word.split("=", 1)[0] in flags, \
                    f"profile {name}: {word} is not an option string of SGLang {version}"


def test_namespace_matches_profile(parsed):
    rendered, results, _ = parsed
    for name, (profile, argv, _) in rendered.items():
        ns = _ok(results[name], f"profile {name}")
        server, model = profile.data["server"], profile.data["model"]
        # Older releases store some flags under other dests: 0.5.13.post1's --tp-size goes to
        # tensor_parallel_size (ServerArgs.from_cli_args copies it to tp_size), and its only
        # graph-size flag is --cuda-graph-max-bs (versions.yaml: cuda_graph_max_bs_flag).
        version = facts(profile.data["sglang"]["version"])
        graph_dest = version.cuda_graph_max_bs_flag.removeprefix("--").replace("-", "_")
        tp_dest = "tp_size" if "tp_size" in ns else "tensor_parallel_size"
        ns = {**ns, "tp_size": ns[tp_dest], "cuda_graph_max_bs_decode": ns[graph_dest]}
        want = {
            "tp_size": server["tp_size"],
            "context_length": server.get("context_length"),
            "cuda_graph_max_bs_decode": server.get("cuda_graph_max_bs_decode"),
            "num_continuous_decode_steps": 1,  # never rendered (SGLang never reads it): the default
            "moe_runner_backend": server["moe_runner_backend"],
            "max_running_requests": server.get("max_running_requests"),
            "chunked_prefill_size": server.get("chunked_prefill_size"),
            "disable_custom_all_reduce": bool(server.get("disable_custom_all_reduce")),
            "enable_metrics": bool(server.get("enable_metrics")),
            "trust_remote_code": bool(server.get("trust_remote_code")),
            "host": server.get("host", "127.0.0.1"),
            "port": server.get("port", 30000),
            "log_level": server.get("log_level", "info"),
            "nnodes": server.get("nnodes", 1),
            "served_model_name": model["served_model_name"],
            "api_key": API_KEY if server.get("api_key") else None,
        }
        got = {key: ns.get(key) for key in want}
        assert got == want, f"profile {name}: parsed {got}\n  wanted {want}\n  argv {argv}"
        assert math.isclose(ns["mem_fraction_static"], server["mem_fraction_static"]), \
            f"profile {name}: mem_fraction_static {ns['mem_fraction_static']}"
        assert ns["model_path"] and ns["model_path"] == argv[argv.index("--model-path") + 1]
        # NVFP4 DeepSeek-V4: SGLang detects the hybrid FP8+NVFP4 layout itself.
        if "nvfp4" in model["repo"].lower():
            assert ns["quantization"] is None, f"profile {name}: passes --quantization"
        # --config is merged away by SGLang, and the key never appears in argv.
        assert ns.get("config") is None
        assert API_KEY not in " ".join(argv)


def test_prepare_server_args_agrees(parsed):
    """SGLang's launch entry point (prepare_server_args: --config merge, parse, ServerArgs
    record) takes the rendered argv and ends up with the same values as the plain parse."""
    rendered, results, _ = parsed
    keys = ("model_path", "served_model_name", "tp_size", "mem_fraction_static", "context_length",
            "cuda_graph_max_bs_decode", "num_continuous_decode_steps", "moe_runner_backend",
            "max_running_requests", "chunked_prefill_size", "disable_custom_all_reduce",
            "enable_metrics", "trust_remote_code", "host", "port", "log_level", "nnodes",
            "api_key", "quantization")
    checked = 0
    for name, (profile, _, _) in rendered.items():
        if profile.data["sglang"]["version"] != PARSER_VERSION:
            continue
        plain = _ok(results[name], f"profile {name}")
        record = _ok(results[f"prepare:{name}"], f"prepare_server_args, profile {name}")
        assert {k: record.get(k) for k in keys} == {k: plain.get(k) for k in keys}, name
        checked += 1
    assert checked, f"no profile pins SGLang {PARSER_VERSION}"


def test_variant_profiles_exercise_the_optional_flags(parsed):
    rendered, _, _ = parsed
    argv = rendered["zz-parser-every-option"][1]
    for flag in ("--config", "--chunked-prefill-size", "--disable-custom-all-reduce",
                 "--trust-remote-code", "--watchdog-timeout"):
        assert flag in argv, f"the every-option variant no longer renders {flag}: {argv}"


# --- (b) negative controls: the parser is SGLang's real one -------------------------------------

def _error(results, control) -> str:
    result = results[f"control:{control}"]
    assert not result["ok"], f"{control}: SGLang accepted {CONTROLS[control]}"
    return result["error"]


def test_old_cuda_graph_flag_is_ambiguous(parsed):
    _, results, _ = parsed
    assert results["control:old_cuda_graph_flag"].get("exit_code") == 2
    assert ("ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
            "--cuda-graph-max-bs-prefill") in _error(results, "old_cuda_graph_flag")


def test_nvfp4_is_not_a_quantization_choice(parsed):
    _, results, _ = parsed
    assert results["control:nvfp4_is_no_quantization"].get("exit_code") == 2
    assert "argument --quantization: invalid choice: 'nvfp4'" in _error(results, "nvfp4_is_no_quantization")


def test_context_length_suffixes(parsed):
    _, results, _ = parsed
    assert _ok(results["control:si_context_length"], "128k")["context_length"] == 128000
    assert _ok(results["control:iec_context_length"], "128Ki")["context_length"] == 131072


def test_tp_is_only_an_abbreviation(parsed):
    _, results, _ = parsed
    assert _ok(results["control:tp_abbreviation"], "--tp 8")["tp_size"] == 8
    assert "--tp" not in (FLAGS_DIR / f"{PARSER_VERSION}.flags").read_text().split()


def test_config_yaml_keys_are_spelled_like_flags(parsed):
    """`api_key:` in the --config YAML becomes `--api_key`, which SGLang rejects."""
    _, results, _ = parsed
    assert "unrecognized arguments: --api_key" in _error(results, "config_underscore_key")


def test_shipped_flag_files_are_the_parsers(parsed):
    """data/sglang/<version>.flags is exactly what that release's parser has, order included."""
    _, _, flags = parsed
    for version, parser_flags in flags.items():
        shipped = (FLAGS_DIR / f"{version}.flags").read_text().split()
        assert parser_flags == shipped, f"{version}.flags differs from SGLang {version}'s parser"
