"""NCCL probe without a GPU: the environment ranks get, the hard timeout, the reports.

The ranks here run in dry mode (they dump their environment; no torch) or are fake programs;
the real probe ran on 2x H200 and its output is in tests/fixtures/nccl/ (docs/preflight.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dsv4deploy.sglang.flags import MANAGED_ENV
from dsv4deploy.render.layout import Layout
from dsv4deploy.render.nccl import LOOPBACK_SOCKETS, NO_CONF_FILE, PRESETS, nccl_environment, render_env_file
from dsv4deploy.preflight import (HANG_HINT, busbw, format_compare, format_groups, format_result, launch,
                                  probe_argv, rank_environment, read_env_file)
from dsv4deploy.preflight import nccl_probe as P
from dsv4deploy.preflight.cli import main
from checkout import load_profile

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "nccl"


@pytest.fixture(autouse=True)
def probe_folders_in_tmp_path(tmp_path, monkeypatch):
    """A failed probe keeps its folder (/tmp/nccl-probe-*: the ranks' logs, on purpose): these
    tests fail probes on purpose, so their folders go where pytest cleans up, not into /tmp."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
SLACK_S = 5.0
BASE = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root",
        "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "WARN", "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def rank_envs(res: dict) -> list[dict]:
    return [r["report"]["env"] for r in res["ranks"]]


def assert_gone(res: dict) -> None:
    """No process of any rank's group is left, by /proc scan and by pid."""
    groups = {r["pid"] for r in res["ranks"]}
    assert P.group_members(groups) == []
    for pid in groups:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# --- environment ------------------------------------------------------------------------------

def test_env_file_read_as_systemd_reads_it():
    rendered = render_env_file(nccl_environment("nop2p", {"NCCL_SOCKET_IFNAME": "lo"}), "NCCL preset nop2p")
    assert read_env_file(rendered) == {"NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "16", "NCCL_CONF_FILE": "/dev/null",
                                       "NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}
    text = textwrap.dedent("""\
        # comment
        ; also a comment

        A=1
          B = two words
        C="quoted \\"x\\" $y"
        D='single # not a comment'
        E=con\\
        tinued
        """)
    assert read_env_file(text) == {"A": "1", "B": "two words", "C": 'quoted "x" $y',
                                   "D": "single # not a comment", "E": "continued"}
    with pytest.raises(ValueError):
        read_env_file("not an assignment\n")


def test_rank_environment_order_and_inheritance():
    env, note = rank_environment(BASE, {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO"},
                                 unit_env={"NCCL_PROTO": "Simple", "SGLANG_X": "1"})
    nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    # inherited NCCL_* dropped (a unit does not inherit the shell), NVLS kept; env file wins
    assert nccl == {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0"}
    assert env["SGLANG_X"] == "1" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert note == {"stripped_inherited": ["NCCL_DEBUG", "NCCL_P2P_DISABLE"],
                    "kept_inherited": {"NCCL_NVLS_ENABLE": "0"}}
    env, note = rank_environment(BASE, {"NCCL_NVLS_ENABLE": "1"})
    assert env["NCCL_NVLS_ENABLE"] == "1" and note["kept_inherited"] == {}


LOGIN = {**BASE, "PYTHONPATH": "/home/op/lib", "LD_PRELOAD": "/home/op/hook.so", "CUDA_VISIBLE_DEVICES": "3",
         "LANG": "C.UTF-8", "USER": "root", "SSH_CONNECTION": "10.0.0.1 22 10.0.0.2 51000"}


def test_as_a_service_a_rank_starts_from_what_systemd_gives_the_unit():
    """The deploy's probe runs in an SSH login as the service's user: what that login sets
    (PYTHONPATH, LD_PRELOAD, a CUDA_VISIBLE_DEVICES) never reaches the unit's server, so it
    must not reach the ranks that stand in for it; the unit's own Environment= does."""
    env, note = rank_environment(LOGIN, {"NCCL_PROTO": "LL"}, unit_env={"PATH": "/unit/bin", "PYTHONPATH": "/srv/x"},
                                 service_user="sglang")
    assert env == {"PATH": "/unit/bin", "HOME": "/root", "LANG": "C.UTF-8", "USER": "sglang", "LOGNAME": "sglang",
                   "NCCL_NVLS_ENABLE": "0", "NCCL_PROTO": "LL", "PYTHONPATH": "/srv/x"}
    assert note["dropped_inherited"] == ["CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "PATH", "PYTHONPATH", "SSH_CONNECTION",
                                         "TORCH_SYMM_MEM_DISABLE_MULTICAST", "USER"]
    assert note["stripped_inherited"] == ["NCCL_DEBUG", "NCCL_P2P_DISABLE"]
    env, _ = rank_environment(LOGIN, {}, service_user="sglang")
    assert env["PATH"] == P.SERVICE_PATH and "PYTHONPATH" not in env            # systemd's PATH for a unit
    env, note = rank_environment(LOGIN, {})                                      # by hand: the login's, as before
    assert env["PYTHONPATH"] == "/home/op/lib" and "dropped_inherited" not in note


def test_the_deploys_probe_runs_apart_from_the_logins_python_settings(tmp_path):
    """The deploy's argv (probe_argv) on a login whose PYTHONPATH holds a json.py and a
    sitecustomize.py: the launcher runs isolated and the ranks never see that folder; they get
    the unit's PATH and run as the user they are."""
    import pwd
    planted = tmp_path / "login-lib"
    planted.mkdir()
    (planted / "json.py").write_text("raise SystemExit('the login json.py was imported')\n")
    (planted / "sitecustomize.py").write_text("import os; os.environ['DSV4_PLANTED'] = 'yes'\n")
    script = tmp_path / "nccl_probe.py"
    script.write_text(Path(P.__file__).read_text())
    data = load_profile("nvfp4-ctx8k").data
    argv = probe_argv(data, script=str(script), python=sys.executable, nranks=2, timeout_s=30)
    login = {**os.environ, "PYTHONPATH": str(planted), "LD_PRELOAD": "", "CUDA_VISIBLE_DEVICES": "7"}
    proc = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, cwd=tmp_path, env=login, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and {"PYTHONPATH", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES"} <= set(doc["dropped_inherited"])
    for env in rank_envs(doc):
        assert "PYTHONPATH" not in env and "LD_PRELOAD" not in env and "DSV4_PLANTED" not in env
        assert "CUDA_VISIBLE_DEVICES" not in env and env["PATH"] == MANAGED_ENV["PATH"]
        assert env["USER"] == env["LOGNAME"] == pwd.getpwuid(os.getuid()).pw_name


def test_ranks_get_exactly_the_profiles_environment(profile_dir):
    profile_dir.write("envtest", """
        extends: nvfp4-ctx8k
        server: {env: {SGLANG_ENABLE_X: true, CUDA_DEVICE_MAX_CONNECTIONS: 8}}
        nccl: {preset: p2p, overrides: {NCCL_MIN_NCHANNELS: 4, NCCL_SOCKET_IFNAME: lo}}
        """)
    data = load_profile("envtest").data
    from dsv4deploy.preflight import profile_nccl_env, unit_environment
    res = launch(3, profile_nccl_env(data), P.ProbeSettings(BASE, unit_env=unit_environment(data), dry_run=True,
                                                           timeout_s=20))
    assert res["ok"], res["error"]
    envs = rank_envs(res)
    for r, env in enumerate(envs):
        assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {
            "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "4", "NCCL_NVLS_ENABLE": "0",
            "NCCL_P2P_LEVEL": "SYS", "NCCL_SOCKET_IFNAME": "lo", "NCCL_CONF_FILE": "/dev/null"}
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(r), str(r), "3")
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == envs[0]["MASTER_PORT"]
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert res["stripped_inherited"] == ["NCCL_DEBUG", "NCCL_P2P_DISABLE"]
    assert "SGLANG_ENABLE_X" in res["unit_env"] and res["unit_env"]["SGLANG_ENABLE_X"] == "1"
    assert_gone(res)


def test_cli_env_file_reaches_ranks_unchanged(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")            # the operator's shell: must not leak
    env_file = tmp_path / "nccl.env"
    env_file.write_text(render_env_file(nccl_environment("nop2p"), "NCCL preset nop2p"))
    assert main(["nccl", "--env-file", str(env_file), "--nranks", "2", "--dry-run", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["label"] == "nccl.env" and "NCCL_ALGO" in res["stripped_inherited"]
    for env in rank_envs(res):
        got = {k: v for k, v in env.items() if k.startswith("NCCL_") and k != "NCCL_NVLS_ENABLE"}
        assert got == read_env_file(env_file.read_text()) == {**PRESETS["nop2p"], **NO_CONF_FILE}


def test_cli_profile_dry_run_and_compare_presets(capsys):
    assert main(["nccl", "--profile", "nvfp4-tp8-nop2p", "--dry-run", "--json", "--nranks", "2"]) == 0
    res = json.loads(capsys.readouterr().out)
    # one host: the rendered file's loopback sockets too, so the probe runs as the unit's server would
    assert res["label"] == "nop2p" and res["nccl_env"] == {**PRESETS["nop2p"], **LOOPBACK_SOCKETS, **NO_CONF_FILE}
    assert res["nranks"] == 2
    assert main(["nccl", "--profile", "nvfp4-ctx8k", "--dry-run", "--json", "--nranks", "2",
                 "--compare-presets"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in doc["runs"]] == list(PRESETS) and doc["preset"] == "ll-ring" and doc["ok"]
    for run in doc["runs"]:
        for env in rank_envs(run):
            assert env["NCCL_IB_DISABLE"] == "1"
            assert {k for k in env if k.startswith("NCCL_")} - {"NCCL_NVLS_ENABLE"} == \
                set(PRESETS[run["label"]]) | {"NCCL_SOCKET_IFNAME", "NCCL_CONF_FILE"}
            assert env["NCCL_SOCKET_IFNAME"] == "lo"


# --- the hard timeout -------------------------------------------------------------------------

@pytest.mark.slow
def test_hang_ends_in_bound_with_the_p2p_hint_and_no_process_left():
    t0 = time.monotonic()
    res = launch(3, PRESETS["ll-ring"], P.ProbeSettings(BASE, dry_run=True, timeout_s=2), hang_rank=1)
    took = time.monotonic() - t0
    assert took < 2 + SLACK_S, took
    assert not res["ok"] and res["error"]["kind"] == "timeout"
    msg = res["error"]["message"]
    assert "did not finish within 2 s" in msg and "rank 1 stuck at 'hang'" in msg
    assert "nop2p" in msg and "IOMMU" in msg and "none is left" in msg and HANG_HINT in msg
    assert res["leftover"] == []
    assert [r["returncode"] for r in res["ranks"]][0] == 0 and res["ranks"][1]["returncode"] < 0
    assert_gone(res)                    # the hanging rank's child (same group) is gone too


FAKE_STUBBORN = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)           # only SIGKILL ends it
subprocess.Popen([sys.executable, "-c",
                  "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
time.sleep(3600)
"""

FAKE_ONE_FAILS = """\
import os, sys, time
if os.environ["RANK"] == "1":
    print("ncclInternalError: simulated failure at init", flush=True)
    sys.exit(3)
time.sleep(3600)                                         # the others wait in the collective
"""


@pytest.mark.slow
def test_fake_rank_that_ignores_sigterm_is_killed(tmp_path):
    prog = tmp_path / "stubborn.py"
    prog.write_text(FAKE_STUBBORN)
    t0 = time.monotonic()
    res = launch(2, {}, P.ProbeSettings(BASE, program=str(prog), timeout_s=2))
    took = time.monotonic() - t0
    assert took < 2 + SLACK_S, took
    assert res["error"]["kind"] == "timeout" and res["leftover"] == []
    assert {r["returncode"] for r in res["ranks"]} == {-9}
    assert_gone(res)


@pytest.mark.slow
def test_a_failing_rank_stops_the_others_early(tmp_path):
    prog = tmp_path / "fails.py"
    prog.write_text(FAKE_ONE_FAILS)
    t0 = time.monotonic()
    res = launch(3, {}, P.ProbeSettings(BASE, program=str(prog), timeout_s=60))
    took = time.monotonic() - t0
    assert took < P.FAIL_GRACE_S + SLACK_S, took
    assert res["error"]["kind"] == "rank-failed"
    assert "rank 1 exited with status 3" in res["error"]["message"]
    assert "simulated failure" in res["error"]["message"]
    assert_gone(res)


@pytest.mark.slow
def test_cli_timeout_exit_status_and_text(capsys):
    t0 = time.monotonic()
    rc = main(["nccl", "--profile", "mxfp4-tp2-cookbook", "--dry-run", "--hang-rank", "0", "--timeout", "1.5"])
    assert rc == 1 and time.monotonic() - t0 < 1.5 + SLACK_S
    out = capsys.readouterr().out
    assert "FAILED (timeout): NCCL probe did not finish within 1.5 s (rank 0 stuck at 'hang'" in out


def test_standalone_script_needs_no_dsv4deploy(tmp_path):
    """The probe file alone, run in isolated mode from elsewhere (as on the GPU host)."""
    script = tmp_path / "probe.py"
    script.write_text(Path(P.__file__).read_text())
    env_file = tmp_path / "nccl.env"
    env_file.write_text("NCCL_PROTO=LL\nNCCL_ALGO=Ring\n")
    proc = subprocess.run([sys.executable, "-I", str(script), "launch", "--nranks", "2", "--dry-run",
                           "--json", "--env-file", str(env_file), "--nccl", "NCCL_IB_DISABLE=1"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["nccl_env"] == {"NCCL_ALGO": "Ring", "NCCL_IB_DISABLE": "1", "NCCL_PROTO": "LL"}
    bad = subprocess.run([sys.executable, "-I", str(script), "launch", "--nranks", "2", "--sizes", "8Q"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert bad.returncode == 2 and "not a size" in bad.stderr


@pytest.mark.parametrize("args, words", [
    (["--profile", "nvfp4-ctx8k", "--compare-presets", "--env-file", "/etc/x"], "not --env-file"),
    (["--profile", "nvfp4-ctx8k", "--hang-rank", "4"], "--hang-rank must be in 0..3"),
    (["--profile", "nvfp4-ctx8k", "--sizes", "8K", "lots"], "not a size"),
    (["--profile", "nvfp4-ctx8k", "--timeout", "0"], "must be positive"),
    (["--profile", "nope"], "no profile named 'nope'"),
    (["--env-file", "/nonexistent/nccl.env", "--nranks", "2"], "No such file"),
    ([], "give --profile"),
])
def test_cli_bad_input_exits_2(args, words, capsys):
    assert main(["nccl", "--dry-run", *args]) == 2
    assert words in capsys.readouterr().err


def test_too_few_visible_gpus_fails_before_spawning(tmp_path, capsys):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, GPU-a, 9.0, 143771, 0, 580.159.04, Disabled'\n")
    smi.chmod(0o755)
    assert main(["nccl", "--profile", "nvfp4-ctx8k", "--nvidia-smi", str(smi)]) == 1
    assert "4 ranks need 4 GPUs; 1 visible (use --nranks to probe fewer)" in capsys.readouterr().err


# --- sizes, formulas and reports from the recorded H200 run -----------------------------------

def test_sizes_and_busbw_formula():
    assert P.parse_sizes(["8K,64M", "1MiB 4096"]) == [8192, 64 << 20, 1 << 20, 4096]
    assert P.DEFAULT_SIZES[0] == 8 << 10 and P.DEFAULT_SIZES[-1] == 64 << 20
    algbw, bus = busbw(64 << 20, 1e-3, 8)
    assert algbw == pytest.approx(67.108864) and bus == pytest.approx(algbw * 14 / 8)
    assert busbw(1 << 20, 1e-3, 2)[1] == busbw(1 << 20, 1e-3, 2)[0]          # n=2: factor 1


@pytest.mark.parametrize("name", ["h200x2-compare.json", "h200x2-compare-run1.json", "h200x2-compare-run3.json"])
def test_recorded_compare_run(name):
    doc = json.loads((FIX / name).read_text())
    assert doc["ok"] and doc["preset"] == "ll-ring"
    assert [r["label"] for r in doc["runs"]] == ["ll-ring", "p2p", "nop2p"]
    for run in doc["runs"]:
        assert run["ok"] and run["nranks"] == 2 and run["leftover"] == []
        assert run["system"]["gpus"] == ["NVIDIA H200", "NVIDIA H200"]
        assert run["kept_inherited"]["NCCL_NVLS_ENABLE"] == "0"
        assert [x["bytes"] for x in run["results"]] == list(P.DEFAULT_SIZES)
        for x in run["results"]:
            assert x["correct"]
            if "trials_us" in x:            # run 2: median of P.TRIALS loops
                assert len(x["trials_us"]) == P.TRIALS and x["latency_us"] == sorted(x["trials_us"])[1]
            algbw, bus = busbw(x["bytes"], x["latency_us"] / 1e6, run["nranks"])
            assert x["algbw_gbps"] == pytest.approx(algbw, rel=2e-3)
            assert x["busbw_gbps"] == pytest.approx(bus, rel=2e-3)
        # each rank really had the preset's variables
        for r in run["ranks"]:
            env = r["report"]["env"]
            assert all(env[k] == v for k, v in PRESETS[run["label"]].items())
    by = {r["label"]: r for r in doc["runs"]}
    assert by["nop2p"]["transports"] == ["SHM/direct/direct"]          # P2P really off
    assert by["p2p"]["transports"] == ["P2P/CUMEM"]
    # the table printed on the H200s is what format_compare renders from the same data today
    assert format_compare(doc["runs"]) == doc["summary"]


def test_recorded_hang_run():
    res = json.loads((FIX / "h200x2-hang.json").read_text())
    assert res["error"]["kind"] == "timeout" and res["timeout_s"] == 20 and res["leftover"] == []
    assert res["elapsed_s"] < res["timeout_s"] + SLACK_S
    assert [r["phase"] for r in res["ranks"]] == ["init", "hang"]
    text = (FIX / "h200x2-hang.txt").read_text()
    assert "timeout=20 rc=1" in text and "after both runs:\nnone\n--- GPU compute processes:\n(end)" in text
    walls = [int(part.split()[0]) for part in text.split("wall_ms=")[1:]]
    assert walls[0] < (20 + SLACK_S) * 1000 and walls[1] < (10 + SLACK_S) * 1000
    sig = (FIX / "h200x2-sigterm.txt").read_text()
    assert sig.count("nccl_probe.py rank") == 2 and "launcher rc=143" in sig
    assert sig.split("--- after:\n")[1].startswith("none\n(end)")
    out = format_result(res)
    assert out.startswith("NCCL all-reduce probe [ll-ring]: 2 ranks, bfloat16\n")
    assert "FAILED (timeout)" in out and "nop2p" in out


def test_format_result_table():
    run = json.loads((FIX / "h200x2-compare.json").read_text())["runs"][1]
    out = format_result(run)
    lines = out.splitlines()
    assert lines[0] == ("NCCL all-reduce probe [p2p]: 2 ranks, bfloat16; torch 2.11.0+cu130, NCCL 2.28.9, "
                        "NVIDIA H200, NVIDIA H200")
    assert lines[2] == "transports: P2P/CUMEM"
    assert lines[3].split() == ["size", "latency", "us", "algbw", "GB/s", "busbw", "GB/s", "sum"]
    assert lines[4].startswith("8 KiB") and lines[-2].startswith("64 MiB") and lines[-1].startswith("OK in")
    assert (FIX / "h200x2-standalone.txt").read_text().splitlines()[-2].startswith("OK in")
    envfile = (FIX / "h200x2-envfile.txt").read_text()
    assert "NCCL all-reduce probe [nccl.env]: 2 ranks" in envfile and envfile.endswith("rc=0\n")


def test_probe_argv_for_the_deploy():
    data = load_profile("nvfp4-ctx8k").data
    argv = probe_argv(data, script="/tmp/nccl_probe.py", env_file="/etc/dsv4deploy/sglang/nccl.env")
    unit = [a for k, v in MANAGED_ENV.items() for a in ("--env", f"{k}={v}")]      # the unit's Environment=
    assert argv == [Layout.of(data).python, "-I", "/tmp/nccl_probe.py",
                    "launch", "--as-service", "--json", "--timeout", "60", "--nranks", "4",
                    "--env-file", "/etc/dsv4deploy/sglang/nccl.env", *unit]
    argv = probe_argv(data, script="p.py", python="py", timeout_s=5, nranks=2)
    assert argv[argv.index("--nccl") + 1] == "GLOO_SOCKET_IFNAME=lo" and argv.count("--nccl") == 6
    assert "NCCL_SOCKET_IFNAME=lo" in argv
    # the argv parses with the probe's own parser
    ns = P.build_parser().parse_args(argv[3:])
    assert ns.nranks == 2 and ns.timeout == 5 and ns.json and ns.as_service


def _procs_running(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace")
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in cmd and state not in ("Z", "X"):
                found.append(int(name))
    return found


@pytest.mark.parametrize("sig, layout", [
    ("SIGTERM", ["--nranks", "2", "--hang-rank", "1"]), ("SIGINT", ["--nranks", "2", "--hang-rank", "1"]),
    ("SIGHUP", ["--groups", "0:1", "--hang-group", "1", "--hang-rank", "0"]),     # two groups at once
])
def test_launcher_stopped_takes_its_ranks_along(tmp_path, sig, layout):
    """An SSH session closing (SIGTERM/SIGHUP) or Ctrl-C must not leave ranks in their own sessions."""
    import signal as S
    script = tmp_path / f"probe_{sig}.py"
    script.write_text(Path(P.__file__).read_text())
    # SIGINT as a terminal delivers it: a suite started in the background (`make test &`) has it
    # ignored, and Python keeps an ignored SIGINT ignored
    proc = subprocess.Popen([sys.executable, "-I", str(script), "launch", *layout, "--dry-run",
                             "--timeout", "60"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: S.signal(S.SIGINT, S.SIG_DFL))
    deadline = time.monotonic() + 10
    while len(_procs_running(str(script))) < 2 and time.monotonic() < deadline:   # launcher + hanging rank
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(getattr(S, sig))
    proc.wait(timeout=30)          # bounded: TERM grace 1.5 s + reap 2.5 s, on a loaded 2-core machine
    assert proc.returncode != 0
    deadline = time.monotonic() + 5
    while _procs_running(str(script)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_running(str(script)) == []


def test_recorded_dry_run_on_the_gpu_host():
    """On the H200 box: ranks got the preset, the machine's multicast guards, nothing else NCCL."""
    res = json.loads((FIX / "h200x2-dry.json").read_text())
    for r, env in enumerate(rank_envs(res)):
        assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {
            **PRESETS["ll-ring"], "NCCL_NVLS_ENABLE": "0", "NCCL_VERSION": "2.28.3-1"}
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == "2"


# --- several GPU groups at once (replicas: DP2 x TP4) -------------------------------------------

def test_parse_groups():
    assert P.parse_groups("0,1,2,3:4,5,6,7") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert P.parse_groups("0-3:4-7") == P.parse_groups(" 0 - 3 : 4,5 , 6-7 ") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert P.parse_groups("1") == [[1]] and P.parse_groups("0:1") == [[0], [1]]
    for text, words in [("0,1:1,2", "GPU 1 is in group 0 and in group 1; the GPU sets must be disjoint"),
                        ("0,0", "GPU 0 is in group 0 twice"), ("0-1:1-0", "'1-0' is not a GPU number or range"),
                        ("0:", "'' is not a GPU number"), ("a", "'a' is not a GPU number"),
                        ("0;1", "'0;1' is not"), ("-1", "'-1' is not")]:
        with pytest.raises(ValueError, match=words):
            P.parse_groups(text)


def test_check_layout():
    P.check_layout(4)
    P.check_layout(None, [[0, 1], [2, 3]], hang_group=1, hang_rank=1)
    P.check_layout(2, [[0, 1], [2, 3]])
    for args, words in [((None,), "give --nranks N or --groups"), ((0,), "must be positive"),
                        ((4, None, 0), "--hang-group needs --groups"),
                        ((4, [[0, 1], [2, 3]]), "--nranks 4 disagrees with --groups"),
                        ((None, [[0, 1], [2, 3]], 2), "--hang-group must be in 0..1"),
                        ((None, [[0, 1], [2]], 1, 1), "--hang-rank must be in 0..0"),
                        ((None, [[0, 1], [2]], None, 2), "--hang-rank must be in 0..1")]:
        with pytest.raises(ValueError, match=words):
            P.check_layout(*args)


def test_groups_get_their_own_gpus_and_ports_then_run_alone():
    doc = P.launch_groups([[0, 1, 2, 3], [4, 5, 6, 7]], PRESETS["ll-ring"],
                          P.ProbeSettings(dict(BASE, CUDA_VISIBLE_DEVICES="9"), dry_run=True, timeout_s=30), "ll-ring")
    assert doc["ok"] and doc["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and doc["together"]["leftover"] == []
    runs = doc["together"]["runs"]
    assert [(r["group"], r["gpus"], r["nranks"]) for r in runs] == [(0, [0, 1, 2, 3], 4), (1, [4, 5, 6, 7], 4)]
    assert [(r["group"], r["gpus"]) for r in doc["alone"]] == [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7])]
    ports = []
    for run in [*runs, *doc["alone"]]:
        envs = rank_envs(run)
        assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [",".join(map(str, run["gpus"]))] * 4  # not "9"
        assert {e["CUDA_DEVICE_ORDER"] for e in envs} == {"PCI_BUS_ID"}
        assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [(str(r), str(r), "4") for r in range(4)]
        assert {e["MASTER_PORT"] for e in envs} == {str(run["master_port"])}
        assert {k: v for k, v in envs[0].items() if k.startswith("NCCL_")} == {**PRESETS["ll-ring"], "NCCL_NVLS_ENABLE": "0"}
        ports.append(run["master_port"])
        assert run["ok"] and "workdir" not in run
        assert_gone(run)
    assert ports[0] != ports[1]                 # the two groups at once rendezvous on their own ports


FAKE_BARRIER = """\
import json, os, sys, time
cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
rank = int(sys.argv[sys.argv.index("--rank") + 1])
top = os.path.dirname(cfg["workdir"])            # the groups' common folder
open(os.path.join(top, "here-g%d-r%d" % (cfg["group"], rank)), "w").close()
while len([n for n in os.listdir(top) if n.startswith("here-")]) < int(os.environ["FAKE_ALL_RANKS"]):
    time.sleep(0.02)                             # every rank of every group must be up at once
with open(os.path.join(cfg["workdir"], "rank%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "ok": True, "results": [], "env": {}}, f)
"""


def test_groups_really_run_at_the_same_time(tmp_path):
    """Each fake rank waits until every rank of every group has started: groups run one after the
    other would never get there and end by the timeout instead."""
    prog = tmp_path / "barrier.py"
    prog.write_text(FAKE_BARRIER)
    specs = [{"nranks": 2, "gpus": [0, 1]}, {"nranks": 1, "gpus": [2]}, {"nranks": 2, "gpus": [3, 4]}]
    out = P.run_groups(specs, {}, P.ProbeSettings(dict(BASE, FAKE_ALL_RANKS="5"), program=str(prog), timeout_s=60))
    assert out["ok"], [r["error"] for r in out["runs"]]
    assert [r["nranks"] for r in out["runs"]] == [2, 1, 2] and out["leftover"] == []
    for run in out["runs"]:
        assert_gone(run)


FAKE_GROUP1_STUBBORN = """\
import json, signal, subprocess, sys, time
cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
if cfg["group"] == 1 and sys.argv[sys.argv.index("--rank") + 1] == "0":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)    # only SIGKILL ends it, and its child
    subprocess.Popen([sys.executable, "-c",
                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
time.sleep(3600)                                     # the others still busy at the deadline
"""


@pytest.mark.slow
def test_a_hang_in_one_group_ends_every_group_and_leaves_nothing(tmp_path):
    prog = tmp_path / "hang.py"
    prog.write_text(FAKE_GROUP1_STUBBORN)
    specs = [{"nranks": 2, "gpus": [0, 1]}, {"nranks": 2, "gpus": [2, 3]}]
    out = P.run_groups(specs, {}, P.ProbeSettings(BASE, program=str(prog), timeout_s=2))
    assert not out["ok"] and out["leftover"] == []
    g0, g1 = out["runs"]
    assert g0["error"]["kind"] == g1["error"]["kind"] == "timeout"
    assert "did not finish within 2 s" in g0["error"]["message"] and "none is left" in g1["error"]["message"]
    assert [r["returncode"] for r in g0["ranks"]] == [-15, -15]       # ended by SIGTERM
    assert [r["returncode"] for r in g1["ranks"]] == [-9, -15]        # the stubborn one by SIGKILL
    for run in out["runs"]:
        assert run["leftover"] == [] and Path(run["workdir"], "config.json").exists()   # kept for a look
        assert_gone(run)


@pytest.mark.slow
def test_dry_hang_in_group_1_fails_it_at_once_and_alone_while_group_0_passes(capsys):
    rc = main(["nccl", "--profile", "nvfp4-ctx8k-dp2", "--dry-run", "--json", "--hang-group", "1",
               "--hang-rank", "2", "--timeout", "1.5"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and not doc["ok"] and doc["profile"] == "nvfp4-ctx8k-dp2"
    g0, g1 = doc["together"]["runs"]
    assert g0["ok"] and g0["hang_rank"] is None and g1["hang_rank"] == 2
    assert g1["error"]["kind"] == "timeout" and "rank 2 stuck at 'hang'" in g1["error"]["message"]
    assert [r["ok"] for r in doc["alone"]] == [True, False]
    assert doc["alone"][1]["error"]["kind"] == "timeout"
    for run in [g0, g1, *doc["alone"]]:
        assert_gone(run)                 # the hanging rank's child (same process group) too


FAKE_ONE_GROUP_FAILS = """\
import json, os, sys, time
cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
rank = int(sys.argv[sys.argv.index("--rank") + 1])
if cfg["group"] == 0:
    time.sleep(0.5)
    with open(os.path.join(cfg["workdir"], "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "ok": True, "results": []}, f)
    sys.exit(0)
if rank == 1:
    print("ncclInternalError: simulated failure at init", flush=True)
    sys.exit(3)
time.sleep(3600)
"""


@pytest.mark.slow
def test_a_failing_rank_ends_its_own_group_only(tmp_path):
    prog = tmp_path / "fails.py"
    prog.write_text(FAKE_ONE_GROUP_FAILS)
    specs = [{"nranks": 2, "gpus": [0, 1]}, {"nranks": 3, "gpus": [2, 3, 4]}]
    out = P.run_groups(specs, {}, P.ProbeSettings(BASE, program=str(prog), timeout_s=60))
    g0, g1 = out["runs"]
    assert g0["ok"] and not out["ok"]
    assert g1["error"]["kind"] == "rank-failed" and "rank 1 exited with status 3" in g1["error"]["message"]
    assert [r["returncode"] for r in g1["ranks"]] == [-15, 3, -15]     # the others were ended, not timed out
    for run in out["runs"]:
        assert_gone(run)


def test_cli_groups_from_the_replicas_profile_and_overrides(capsys):
    assert main(["nccl", "--profile", "nvfp4-ctx8k-dp2", "--dry-run", "--json", "--no-alone"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and doc["alone"] == [] and doc["label"] == "ll-ring"
    assert main(["nccl", "--profile", "nvfp4-ctx8k-dp2", "--dry-run", "--json", "--groups", "0-1:2-3:4-5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["groups"] == [[0, 1], [2, 3], [4, 5]] and len(doc["alone"]) == 3
    assert main(["nccl", "--profile", "nvfp4-ctx8k-dp2", "--dry-run", "--json", "--nranks", "4"]) == 0
    res = json.loads(capsys.readouterr().out)        # one group of 4, the classic probe
    assert "groups" not in res and res["nranks"] == 4 and "gpus" not in res
    assert main(["nccl", "--profile", "nvfp4-ctx8k", "--dry-run", "--groups", "0,1:2,3", "--compare-presets"]) == 0
    out = capsys.readouterr().out
    for preset in PRESETS:
        assert (f"NCCL all-reduce [{preset}], 2 groups at once (g0 GPUs 0,1; g1 GPUs 2,3), each also alone"
                in out)
    assert "g0 alone GB/s" in out and out.count("at once: OK in") == 3 and out.endswith("profile preset ll-ring: OK\n")


@pytest.mark.parametrize("args, words", [
    (["--groups", "0,1:1,2"], "GPU 1 is in group 0 and in group 1"),
    (["--groups", "0-3:x"], "'x' is not a GPU number or range"),
    (["--groups", "0,1:2,3", "--nranks", "4"], "--nranks 4 disagrees with --groups"),
    (["--groups", "0:1", "--hang-group", "2", "--hang-rank", "0"], "--hang-group must be in 0..1"),
    (["--groups", "0,1:2", "--hang-group", "1", "--hang-rank", "1"], "--hang-rank must be in 0..0"),
    (["--hang-group", "0", "--hang-rank", "0", "--nranks", "2"], "--hang-group needs --groups"),
])
def test_cli_bad_groups_exit_2(args, words, capsys):
    assert main(["nccl", "--profile", "nvfp4-ctx8k-dp2", "--dry-run", *args]) == 2
    assert words in capsys.readouterr().err


def test_groups_beyond_the_hosts_gpus_fail_before_spawning(tmp_path, capsys):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor i in 0 1; do echo \"$i, NVIDIA H200, GPU-$i, 9.0, 143771, 0, 580.159.04, Disabled\"; done\n")
    smi.chmod(0o755)
    assert main(["nccl", "--profile", "nvfp4-ctx8k-dp2", "--nvidia-smi", str(smi)]) == 1
    assert ("GPU 2, 3, 4, 5, 6, 7 of --groups 0,1,2,3:4,5,6,7 do not exist here: nvidia-smi shows GPUs 0-1"
            in capsys.readouterr().err)


def test_probe_argv_for_a_replicas_profile():
    data = load_profile("nvfp4-ctx8k-dp2").data
    argv = probe_argv(data, script="p.py", python="py", env_file="/e/nccl.env")
    assert argv[:11] == ["py", "-I", "p.py", "launch", "--as-service", "--json", "--timeout", "60",
                         "--groups", "0,1,2,3:4,5,6,7", "--env-file"]
    ns = P.build_parser().parse_args(argv[3:])
    assert ns.groups == "0,1,2,3:4,5,6,7" and ns.nranks is None and not ns.no_alone
    assert probe_argv(data, script="p.py", python="py", nranks=4)[8:10] == ["--nranks", "4"]
    assert probe_argv(data, script="p.py", python="py", groups=[[0], [1]])[8:10] == ["--groups", "0:1"]


def test_standalone_script_with_groups(tmp_path):
    """The deploy's path: the probe file alone on the host, two groups, JSON and the text report."""
    script = tmp_path / "probe.py"
    script.write_text(Path(P.__file__).read_text())
    argv = [sys.executable, "-I", str(script), "launch", "--groups", "0,1:2,3", "--dry-run", "--nccl", "NCCL_PROTO=LL"]
    proc = subprocess.run([*argv, "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and [r["gpus"] for r in doc["together"]["runs"]] == [[0, 1], [2, 3]] and len(doc["alone"]) == 2
    text = subprocess.run([*argv, "--no-alone"], capture_output=True, text=True, cwd=tmp_path, timeout=60).stdout
    assert "NCCL all-reduce probe group 0 (GPUs 0,1): 2 ranks, bfloat16" in text
    assert "group 1 (GPUs 2,3)" in text and "alone:" not in text and text.endswith("2 groups at once: OK\n")
    for args, words in [(["--groups", "0:0"], "GPU 0 is in group 0 and in group 1"),
                        (["--groups", "0:1", "--nranks", "2"], "--nranks 2 disagrees"), ([], "give --nranks N or --groups")]:
        bad = subprocess.run([sys.executable, "-I", str(script), "launch", *args], capture_output=True, text=True,
                             cwd=tmp_path, timeout=30)
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr


# --- the groups as recorded on 2x H200 (device nvidia-h200-x2; docs/preflight.md) ----------------

def _machine() -> tuple[str, dict[str, str], dict[str, tuple[int, int]]]:
    """The recorded machine notes: text, GPU index -> UUID (nvidia-smi), run name -> (rc, wall_ms)."""
    text = (FIX / "h200x2-groups-machine.txt").read_text()
    uuids = {m[0]: m[1] for m in re.findall(r"^(\d), NVIDIA H200, GPU-([0-9a-f-]+), 580\.159\.04", text, re.M)}
    runs = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^(\S+): rc=(\d+) wall_ms=(\d+) ::", text, re.M)}
    return text, uuids, runs


def _check_recorded_group_run(run: dict, gpu: int, uuids: dict, preset: dict) -> None:
    """One group of one rank on GPU `gpu`: placed there, with the preset, right sums, nccl-tests math."""
    assert run["gpus"] == [gpu] and run["group"] == gpu and run["nranks"] == 1 and run["leftover"] == []
    assert run["system"]["cuda_visible_devices"] == str(gpu)
    assert run["system"]["gpu_uuids"] == [uuids[str(gpu)]]               # the physical GPU nvidia-smi names
    assert run["system"]["torch"] == "2.11.0+cu130" and run["system"]["nccl"] == "2.28.9"
    env = run["ranks"][0]["report"]["env"]
    assert {k: v for k, v in env.items() if k in preset} == preset and env["NCCL_NVLS_ENABLE"] == "0"
    if run["nccl_debug"]:                                                  # NCCL's own word on the device
        assert set(re.findall(r"nvmlDev (\d+)", run["ranks"][0]["log_tail"])) == {str(gpu)}
    assert [x["bytes"] for x in run["results"]] == list(P.DEFAULT_SIZES)
    for x in run["results"]:
        assert x["correct"] and x["latency_us"] == sorted(x["trials_us"])[1]
        algbw, bus = busbw(x["bytes"], x["latency_us"] / 1e6, 1)
        assert x["busbw_gbps"] == pytest.approx(bus, rel=2e-3) and bus == algbw        # n=1: factor 1


def test_recorded_groups_compare():
    """Two 1-rank groups (GPU 0, GPU 1) at once and each alone, for every preset, on 2x H200."""
    doc = json.loads((FIX / "h200x2-groups-compare.json").read_text())
    _, uuids, runs = _machine()
    assert runs["groups-compare.json"][0] == 0 and len(set(uuids.values())) == 2
    assert doc["ok"] and doc["preset"] == "ll-ring" and doc["groups"] == [[0], [1]]
    assert [d["label"] for d in doc["runs"]] == list(PRESETS)
    for d in doc["runs"]:
        assert d["ok"] and d["mode"] == "groups" and d["groups"] == [[0], [1]] and d["together"]["leftover"] == []
        together, alone = d["together"]["runs"], d["alone"]
        for gpu in (0, 1):
            _check_recorded_group_run(together[gpu], gpu, uuids, PRESETS[d["label"]])
            _check_recorded_group_run(alone[gpu], gpu, uuids, PRESETS[d["label"]])
        assert together[0]["master_port"] != together[1]["master_port"]
        # at once: one deadline for both, neither finished after the pair did
        assert max(r["elapsed_s"] for r in together) <= d["together"]["elapsed_s"]
    # the tables printed on the H200s are what format_groups renders from the same data today
    assert doc["summary"] == "\n".join(format_groups(d) for d in doc["runs"])


def test_recorded_groups_hang():
    """Group 1's only rank never joins: group 0 passes, group 1 is ended at the deadline, at once and
    alone; nothing is left (ps, nvidia-smi)."""
    doc = json.loads((FIX / "h200x2-groups-hang.json").read_text())
    _, uuids, runs = _machine()
    assert runs["groups-hang.json"][0] == 1 and runs["groups-hang.txt"][0] == 1 and not doc["ok"]
    g0, g1 = doc["together"]["runs"]
    a0, a1 = doc["alone"]
    _check_recorded_group_run(g0, 0, uuids, PRESETS["ll-ring"])
    _check_recorded_group_run(a0, 0, uuids, PRESETS["ll-ring"])
    for run in (g1, a1):
        assert run["error"]["kind"] == "timeout" and run["hang_rank"] == 0 and run["results"] == []
        assert [(r["phase"], r["returncode"]) for r in run["ranks"]] == [("hang", -15)]
        assert "did not finish within 10 s (rank 0 stuck at 'hang')" in run["error"]["message"]
        assert run["leftover"] == [] and run["elapsed_s"] < run["timeout_s"] + SLACK_S
    assert doc["together"]["leftover"] == [] and doc["together"]["elapsed_s"] < 10 + SLACK_S
    text = (FIX / "h200x2-groups-hang.txt").read_text()
    assert "status      ok    4.0 s  timeout   10.1 s" in text and "0 process(es) left" in text
    assert text.endswith("--- processes whose command line names nccl_probe or preflight:\nnone\n"
                         "--- GPU compute processes:\n(end)\n")
    out = format_groups(doc)
    assert "g1 at once: NCCL probe did not finish within 10 s" in out and "g1 alone: NCCL probe" in out


def test_recorded_standalone_groups_and_the_two_rank_rerun():
    """The deploy's path (the probe file alone, `python3 -I`, an env file) and the 2-rank presets
    re-run with this code: the same picture as the first H200 run."""
    doc = json.loads((FIX / "h200x2-groups-standalone.json").read_text())
    _, uuids, runs = _machine()
    assert runs["groups-standalone.json"][0] == 0 and doc["ok"] and doc["label"] == "nccl.env"
    for run in [*doc["together"]["runs"], *doc["alone"]]:
        assert run["nccl_env"] == PRESETS["ll-ring"]
        _check_recorded_group_run(run, run["group"], uuids, PRESETS["ll-ring"])
    old = {r["label"]: r for r in json.loads((FIX / "h200x2-compare.json").read_text())["runs"]}
    new = {r["label"]: r for r in json.loads((FIX / "h200x2-compare-run3.json").read_text())["runs"]}
    assert new["nop2p"]["transports"] == ["SHM/direct/direct"] and new["p2p"]["transports"] == ["P2P/CUMEM"]
    for label in PRESETS:            # 64 MiB bus bandwidth within 10% of the first run's
        assert new[label]["results"][-1]["busbw_gbps"] == pytest.approx(old[label]["results"][-1]["busbw_gbps"], rel=0.1)
