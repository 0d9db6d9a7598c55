"""argv parsing of the SGLang twin: the emulated release's own option strings (0.5.23)."""

import subprocess
import sys

import pytest

from ct200twin.server import args as targs


def parse(*argv):
    return targs.parse_args(["--model-path", "/m", *argv])


def test_defaults_are_sglangs():
    a = parse()
    assert (a.host, a.port, a.tp_size) == ("127.0.0.1", 30000, 1)
    assert a.context_length is None and a.max_running_requests is None
    assert a.num_continuous_decode_steps == 1 and a.moe_runner_backend == "auto"
    assert a.version == "0.5.23"


def test_tp_abbreviation_and_aliases():
    assert parse("--tp", "4").tp_size == 4
    assert parse("--tensor-parallel-size", "8").tp_size == 8
    assert targs.parse_args(["--model", "/x"]).model_path == "/x"
    assert parse("--mem-frac", "0.7").mem_fraction_static == 0.7


@pytest.mark.parametrize("value,expected", [("8192", 8192), ("128k", 128000), ("128Ki", 131072),
                                            ("1M", 1000000), ("1Mi", 1048576)])
def test_context_length_human_readable_int(value, expected):
    assert parse("--context-length", value).context_length == expected


def test_typed_flags():
    a = parse("--cuda-graph-max-bs-decode", "32", "--max-running-requests", "64", "--moe-runner-backend",
              "marlin", "--api-key", "k", "--enable-metrics", "--disable-custom-all-reduce",
              "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:25000",
              "--chunked-prefill-size", "-1", "--trust-remote-code", "--skip-server-warmup",
              "--disable-cuda-graph", "--log-level", "warning", "--served-model-name", "dsv4")
    assert a.cuda_graph_max_bs_decode == 32 and a.max_running_requests == 64
    assert a.moe_runner_backend == "marlin" and a.api_key == "k" and a.enable_metrics
    assert a.disable_custom_all_reduce and a.nnodes == 2 and a.node_rank == 1
    assert a.dist_init_addr == "10.0.0.1:25000" and a.chunked_prefill_size == -1
    assert a.trust_remote_code and a.skip_server_warmup and a.disable_cuda_graph
    assert a.log_level == "warning" and a.served_model_name == "dsv4"


def test_generic_flags_accepted():
    a = parse("--enable-hicache", "--cuda-graph-bs-prefill", "1", "2", "4", "--watchdog-timeout", "60",
              "--reasoning-parser", "deepseek-v4")
    assert a.enable_hicache is True
    assert a.cuda_graph_bs_prefill == ["1", "2", "4"]
    assert a.reasoning_parser == "deepseek-v4" and a.watchdog_timeout == 60.0


def _errors(*argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    return e.value.code, capsys.readouterr().err


def test_old_cuda_graph_flag_is_ambiguous(capsys):
    code, err = _errors("--cuda-graph-max-bs", "32", capsys=capsys)
    assert code == 2
    assert ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill") in err


def test_unknown_flag_exit_2(capsys):
    code, err = _errors("--no-such-flag", capsys=capsys)
    assert code == 2 and "sglang serve: error: unrecognized arguments: --no-such-flag" in err


@pytest.mark.parametrize("argv,msg", [
    (["--quantization", "nvfp4"], "argument --quantization: invalid choice: 'nvfp4'"),
    (["--moe-runner-backend", "fastest"], "argument --moe-runner-backend: invalid choice"),
    (["--context-length", "8x"], "argument --context-length: invalid human_readable_int value: '8x'"),
])
def test_bad_values(argv, msg, capsys):
    code, err = _errors(*argv, capsys=capsys)
    assert code == 2 and msg in err


def test_config_yaml_merges_and_cli_wins(tmp_path):
    cfg = tmp_path / "opts.yaml"
    cfg.write_text("api-key: secret\nenable-metrics: true\ntp-size: 2\ncontext_length: 8192\n")
    a = targs.parse_args(["--model-path", "/m", "--config", str(cfg), "--tp-size", "4"])
    assert a.api_key == "secret" and a.enable_metrics and a.tp_size == 4 and a.context_length == 8192
    assert "secret" not in " ".join(a.argv)


def test_version_without_flag_file_is_refused(monkeypatch):
    monkeypatch.setenv(targs.VERSION_ENV, "0.4.0")
    with pytest.raises(targs.TwinArgError, match="no flag file for SGLang 0.4.0"):
        targs.parse_args(["--model-path", "/m"])


def test_cli_exit_codes():
    r = subprocess.run([sys.executable, "-m", "ct200twin.server.main", "--model-path", "/m",
                        "--cuda-graph-max-bs", "32"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "ambiguous option: --cuda-graph-max-bs" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ct200twin.server.main", "--model-path", "/m"],
                       capture_output=True, text=True, timeout=30,
                       env={"DSV4_TWIN_SGLANG_VERSION": "0.1.0", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "no flag file for SGLang 0.1.0" in r.stderr


def test_the_twin_answers_as_the_sglang_wheel_installed_next_to_it(tmp_path):
    """On the host the deploy's venv holds the real wheel: a profile pinned to 0.5.13.post1 is
    parsed with that release's flags (--cuda-graph-max-bs), which 0.5.23 refuses as ambiguous."""
    import subprocess
    import sys

    dist = tmp_path / "sglang-0.5.13.post1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.13.post1\n")
    code = ("from ct200twin.server.args import parse_args, resolve_version; print(resolve_version()); "
            "print(parse_args(['--model-path', '/m', '--cuda-graph-max-bs', '32']).version)")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["0.5.13.post1", "0.5.13.post1"], out.stderr[-2000:]
    bare = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert bare.returncode != 0 and "ambiguous option: --cuda-graph-max-bs" in bare.stderr


def test_an_older_release_keeps_the_settings_it_has_no_flag_for():
    ns = targs.parse_args(["--model-path", "/m", "--cuda-graph-max-bs", "32", "--tp-size", "4"], version="0.5.13.post1").ns
    assert (ns.cuda_graph_max_bs_decode, ns.tp_size) == (32, 4)
    assert ns.disable_decode_cuda_graph is False and ns.cuda_graph_backend_decode is None
