"""The `dsv4deploy` command as a user runs it: exit codes, messages, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dsv4deploy.cli.main import main


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dsv4deploy", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_validate_prints_the_budget_and_exits_0():
    out = run("validate", "nvfp4-ctx8k")
    assert out.returncode == 0, out.stderr
    assert "GPU memory budget per GPU: nvfp4-ctx8k" in out.stdout
    assert "fits" in out.stdout and "nvfp4-ctx8k: valid" in out.stdout


def test_validate_json():
    out = run("validate", "nvfp4-ctx8k", "--json")
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and doc["budget"]["fits"] is True
    assert 1_900_000 < doc["budget"]["kv_tokens"] < 2_100_000


BAD = {
    "malformed": "extends: nvfp4-ctx8k\nserver: [\n",
    "wrongtype": "extends: nvfp4-ctx8k\nserver:\n  port: high\n",
    "unknown": "extends: nvfp4-ctx8k\nservr: {}\n",
    "range": "extends: nvfp4-ctx8k\nserver:\n  tp_size: 0\n",
    "inject": "extends: nvfp4-ctx8k\nmodel:\n  served_model_name: \"x\\n[Service]\"\n",
    "cycle": "extends: cycle\n",
    "oom": "extends: nvfp4-ctx8k\nserver:\n  mem_fraction_static: 0.85\n",
    "notmapping": "- just\n- a list\n",
    "empty": "",
    "replicas-overlap": "extends: nvfp4-ctx8k-dp2\nreplicas: {count: 2, gpus: [[0, 1, 2, 3], [3, 4, 5, 6]]}\n",
    "replicas-too-many": "extends: nvfp4-ctx8k\nreplicas: {count: 4}\n",
}


def bad_input_args(profile_dir, tmp_path, case, command):
    if case in BAD:
        profile_dir.write(case, BAD[case])
    return [command, case] + (["--out", str(tmp_path / "out")] if command == "render" else [])


def assert_refused(code, text, tmp_path, case):
    assert code == 2, text
    assert "Traceback" not in text
    if case in BAD:
        assert f"{case}.yaml" in text
    assert not (tmp_path / "out").exists(), "nothing is written for a bad profile"


@pytest.mark.parametrize("case", sorted(BAD) + ["does-not-exist", "../etc/passwd"])
@pytest.mark.parametrize("command", ["validate", "render"])
def test_bad_input_exits_2_with_a_message_and_no_traceback(profile_dir, tmp_path, capsys, case, command):
    """The command's own entry point, in this process: any exception escaping it would be the user's
    traceback, so the call must return 2 with the message (the process itself: the test below)."""
    code = main(bad_input_args(profile_dir, tmp_path, case, command))
    out = capsys.readouterr()
    assert_refused(code, out.err + out.out, tmp_path, case)


@pytest.mark.parametrize("command,case", [("validate", "malformed"), ("render", "inject"), ("render", "does-not-exist")])
def test_bad_input_through_the_process_exits_2(profile_dir, tmp_path, command, case):
    """The same refusal as `python -m dsv4deploy` gives it: exit status, stderr, no traceback."""
    out = run(*bad_input_args(profile_dir, tmp_path, case, command))
    assert_refused(out.returncode, out.stderr + out.stdout, tmp_path, case)


def test_render_writes_unit_env_manifest_and_argv(tmp_path):
    out = run("render", "nvfp4-ctx8k", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    unit = tmp_path / "etc/systemd/system/sglang.service"
    assert unit.is_file() and (tmp_path / "etc/dsv4deploy/sglang/nccl.env").is_file()
    manifest = json.loads((tmp_path / "etc/dsv4deploy/sglang/manifest.json").read_text())
    assert manifest["profile"] == "nvfp4-ctx8k" and manifest["sglang_version"] == "0.5.23"
    assert json.loads((tmp_path / "argv.json").read_text()) == manifest["argv"]


def test_validate_shows_the_replicas_and_their_endpoint():
    out = run("validate", "nvfp4-ctx8k-dp2")
    assert out.returncode == 0, out.stderr
    assert "nvfp4-ctx8k-dp2: valid" in out.stdout and "(each replica's GPUs)" in out.stdout
    for row in ("sglang@0", "0,1,2,3", "http://127.0.0.1:30001", "sglang@1", "4,5,6,7", "http://127.0.0.1:30002"):
        assert row in out.stdout, row
    doc = json.loads(run("validate", "nvfp4-ctx8k-dp2", "--json").stdout)
    assert [r["gpus"] for r in doc["replicas"]["replicas"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert doc["replicas"]["gateway"]["port"] == 30000


def test_render_writes_the_template_each_replicas_files_and_the_gateway(tmp_path):
    out = run("render", "nvfp4-ctx8k-dp2", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    for path in ("etc/systemd/system/sglang@.service", "etc/systemd/system/sglang-gateway.service",
                 "etc/dsv4deploy/sglang/replica-0.env", "etc/dsv4deploy/sglang/replica-1.env",
                 "etc/dsv4deploy/sglang/nccl-0.env", "etc/dsv4deploy/sglang/nccl-1.env"):
        assert (tmp_path / path).is_file(), path
    assert not (tmp_path / "etc/systemd/system/sglang.service").exists()
    argvs = json.loads((tmp_path / "argv-replicas.json").read_text())
    assert sorted(argvs) == ["sglang-gateway.service", "sglang@0.service", "sglang@1.service"]
    assert json.loads((tmp_path / "argv.json").read_text()) == argvs["sglang@0.service"]
    launcher = argvs["sglang-gateway.service"][1]
    assert (tmp_path / launcher.lstrip("/")).is_file()
