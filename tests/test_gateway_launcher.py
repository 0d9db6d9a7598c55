"""The gateway launcher: the inference key and the control-plane key come only from their systemd
credentials, reach smg in-process as two keys, and bad input is one line on stderr with exit 2
(it runs in the gateway's venv, stdlib only)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsv4deploy.gateway import launcher as gl

LAUNCHER = Path(gl.__file__)
KEY = "sk-launcher-test-0123456789"
CONTROL = "sk-launcher-control-9876543210"
BOTH = ["--key-credential", "gateway-api-key", "--control-credential", "gateway-control-key"]


@pytest.mark.parametrize("argv", [
    [], ["--port", "1"], ["--key-credential", "k", "--port", "1"], ["--key-credential", "k"],
    ["--key-credential", "../k", "--"], ["--key-credential", "a/b", "--"], ["--key-credential", "", "--"],
    ["--key-credential", "k", "--"],                                   # the control-plane key's credential missing
    ["--key-credential", "k", "--control-credential", "../c", "--"],
    ["--key-credential", "k", "--control-credential", "k", "--"],      # one file for both powers
])
def test_malformed_command_lines_are_refused(argv):
    with pytest.raises(ValueError):
        gl.split_argv(argv)


@pytest.mark.parametrize("flag", ["--api-key", "--api-key=sk-x", "--control-plane-api-keys", "--tenant-api-key=t:k"])
def test_a_key_on_the_command_line_is_refused(flag):
    with pytest.raises(ValueError, match="cmdline"):
        gl.split_argv(["--key-credential", "k", "--control-credential", "c", "--", "--port", "30000", flag, "x"])


def test_the_key_is_read_stripped_from_the_credentials_folder(tmp_path):
    (tmp_path / "k").write_text(KEY + "\n")
    assert gl.read_key("k", {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == KEY


@pytest.mark.parametrize("content", ["", "\n", "two\nlines\n", "has space\n", "x" * 5000])
def test_an_unusable_credential_is_refused(tmp_path, content):
    (tmp_path / "k").write_text(content)
    with pytest.raises(ValueError, match="credential k"):
        gl.read_key("k", {"CREDENTIALS_DIRECTORY": str(tmp_path)})


def test_no_credentials_folder_or_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="CREDENTIALS_DIRECTORY"):
        gl.read_key("k", {})
    with pytest.raises(ValueError, match="credential k"):
        gl.read_key("k", {"CREDENTIALS_DIRECTORY": str(tmp_path)})


def _run(tmp_path, argv, creds: str | None, fake_smg: bool = True):
    """The launcher as the unit runs it (a plain python, no dsv4deploy on the path), with a stand-in
    `smg` package that records what launch_router receives."""
    site = tmp_path / "site"
    record = tmp_path / "record.json"
    if fake_smg:
        (site / "smg").mkdir(parents=True)
        (site / "smg" / "__init__.py").write_text("")
        (site / "smg" / "launch_router.py").write_text(textwrap.dedent(f"""
            import json, types
            def parse_router_args(flags):
                return types.SimpleNamespace(flags=list(flags), api_key=None, control_plane_api_keys=[])
            def launch_router(args):
                open({str(record)!r}, "w").write(json.dumps(vars(args)))
        """))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    if creds is not None:
        env["CREDENTIALS_DIRECTORY"] = creds
    proc = subprocess.run([sys.executable, "-S", str(LAUNCHER), *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    got = json.loads(record.read_text()) if record.exists() else None
    return proc, got


def test_the_key_reaches_smg_in_process_and_the_flags_pass_unchanged(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "gateway-api-key").write_text(KEY + "\n")
    (creds / "gateway-control-key").write_text(CONTROL + "\n")
    flags = ["--worker-urls", "http://127.0.0.1:30001", "--port", "30000"]
    proc, got = _run(tmp_path, [*BOTH, "--", *flags], str(creds))
    assert proc.returncode == 0, proc.stderr
    # the inference key is smg's data-plane key; /workers takes only the control-plane key
    assert got == {"flags": flags, "api_key": KEY,
                   "control_plane_api_keys": [["dsv4deploy", "dsv4deploy", CONTROL, "admin"]]}


def test_one_key_in_both_credentials_is_refused(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "gateway-api-key").write_text(KEY + "\n")
    (creds / "gateway-control-key").write_text(KEY + "\n")
    proc, got = _run(tmp_path, [*BOTH, "--", "--port", "30000"], str(creds))
    assert proc.returncode == 2 and got is None
    assert "same key" in proc.stderr and KEY not in proc.stderr


def test_without_a_key_credential_smg_gets_no_key(tmp_path):
    proc, got = _run(tmp_path, ["--", "--port", "30000"], None)
    assert proc.returncode == 0, proc.stderr
    assert got == {"flags": ["--port", "30000"], "api_key": None, "control_plane_api_keys": []}


def test_a_missing_credential_stops_before_smg_with_one_line_and_exit_2(tmp_path):
    proc, got = _run(tmp_path, [*BOTH, "--", "--port", "30000"], str(tmp_path))
    assert proc.returncode == 2 and got is None
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("dsv4deploy-gateway-launch: credential gateway-api-key:")
