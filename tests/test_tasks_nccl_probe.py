"""dsv4deploy/tasks/nccl_probe.py: the probe runs only as uploaded (sha256), never as root, and
in the server unit's own sandbox (a transient unit with the rendered unit's settings: its user,
its IP rules) with an empty private HOME (the twin skips the probe: it runs on real GPUs only)."""

import hashlib
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from checkout import load_profile
from dsv4deploy.render.unit import render
from dsv4deploy.render.unitcheck import unit_directives
from dsv4deploy.sglang.flags import MANAGED_ENV, home_environment
from dsv4deploy.tasks.nccl_probe import LAUNCH_ONLY, PROBE_HOME, probe_command, sandbox_properties

FAKE_PROBE = "#!/bin/sh\necho \"uid=$(id -u) home=$HOME args=$*\"\n"


@pytest.fixture
def program():
    work = Path(tempfile.mkdtemp(prefix="nccl-probe-test-"))
    work.chmod(0o755)
    script = work / "nccl_probe.py"
    script.write_text(FAKE_PROBE)
    script.chmod(0o755)
    yield script
    shutil.rmtree(work, ignore_errors=True)


def _run(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30)


def _unit(name: str = "nvfp4-ctx8k") -> str:
    return render(load_profile(name)).unit


def _systemd_run(cmd: str) -> tuple[list[str], list[str]]:
    """(the --property= values, the argv after `--`) of the probe command's systemd-run."""
    words = shlex.split(cmd.split("exit 1; }; ", 1)[1])
    assert words[:5] == ["systemd-run", "--quiet", "--wait", "--pipe", "--collect"]
    cut = words.index("--")
    assert all(w.startswith("--property=") for w in words[5:cut])
    return [w.removeprefix("--property=") for w in words[5:cut]], words[cut + 1:]


@pytest.mark.parametrize("name", ["nvfp4-ctx8k", "nvfp4-ctx8k-dp2"])
def test_the_probe_gets_the_rendered_units_sandbox_and_user(name):
    """Every [Service] setting of the rendered unit but how it launches reaches the probe, read
    from the unit (one source): a setting added to the template reaches the probe unasked."""
    unit = _unit(name)
    props, _ = _systemd_run(probe_command(["/v/bin/python", "/v/p.py"], script="/v/p.py", sha256="a" * 64,
                                          unit=unit))
    service = [f"{d.key}={d.value}" for d in unit_directives(unit) if d.section == "Service"]
    assert props == [p for p in service if p.split("=", 1)[0] not in LAUNCH_ONLY]
    assert {"User=sglang", "Group=sglang", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
            "ProtectHome=yes", "IPAddressDeny=any", "IPAddressAllow=localhost", "DevicePolicy=closed",
            "DeviceAllow=char-nvidia rw", "CapabilityBoundingSet="} <= set(props)
    # nothing of how the server starts or what it may keep: no argv, credentials, home or state
    assert not any(p.split("=", 1)[0] in ("ExecStart", "LoadCredential", "StateDirectory", "WorkingDirectory",
                                          "ReadWritePaths", "EnvironmentFile") for p in props)


def test_with_hardening_off_the_probe_still_gets_a_private_empty_home(profile_dir):
    profile_dir.write("soft", "extends: nvfp4-ctx8k\nservice:\n  hardening: 'off'\n"
                              "  hardening_off_reason: a test of the probe\n")
    props = sandbox_properties(_unit("soft"))
    assert "PrivateTmp=yes" in props and "User=sglang" in props and "IPAddressDeny=any" not in props


def test_the_probe_runs_with_an_empty_private_home_and_caches():
    _, argv = _systemd_run(probe_command(["/v/bin/python", "-I", "/v/p.py", "launch"], script="/v/p.py",
                                         sha256="a" * 64, unit=_unit()))
    assert argv[:4] == ["/v/bin/python", "-I", "/v/p.py", "launch"]
    env = dict(a.split("=", 1) for a in argv[5::2])
    assert argv[4::2] == ["--env"] * len(env) and env == home_environment(PROBE_HOME)
    assert env["HOME"] == "/tmp" and all(v == "/tmp" or v.startswith("/tmp/") for v in env.values())


def test_a_unit_setting_with_a_specifier_is_refused_not_passed_on():
    with pytest.raises(ValueError, match="ReadOnlyPaths=/run/%i holds a specifier"):
        sandbox_properties("[Service]\nUser=sglang\nReadOnlyPaths=/run/%i\n")


def _fake_systemd_run(folder: Path) -> dict:
    """A `systemd-run` stand-in on PATH that prints what it was asked to run (no systemd here)."""
    fake = folder / "systemd-run"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift; echo "systemd-run ran: $*"\n')
    fake.chmod(0o755)
    import os
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def test_a_program_that_does_not_match_its_sha256_is_not_run(program):
    env = _fake_systemd_run(program.parent)
    cmd = probe_command([str(program), "launch"], script=str(program), sha256="0" * 64, unit=_unit())
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 1 and out.stdout == ""
    assert f"{program} does not match sha256 0000000000000000: not run" in out.stderr
    good = hashlib.sha256(program.read_bytes()).hexdigest()
    cmd = probe_command([str(program), "launch"], script=str(program), sha256=good, unit=_unit())
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0 and out.stdout.startswith(f"systemd-run ran: {program} launch --env HOME=/tmp ")


def test_the_command_quotes_every_word():
    cmd = probe_command(["/v/bin/python", "/v/nccl_probe.py", "--env", "A=b c; rm -rf /"], script="/v/nccl_probe.py",
                        sha256="a" * 64, unit=_unit())
    assert " -- /v/bin/python /v/nccl_probe.py --env 'A=b c; rm -rf /' --env HOME=/tmp " in cmd
    assert " '--property=DeviceAllow=char-nvidia rw' " in cmd


def _recorded_argv(recorded: str) -> list[str]:
    """The probe's own argv in a command recorded on a GPU machine (after `env HOME=...`)."""
    words = shlex.split(recorded.split("exit 1; }; ", 1)[1])
    return words[words.index("env") + 2:]


def _deploys_argv(cmd: str) -> list[str]:
    """The probe's own argv in the deploy's command today, without the empty home's --env."""
    _, argv = _systemd_run(cmd)
    return argv[:len(argv) - 2 * len(home_environment(PROBE_HOME))]


def test_the_probe_proven_as_the_service_user_on_an_h200_is_the_one_the_deploy_runs():
    """tests/fixtures/nccl/h200x1-service-user-*: on a 1-GPU H200 (2026-12-03) the deploy's probe,
    sha256-checked and run as the unprivileged `sglang` (then through setpriv with the account's
    home; now through systemd-run in the unit's sandbox, with the empty home's variables after it,
    not yet run on a GPU), ran NCCL 2.28.9 with every sum correct, and a wrong sha256 ran nothing.
    The probe's argv recorded there is what the deploy runs today for the same inputs."""
    import json

    fix = Path(__file__).parent / "fixtures" / "nccl"
    recorded = (fix / "h200x1-service-user-command.sh").read_text().strip()
    venv = "/opt/dsv4deploy/venvs/sglang-probe-test"
    argv = [f"{venv}/bin/python", f"{venv}/nccl_probe.py", "launch", "--json", "--timeout", "60", "--nranks", "1",
            "--env-file", "/etc/dsv4deploy/sglang/nccl.env.next", "--keep-env", "NCCL_VERSION"]
    sha = recorded.split("'")[1].split()[0]
    assert _deploys_argv(probe_command(argv, script=f"{venv}/nccl_probe.py", sha256=sha, unit=_unit())) == \
        _recorded_argv(recorded)
    machine = (fix / "h200x1-service-user-machine.txt").read_text()
    assert "good: rc=0" in machine and "as uid 999 gid 999 groups [] HOME /var/lib/dsv4deploy/sglang cuda True 1" in machine
    assert "bad sha: rc=1" in machine and "does not match sha256 0000000000000000: not run" in machine
    doc = json.loads((fix / "h200x1-service-user.json").read_text())
    assert doc["ok"] and doc["nranks"] == 1 and all(r["correct"] for r in doc["results"])
    assert doc["nccl_env"] == {"NCCL_ALGO": "Ring", "NCCL_IB_DISABLE": "1", "NCCL_PROTO": "LL"}


def test_the_deploys_probe_as_a_service_on_an_h200_ran_apart_from_the_login():
    """tests/fixtures/nccl/h200x1-as-service-*: on a 1-GPU H200 (2026-12-05) the deploy's probe
    for nvfp4-ctx8k (probe_argv with one rank: the launcher isolated, the ranks started
    --as-service with the unit's Environment=), run from a login whose PYTHONPATH held a json.py
    that fails on import and whose CUDA_VISIBLE_DEVICES named a GPU that is not there, passed
    with every sum correct; the same login without -I and --as-service failed on that json.py.
    The probe's argv recorded there (its venv's paths aside) is what the deploy runs today; the
    sandbox around it (systemd-run) is newer than that run."""
    import json

    from dsv4deploy.preflight import probe_argv

    fix = Path(__file__).parent / "fixtures" / "nccl"
    recorded = (fix / "h200x1-as-service-command.sh").read_text().strip()
    data = load_profile("nvfp4-ctx8k").data
    venv = "/opt/dsv4deploy/venvs/sglang-0.5.23-c6d34365f13f"          # the venv's name then
    script = f"{venv}/nccl_probe.py"
    argv = probe_argv(data, script=script, python=f"{venv}/bin/python", env_file="/etc/dsv4deploy/sglang/nccl.env.next",
                      timeout_s=60, nranks=1)
    sha = recorded.split("'")[1].split()[0]
    assert _deploys_argv(probe_command(argv, script=script, sha256=sha, unit=_unit())) == _recorded_argv(recorded)
    machine = (fix / "h200x1-as-service-machine.txt").read_text()
    assert "good (login with PYTHONPATH, CUDA_VISIBLE_DEVICES=7): rc=0" in machine
    assert "before (the same login, no -I, no --as-service): rc=1" in machine and "the login json.py was imported" in machine
    assert "bad sha: rc=1" in machine and "--- left: 0" in machine
    doc = json.loads((fix / "h200x1-as-service.json").read_text())
    assert doc["ok"] and doc["nranks"] == 1 and all(r["correct"] for r in doc["results"]) and len(doc["results"]) == 8
    assert {"PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"} <= set(doc["dropped_inherited"])
    assert doc["unit_env"]["PATH"] == MANAGED_ENV["PATH"] and doc["system"]["gpus"] == ["NVIDIA H200"]
