"""dsv4deploy/tasks/nccl_probe.py: the probe runs only as uploaded (sha256) and as the service's
user, never as root (the twin skips the probe: it runs on real GPUs only)."""

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from dsv4deploy.sglang.flags import MANAGED_ENV
from dsv4deploy.tasks.nccl_probe import probe_command

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


@pytest.mark.skipif(os.geteuid() != 0, reason="drops privileges to the system user daemon: needs root")
def test_the_probe_runs_as_the_service_user_with_its_home(program):
    digest = hashlib.sha256(program.read_bytes()).hexdigest()
    cmd = probe_command([str(program), "launch", "--nranks", "4"], script=str(program), sha256=digest,
                        user="daemon", home="/var/lib/dsv4deploy/sglang")
    out = _run(cmd)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "uid=1 home=/var/lib/dsv4deploy/sglang args=launch --nranks 4"


def test_a_program_that_does_not_match_its_sha256_is_not_run(program):
    cmd = probe_command([str(program), "launch"], script=str(program), sha256="0" * 64, user="daemon", home="/x")
    out = _run(cmd)
    assert out.returncode == 1 and out.stdout == ""
    assert f"{program} does not match sha256 0000000000000000: not run" in out.stderr


def test_the_command_quotes_every_word():
    cmd = probe_command(["/v/bin/python", "/v/nccl_probe.py", "--env", "A=b c; rm -rf /"], script="/v/nccl_probe.py",
                        sha256="a" * 64, user="sglang", home="/var/lib/dsv4deploy/sglang")
    assert cmd.endswith("setpriv --reuid=sglang --regid=sglang --clear-groups --no-new-privs -- env "
                        "HOME=/var/lib/dsv4deploy/sglang /v/bin/python /v/nccl_probe.py --env 'A=b c; rm -rf /'")


def test_the_command_proven_as_the_service_user_on_an_h200_is_the_one_the_deploy_sends():
    """tests/fixtures/nccl/h200x1-service-user-*: on a 1-GPU H200 (2026-12-03) the deploy's probe
    command, sha256-checked and run as the unprivileged `sglang` (no groups, the service's HOME),
    ran NCCL 2.28.9 with every sum correct, and a wrong sha256 ran nothing. The command recorded
    there is what probe_command makes today for the same inputs: a change to it needs a new run."""
    import json
    from pathlib import Path

    fix = Path(__file__).parent / "fixtures" / "nccl"
    recorded = (fix / "h200x1-service-user-command.sh").read_text().strip()
    venv = "/opt/dsv4deploy/venvs/sglang-probe-test"
    argv = [f"{venv}/bin/python", f"{venv}/nccl_probe.py", "launch", "--json", "--timeout", "60", "--nranks", "1",
            "--env-file", "/etc/dsv4deploy/sglang/nccl.env.next", "--keep-env", "NCCL_VERSION"]
    sha = recorded.split("'")[1].split()[0]
    assert probe_command(argv, script=f"{venv}/nccl_probe.py", sha256=sha, user="sglang",
                         home="/var/lib/dsv4deploy/sglang") == recorded
    machine = (fix / "h200x1-service-user-machine.txt").read_text()
    assert "good: rc=0" in machine and "as uid 999 gid 999 groups [] HOME /var/lib/dsv4deploy/sglang cuda True 1" in machine
    assert "bad sha: rc=1" in machine and "does not match sha256 0000000000000000: not run" in machine
    doc = json.loads((fix / "h200x1-service-user.json").read_text())
    assert doc["ok"] and doc["nranks"] == 1 and all(r["correct"] for r in doc["results"])
    assert doc["nccl_env"] == {"NCCL_ALGO": "Ring", "NCCL_IB_DISABLE": "1", "NCCL_PROTO": "LL"}


def test_the_deploys_probe_as_a_service_on_an_h200_ran_apart_from_the_login():
    """tests/fixtures/nccl/h200x1-as-service-*: on a 1-GPU H200 (2026-12-05) the deploy's probe
    command for nvfp4-ctx8k (probe_argv with one rank: the launcher isolated, the ranks started
    --as-service with the unit's Environment=), run from a login whose PYTHONPATH held a json.py
    that fails on import and whose CUDA_VISIBLE_DEVICES named a GPU that is not there, passed
    with every sum correct; the same login without -I and --as-service failed on that json.py.
    The recorded command is what the deploy makes today for the same inputs."""
    import json
    from pathlib import Path

    from dsv4deploy.render.layout import Layout
    from dsv4deploy.preflight import probe_argv
    from checkout import load_profile

    fix = Path(__file__).parent / "fixtures" / "nccl"
    recorded = (fix / "h200x1-as-service-command.sh").read_text().strip()
    data = load_profile("nvfp4-ctx8k").data
    layout = Layout.of(data)
    script = f"{layout.venv}/nccl_probe.py"
    argv = probe_argv(data, script=script, env_file=f"{layout.config_dir}/nccl.env.next", timeout_s=60, nranks=1)
    sha = recorded.split("'")[1].split()[0]
    assert probe_command(argv, script=script, sha256=sha, user=data["service"]["user"], home=layout.state_dir) == recorded
    machine = (fix / "h200x1-as-service-machine.txt").read_text()
    assert "good (login with PYTHONPATH, CUDA_VISIBLE_DEVICES=7): rc=0" in machine
    assert "before (the same login, no -I, no --as-service): rc=1" in machine and "the login json.py was imported" in machine
    assert "bad sha: rc=1" in machine and "--- left: 0" in machine
    doc = json.loads((fix / "h200x1-as-service.json").read_text())
    assert doc["ok"] and doc["nranks"] == 1 and all(r["correct"] for r in doc["results"]) and len(doc["results"]) == 8
    assert {"PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"} <= set(doc["dropped_inherited"])
    assert doc["unit_env"]["PATH"] == MANAGED_ENV["PATH"] and doc["system"]["gpus"] == ["NVIDIA H200"]
