"""Rendering: deterministic golden output, systemd accepts the unit, flags spelled right."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dsv4deploy.render.layout import Layout
from checkout import list_profiles, load_profile
from dsv4deploy.render.argv import server_args
from dsv4deploy.render.systemd import systemd_exec, systemd_word
from dsv4deploy.render.unit import render

GOLDEN = Path(__file__).parent / "golden"


def golden_files(name: str) -> dict[str, str]:
    r = render(load_profile(name))
    layout = Layout.of(load_profile(name).data)
    if r.replicas:  # every rendered file by its base name (unique within a release), each argv
        files = {path.rsplit("/", 1)[1]: text for path, text in r.files.items()}
        argvs = {f"{x.instance}.service": x.argv for x in r.replicas}
        argvs[f"{r.gateway.service}.service"] = r.gateway.argv
        return {**files, "argv.json": json.dumps(argvs, indent=2) + "\n",
                "unit-path": "\n".join(p for p in r.files if p.startswith("/etc/systemd/")) + "\n"}
    return {"sglang.service": r.unit, "nccl.env": r.nccl_env, "manifest.json": r.manifest,
            "argv.json": json.dumps(r.argv, indent=2) + "\n", "unit-path": layout.unit + "\n"}


@pytest.mark.parametrize("name", list_profiles())
def test_rendered_files_match_golden(name):
    """Golden files show every rendered byte in review; UPDATE_GOLDEN=1 rewrites them."""
    files = golden_files(name)
    folder = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for fname, text in files.items():
            (folder / fname).write_text(text)
    for fname, text in files.items():
        assert (folder / fname).read_text() == text, f"{name}/{fname} differs from golden (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("name", list_profiles())
def test_rendering_is_deterministic(name):
    assert render(load_profile(name)) == render(load_profile(name))


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing (make bootstrap installs systemd)")
@pytest.mark.parametrize("name", list_profiles())
def test_systemd_analyze_verify_accepts_the_unit(name, tmp_path):
    """verify in a scratch root: the venv python exists there, the system's units are linked in."""
    profile = load_profile(name)
    rendered = render(profile)
    root = tmp_path / "root"
    for path, text in rendered.files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    for argv in [rendered.argv] + ([rendered.gateway.argv] if rendered.gateway else []):
        python = root / argv[0].lstrip("/")
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text("#!/bin/sh\n")
        python.chmod(0o755)
    (root / "usr/lib/systemd").mkdir(parents=True)
    (root / "usr/lib/systemd/system").symlink_to("/lib/systemd/system")
    # a templated unit is verified through its instances (by name, as systemctl starts them)
    units = ([f"{r.instance}.service" for r in rendered.replicas] + [f"{rendered.gateway.service}.service"]
             if rendered.replicas else [Layout.of(profile.data).unit])
    for unit in units:
        out = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", unit],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stderr.strip() == "", (unit, out.stderr)


def test_flags_are_spelled_in_full_for_0_5_23():
    args = server_args(load_profile("nvfp4-ctx8k"))
    assert "--tp-size" in args and "--tp" not in args
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert "--cuda-graph-max-bs" not in args
    assert args[args.index("--context-length") + 1] == "8192"
    assert args[args.index("--mem-fraction-static") + 1] == "0.7"
    assert args[args.index("--moe-runner-backend") + 1] == "marlin"


def test_no_quantization_flag_for_the_nvfp4_checkpoint():
    for name in list_profiles():
        assert "--quantization" not in server_args(load_profile(name))


def test_default_context_renders_no_context_flag():
    assert "--context-length" not in server_args(load_profile("fp8-ctx1m-baseline"))


def test_nop2p_profile_renders_the_workaround():
    r = render(load_profile("nvfp4-tp8-nop2p"))
    assert "--disable-custom-all-reduce" in r.argv
    assert "NCCL_P2P_DISABLE=1\n" in r.nccl_env


def test_nccl_overrides_win_over_the_preset(profile_dir):
    profile_dir.write("dbg", "extends: nvfp4-ctx8k\nnccl:\n  preset: ll-ring\n  overrides:\n    NCCL_PROTO: Simple\n    NCCL_DEBUG: INFO\n")
    env = render(load_profile("dbg")).nccl_env
    assert "NCCL_PROTO=Simple\n" in env and "NCCL_DEBUG=INFO\n" in env and "NCCL_PROTO=LL\n" not in env


@pytest.mark.parametrize("env,nccl", [("1", "1"), ("'1'", "'1'"), ("true", '"1"')])
def test_one_value_in_any_yaml_spelling_renders_one_release(profile_dir, env, nccl):
    """1, "1" and (for the environment) true are one value: the same files, content hash included,
    so changing the spelling is no change to deploy."""
    def rendered(env_value: str, nccl_value: str):
        profile_dir.write("spelled", f"extends: nvfp4-ctx8k\nserver:\n  env:\n    SGLANG_X: {env_value}\n"
                          f"nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_NCHANNELS_PER_PEER: {nccl_value}\n")
        return render(load_profile("spelled"))

    plain = rendered("'1'", "'1'")
    spelled = rendered(env, nccl)
    assert "Environment=SGLANG_X=1\n" in spelled.unit and "NCCL_NCHANNELS_PER_PEER=1\n" in spelled.nccl_env
    assert spelled.files == plain.files


def test_api_key_never_reaches_argv_or_unit(profile_dir):
    profile_dir.write("keyed", "extends: nvfp4-ctx8k\nserver:\n  api_key: true\n")
    r = render(load_profile("keyed"))
    assert "--api-key" not in r.argv
    assert r.argv[r.argv.index("--config") + 1] == "/run/credentials/sglang.service/sglang-config.yaml"
    assert "\nLoadCredential=sglang-config.yaml:/etc/dsv4deploy/secrets/sglang-sglang-config.yaml\n" in r.unit
    assert "secrets" not in "".join(l for l in r.unit.splitlines() if l.startswith("EnvironmentFile"))


def test_unit_runs_as_service_user_with_long_start_timeout():
    unit = render(load_profile("nvfp4-ctx8k")).unit
    for line in ("User=sglang", "TimeoutStartSec=1800", "Restart=on-failure", "StartLimitBurst=3",
                 "EnvironmentFile=/etc/dsv4deploy/sglang/nccl.env"):
        assert f"\n{line}\n" in unit
    assert "/usr/bin" in next(l for l in unit.splitlines() if l.startswith("Environment=PATH="))


def test_the_twin_swaps_only_the_module():
    real = render(load_profile("nvfp4-ctx8k")).argv
    twin = render(load_profile("nvfp4-ctx8k"), module="ct200twin.server.main").argv
    assert real[2] == "sglang.launch_server" and twin[2] == "ct200twin.server.main"
    assert real[:2] + real[3:] == twin[:2] + twin[3:]


def test_venv_path_names_version_and_patch_set(profile_dir):
    profile_dir.write("plain", "extends: nvfp4-ctx8k\nserver: {api_key: false}\nsglang: {patches: []}\n")
    plain = Layout.of(load_profile("plain").data).venv
    profile_dir.write("patched", "extends: nvfp4-ctx8k\nsglang:\n  patches:\n    - {name: p, file: p.diff, sha256: " + "b" * 64 + "}\n")
    patched = Layout.of(load_profile("patched").data).venv
    assert plain.startswith("/opt/dsv4deploy/venvs/sglang-0.5.23-")    # named by the release's lock file too
    assert patched.startswith("/opt/dsv4deploy/venvs/sglang-0.5.23-") and patched != plain


@pytest.mark.parametrize("word,quoted", [
    ("--port", "--port"),
    ("a b", '"a b"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("100%", "100%%"),
    ("$HOME", '"$$HOME"'),
    ("back\\slash", '"back\\\\slash"'),
])
def test_systemd_quoting(word, quoted):
    assert systemd_word(word) == quoted


def test_exec_line_round_trips_through_a_systemd_like_split():
    import shlex
    argv = ["/x/python", "-m", "m", "--served-model-name", "a b", "--x", 'q"t']
    line = systemd_exec(argv)
    assert shlex.split(line) == argv
