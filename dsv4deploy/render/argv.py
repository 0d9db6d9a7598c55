"""Profile -> SGLang's launch argv: the venv's python, the server module, the flags spelled as
the pinned SGLang version accepts them. The single server's unit and every replica's start it
(render/unit.py, render/replicas.py).
"""

from __future__ import annotations

from dsv4deploy.profile import catalog
from dsv4deploy.profile.load import Profile
from dsv4deploy.render.layout import Layout
from dsv4deploy.sglang.flags import flag
from dsv4deploy.sglang.versions import facts

SGLANG_MODULE = "sglang.launch_server"
# The API key reaches SGLang as a systemd credential: a --config file under $CREDENTIALS_DIRECTORY.
# Its name ends in .yaml: SGLang's --config merger refuses any other suffix ("Config file must be
# YAML format, got: ", utils/server_args_config_parser.py in 0.5.23), at start, after argparse.
SGLANG_CONFIG_CREDENTIAL = "sglang-config.yaml"


def server_args(profile: Profile, port: str | None = None, config: str | None = None) -> list[str]:
    """The flags after `-m sglang.launch_server`, spelled as the pinned version accepts them;
    `port` and `config` replace the --port and --config words (a replica's, or a template's)."""
    data = profile.data
    server, model = data["server"], data["model"]
    version = facts(data["sglang"]["version"])
    if version is None:
        raise ValueError(f"no flag data for SGLang {data['sglang']['version']}")
    layout = Layout.of(data)
    args = ["--model-path", layout.model_dir,
            "--served-model-name", model["served_model_name"],
            "--tp-size", str(server["tp_size"])]
    if server["nnodes"] > 1:
        args += ["--nnodes", str(server["nnodes"])]
    args += ["--mem-fraction-static", _number(server["mem_fraction_static"])]
    if server.get("context_length"):
        args += ["--context-length", str(int(server["context_length"]))]
    if server.get("cuda_graph_max_bs_decode"):
        args += [version.cuda_graph_max_bs_flag, str(server["cuda_graph_max_bs_decode"])]
    args += ["--moe-runner-backend", server["moe_runner_backend"]]
    known = catalog.model(model["repo"])
    if known and known.quantization_flag:
        args += ["--quantization", known.quantization_flag]
    for key in ("max_running_requests", "chunked_prefill_size"):
        if server.get(key):
            args += [flag(key), str(server[key])]
    for key in ("disable_custom_all_reduce", "trust_remote_code", "enable_metrics"):
        if server.get(key):
            args.append(flag(key))
    args += ["--host", server["host"], "--port", port or str(server["port"]), "--log-level", server["log_level"]]
    if server.get("api_key"):
        args += ["--config", config or layout.credential_path(SGLANG_CONFIG_CREDENTIAL)]
    return args + list(server.get("extra_args") or [])


def launch_argv(profile: Profile, module: str = SGLANG_MODULE, port: str | None = None,
                config: str | None = None) -> list[str]:
    """The whole command: the release's venv python, the server module, the flags."""
    return [Layout.of(profile.data).python, "-m", module, *server_args(profile, port, config)]


def _number(value: float) -> str:
    """0.7 -> '0.7', 1 -> '1': the shortest exact spelling, never an exponent."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text
