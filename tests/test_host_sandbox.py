"""dsv4deploy/host/sandbox.py and the steps that use it: root never runs a program from a venv.
The weights download (with the venv's `hf`), the verification and the launch check each run as
a transient unit with the rendered server unit's sandbox, as an unprivileged account, with only
the differences USES states: the download reaches the hub and writes the checkpoint folder, the
verify has no network, the launch check has no network and the server's account. The HF token
and SGLang's key config reach them as credentials, never argv."""

from __future__ import annotations

import importlib
import re
import shlex

import pytest

from checkout import load_profile, settings
from dsv4deploy.host import sandbox
from dsv4deploy.release.rollout import rollout_for
from dsv4deploy.render.layout import FETCH_USER, OPT
from dsv4deploy.render.unit import render
from dsv4deploy.tasks.venv import launch_check_command
from dsv4deploy.weights.source import HubCheckpoint

weights = importlib.import_module("dsv4deploy.tasks.weights")
UNIT = render(load_profile("nvfp4-ctx8k")).unit
VENV_PROGRAM = re.compile(rf"^{re.escape(OPT)}/venvs/[^/]+/bin/")


SEPARATORS = {";", "&&", "||", "|", "then", "else", "fi", "do", "done", "{", "}", ">&", "("}


def words_of(cmd: str) -> list[str]:
    """CMD as the shell splits it, its operators (;, &&, |, ...) words of their own."""
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def runs(cmd: str) -> list[tuple[list[str], list[str]]]:
    """(--property= values, argv after `--`) of every systemd-run in the shell line CMD."""
    words = words_of(cmd)
    found = []
    for i in (i for i, w in enumerate(words) if w == "systemd-run"):
        cut = words.index("--", i)
        props = [w.removeprefix("--property=") for w in words[i:cut] if w.startswith("--property=")]
        end = next((j for j in range(cut + 1, len(words)) if words[j] in SEPARATORS), len(words))
        found.append((props, words[cut + 1:end]))
    return found


def venv_programs_root_runs(cmd: str) -> list[str]:
    """The venv programs (python, hf) the shell line CMD starts as root: as a command of its own,
    or as a systemd-run's command without a User= other than root."""
    words = words_of(cmd)
    started = [i for i, w in enumerate(words) if VENV_PROGRAM.match(w) and (i == 0 or words[i - 1] in SEPARATORS)]
    for i in (i for i, w in enumerate(words) if w == "systemd-run"):
        cut = words.index("--", i)
        users = [w.split("=", 2)[2] for w in words[i:cut] if w.startswith("--property=User=")]
        if VENV_PROGRAM.match(words[cut + 1]) and (not users or users[-1] in ("root", "0")):
            started.append(cut + 1)
    return [words[i] for i in sorted(started)]


def download_command(token_file: str = "/etc/dsv4deploy/secrets/hf-token") -> str:
    gen = weights.hf_checkpoint._inner(path="/srv/dsv4deploy/models/r/c",
                                       hub=HubCheckpoint("r", "c" * 40, "https://hub.example"),
                                       expected='{"files": {}}', hf=f"{OPT}/venvs/v/bin/hf", token_file=token_file,
                                       unit=UNIT)
    return " ; ".join(str(c) for c in gen)


def verify_command() -> str:
    gen = weights.verified_checkpoint._inner(path="/srv/dsv4deploy/models/r/c", expected='{"files": {}}',
                                             source="the hub", unit=UNIT)
    return " ; ".join(str(c) for c in gen)


def test_the_download_runs_as_the_fetch_account_with_network_and_writes_only_the_checkpoint():
    cmd = download_command()
    (with_token, token_props), (without, plain_props) = [(argv, props) for props, argv in runs(cmd)]
    assert with_token == without and with_token[:3] == ["python3", "-I", "-S"]       # weights/fetch.py, stdlib only
    assert with_token[with_token.index("--hf") + 1] == f"{OPT}/venvs/v/bin/hf"     # hf runs inside it, as it
    for props in (token_props, plain_props):
        assert f"User={FETCH_USER}" in props and "User=sglang" not in props
        assert "ReadWritePaths=/srv/dsv4deploy/models/r/c" in props and "ProtectSystem=strict" in props
        assert not any(p.startswith(("IPAddressDeny", "IPAddressAllow", "DeviceAllow")) for p in props)
        assert "UMask=0022" in props and "UMask=0027" not in props                  # the server reads what it writes
        assert "NoNewPrivileges=yes" in props and "CapabilityBoundingSet=" in props
    # the token: a credential from the root-only file when there is one, never a value in the command
    assert "LoadCredential=hf-token:/etc/dsv4deploy/secrets/hf-token" in token_props
    assert not any(p.startswith("LoadCredential") for p in plain_props)
    assert "HF_TOKEN" not in cmd.replace("HF_TOKEN_PATH", "")
    # root's own part: the folder is the fetch account's, nothing of the venv runs
    assert f"chown -h {FETCH_USER}:{FETCH_USER}" in cmd and venv_programs_root_runs(cmd) == []


def test_the_verify_runs_as_the_fetch_account_without_network():
    (props, argv), = runs(verify_command())
    assert argv[:3] == ["python3", "-I", "-S"] and "--write-marker" in argv and "--remove-bad" in argv
    assert f"User={FETCH_USER}" in props and "PrivateNetwork=yes" in props and "IPAddressDeny=any" in props
    assert "ReadWritePaths=/srv/dsv4deploy/models/r/c" in props
    assert not any(p.startswith("DeviceAllow") for p in props)


@pytest.mark.parametrize("profile", ["nvfp4-ctx8k", "nvfp4-ctx8k-dp2", "nvfp4-ctx8k-sglang0513post1"])
def test_the_launch_check_runs_as_the_server_account_in_its_sandbox_without_network(profile):
    r = rollout_for({"weights_source": {"type": "hf"}, "profile": profile, "settings": settings()})
    cmd = launch_check_command(r)
    (props, argv), = runs(cmd)
    assert argv[0] == r.layout.python and VENV_PROGRAM.match(argv[0])
    assert "User=sglang" in props and "PrivateNetwork=yes" in props and "PrivateTmp=yes" in props
    assert "ProtectSystem=strict" in props and "IPAddressDeny=any" in props    # the venv read-only, as the server's
    assert "--setenv=HOME=/tmp" in shlex.split(cmd)
    assert venv_programs_root_runs(cmd) == []
    # it may write the parser table's folder of the venv (the service account's) and nothing else of it
    assert [p for p in props if p.startswith("ReadWritePaths=")] == [f"ReadWritePaths={r.layout.venv}/dsv4deploy-parser"]
    if r.data["server"].get("api_key"):
        # SGLang's key config: a credential of the check's unit, read where that unit gets it
        assert f"LoadCredential=sglang-config.yaml:{r.layout.sglang_config_secret}" in props
        assert "${CREDENTIALS_DIRECTORY}/sglang-config.yaml" in argv                  # systemd's, at exec time
        assert r.layout.sglang_config_secret not in argv


def test_a_dollar_reaches_the_program_as_written():
    """systemd expands $NAME and ${NAME} in a transient unit's command line at exec time."""
    (_props, argv), = runs(sandbox.command(["/bin/echo", "a$HOME", "${X}", "${CREDENTIALS_DIRECTORY}/k"], UNIT, "verify"))
    assert argv == ["/bin/echo", "a$$HOME", "$${X}", "${CREDENTIALS_DIRECTORY}/k"]


def test_the_check_for_root_run_venv_programs_can_fail():
    """What the tests above rely on sees a venv program root starts itself."""
    assert venv_programs_root_runs(f"cd /x && {OPT}/venvs/v/bin/python -I -m m") == [f"{OPT}/venvs/v/bin/python"]
    as_root = sandbox.command([f"{OPT}/venvs/v/bin/hf"], UNIT.replace("User=sglang", "User=root"), "launch check")
    assert venv_programs_root_runs(as_root) == [f"{OPT}/venvs/v/bin/hf"]


def test_the_gates_module_probe_runs_the_venvs_python_as_the_gate_account():
    """The venv's python runs its site-packages' .pth files at start: the probe drops root first."""
    from dsv4deploy.gate.runner import probe_command
    from dsv4deploy.render.layout import GATE_USER
    words = shlex.split(probe_command(f"{OPT}/venvs/v/bin/python", GATE_USER))
    assert words[:2] == ["setpriv", f"--reuid={GATE_USER}"] and "--no-new-privs" in words
    assert words[words.index("--") + 1] == f"{OPT}/venvs/v/bin/python"
