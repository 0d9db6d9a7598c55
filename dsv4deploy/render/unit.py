"""Profile -> the exact files the host runs: launch argv, systemd unit, NCCL env file and a
launch manifest. Pure and deterministic: the same profile renders byte-identical output.

Every release is read back with systemd's own rules (unitcheck.py) before it is returned: a
unit or env file that would give the process anything but the argv and environment the
profile asked for is a ProfileError naming the profile key, never a file on a host.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import jinja2

from dsv4deploy import __version__
from dsv4deploy.profile import catalog
from dsv4deploy.render import unitcheck
from dsv4deploy.profile.boundary import RENDERED_LINE_MAX, first_unprintable
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.sglang.flags import (MANAGED_ENV, MANAGED_FLAGS, UNIT_PATH, UNREAD_FLAGS, flag, flag_owner,
                                     unit_environment)
from dsv4deploy.render.layout import Layout
from dsv4deploy.render.nccl import nccl_environment, render_env_file
from dsv4deploy.profile.load import Profile
from dsv4deploy.sglang.versions import facts

if TYPE_CHECKING:
    from dsv4deploy.render.replicas import RenderedGateway, RenderedReplica

SGLANG_MODULE = "sglang.launch_server"
# The API key reaches SGLang as a systemd credential: a --config file under $CREDENTIALS_DIRECTORY.
SGLANG_CONFIG_CREDENTIAL = "sglang-config"


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


# --- systemd quoting --------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")  # fullmatch only: `$` would pass a final newline


def _quoted(word: str) -> str:
    """A word as systemd.syntax(7) un-quotes it: bare when plain, else in double quotes with
    backslash and double quote escaped (C escapes work inside quotes there)."""
    if _PLAIN.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_word(word: str) -> str:
    """One ExecStart= word: '%' (specifiers) and '$' (variables) are both expanded there."""
    return _quoted(word.replace("%", "%%").replace("$", "$$"))


def systemd_exec(argv: list[str], raw: frozenset[int] = frozenset()) -> str:
    """The ExecStart= value; the words at indices `raw` go as they are (a template's '${NAME}'
    or '%d/...' words, which the round trip then resolves per instance)."""
    return " ".join(w if i in raw else systemd_word(w) for i, w in enumerate(argv))


def systemd_env(key: str, value: str) -> str:
    """One Environment= assignment: '%' is a specifier there, '$' is not special (systemd.exec(5):
    "Variable expansion is not performed inside the strings"), so only '%' is doubled."""
    return _quoted(f"{key}={value}".replace("%", "%%"))


def unit_specifiers(service: str) -> dict[str, str]:
    """The specifiers a rendered unit may use, as systemd resolves them for `service`.service."""
    return {"n": f"{service}.service", "N": service, "p": service, "P": service,
            "d": f"/run/credentials/{service}.service"}


# --- the rendered release ----------------------------------------------------------------------

@dataclass(frozen=True)
class Rendered:
    """Everything the host gets for one profile; `files` maps host path -> content."""

    argv: list[str]
    unit: str
    nccl_env: str
    manifest: str
    files: dict[str, str]
    # With `replicas:` (render_replicas.py): `unit` is the template <service>@.service, `argv` and
    # `nccl_env` are replica 0's, and each replica and the gateway are described here.
    replicas: tuple["RenderedReplica", ...] = ()
    gateway: "RenderedGateway | None" = None


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("dsv4deploy.render", "templates"),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, autoescape=False,
    )


def render(profile: Profile, module: str = SGLANG_MODULE) -> Rendered:
    if profile.data.get("replicas") is not None:
        from dsv4deploy.render.replicas import render_replicas
        return render_replicas(profile, module)
    data = profile.data
    layout = Layout.of(data)
    server, service = data["server"], data["service"]
    argv = launch_argv(profile, module)
    env = unit_environment(data)
    nccl_vars = nccl_environment(data["nccl"]["preset"], data["nccl"].get("overrides"))
    nccl_env = render_env_file(nccl_vars, f"NCCL preset {data['nccl']['preset']} for profile {profile.name}")
    credentials = [(SGLANG_CONFIG_CREDENTIAL, layout.sglang_config_secret)] if server.get("api_key") else []
    inputs = dict(
        profile=profile.name, content_hash=profile.content_hash,
        sglang_version=data["sglang"]["version"], model_repo=data["model"]["repo"],
        manifest=layout.manifest, user=service["user"], state_dir=layout.state_dir,
        nccl_env=layout.nccl_env, credentials=credentials, hardening=service.get("hardening", "strict"),
        environment=[systemd_env(k, v) for k, v in env.items()],
        exec_start=systemd_exec(argv),
        timeout_start_s=service["timeout_start_s"], timeout_stop_s=service["timeout_stop_s"],
        start_limit_interval=max(600, 3 * service["timeout_start_s"]),
        instance_note="", extra_env_files=[],
    )
    _check_template_inputs(profile, inputs)
    unit = _templates().get_template("sglang.service.j2").render(**inputs)
    check_round_trip(profile, unit, nccl_env, argv, env, nccl_vars)
    files = {layout.unit: unit, layout.nccl_env: nccl_env}
    manifest = manifest_text({**manifest_base(profile, layout, module, argv), "service": service["name"],
                              "endpoint": {"host": server["host"], "port": server["port"]}}, files)
    files[layout.manifest] = manifest
    return Rendered(argv=argv, unit=unit, nccl_env=nccl_env, manifest=manifest, files=files)


def manifest_base(profile: Profile, layout, module: str, argv: list[str]) -> dict:
    """What every launch manifest says: the profile, versions, argv, model, venv."""
    data = profile.data
    return {"profile": profile.name, "content_hash": profile.content_hash, "profile_files": list(profile.files),
            "dsv4deploy_version": __version__, "sglang_version": data["sglang"]["version"],
            "patchset": layout.patchset, "module": module, "argv": argv,
            "model": {"repo": data["model"]["repo"], "revision": data["model"]["revision"], "path": layout.model_dir},
            "venv": layout.venv}


def manifest_text(doc: dict, files: dict[str, str]) -> str:
    """The manifest as written: DOC plus the sha256 of every other rendered file."""
    return json.dumps({**doc, "files": {path: hashlib.sha256(text.encode()).hexdigest()
                                        for path, text in sorted(files.items())}}, indent=2, sort_keys=True) + "\n"


# --- the guard: nothing reaches a host that systemd would read differently ---------------------

def _check_template_inputs(profile: Profile, inputs: dict) -> None:
    """No template input may start a new directive: none holds a line break or any other
    unprintable character, and none ends in a backslash (systemd would join the next line)."""
    for name, value in inputs.items():
        for text in map(str, value if isinstance(value, (list, tuple)) else [value]):
            bad = first_unprintable(text)
            if bad is not None or text.endswith("\\"):
                what = f"an unprintable character at {bad + 1}" if bad is not None else "a trailing backslash"
                raise ProfileError([profile.problem(_INPUT_KEYS.get(name, ("service",)),
                                                    f"refused at render: the unit's {name} holds {what}")])


_INPUT_KEYS = {"profile": (), "sglang_version": ("sglang", "version"), "model_repo": ("model", "repo"),
               "user": ("service", "user"), "manifest": ("service", "name"), "state_dir": ("service", "name"),
               "nccl_env": ("service", "name"), "environment": ("server", "env"),
               "exec_start": ("server", "extra_args")}


def check_round_trip(profile: Profile, unit: str, nccl_env: str, argv: list[str], env: dict[str, str],
                     nccl_vars: dict[str, str]) -> None:
    """Read the unit and the NCCL env file back as systemd does; raise ProfileError (naming the
    profile key each difference comes from) unless they give exactly `argv`, `env` and `nccl_vars`."""
    service = profile.data["service"]["name"]
    found = unitcheck.check_unit(unit, argv, env, unit_specifiers(service), RENDERED_LINE_MAX, quote=systemd_word)
    found += [(("nccl",) + loc[1:], msg) for loc, msg in unitcheck.check_env_file(nccl_env, nccl_vars)]
    if found:
        raise ProfileError([profile.problem(_blame(profile, argv, loc), f"refused at render: {msg}")
                            for loc, msg in found])


def _blame(profile: Profile, argv: list[str], loc: tuple) -> tuple:
    """The profile key a rendered difference comes from."""
    data = profile.data
    if loc[0] == "env":
        return ("server", "env", loc[1]) if loc[1] in (data["server"].get("env") or {}) else ("server", "env")
    if loc[0] == "nccl":
        overrides = data["nccl"].get("overrides") or {}
        return ("nccl", "overrides", loc[1]) if loc[1] in overrides else ("nccl", "preset")
    if loc[0] == "argv":
        extra = data["server"].get("extra_args") or []
        first_extra = len(argv) - len(extra)
        i = loc[1]
        if i >= first_extra:
            return ("server", "extra_args", i - first_extra)
        for j in range(min(i, len(argv) - 1), 2, -1):
            owner = flag_owner(argv[j]) if argv[j].startswith("--") else None
            if owner == "model":
                return ("model", "repo")
            if owner:
                return ("model", owner) if owner == "served_model_name" else ("server", owner)
        return ("server",)
    return ("server", "extra_args") if loc[1:] == ("length",) else ("server",)
