"""The NCCL probe's sandbox on a twin (issue 37, items 5 and 7): the deploy's own probe command
(tasks/nccl_probe.py, built from the rendered unit), run with the twin's CPU-only stand-in in
place of nccl_probe.py (ct200twin/host/probe_stand_in.py), runs as the unit's user with no new
privileges, an empty HOME each time, the account's home read-only, loopback reachable and a
non-loopback address not; the same program without the sandbox could do all of it."""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest

from checkout import load_profile
from ct200twin.host.probe_stand_in import PATH, PROGRAM
from dsv4deploy.render.unit import render
from dsv4deploy.tasks.nccl_probe import probe_command
from sim_fixtures import lab_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

USER = "dsv4probetest"          # an account of the test's own: the lab's deploys judge `sglang`
ACCOUNT_HOME = f"/var/lib/{USER}"


@pytest.fixture
def probe_twin(lab_twin):  # noqa: F811
    lab_twin.run(f"id {USER} >/dev/null 2>&1 || useradd --system --user-group --shell /usr/sbin/nologin "
                 f"--home-dir {ACCOUNT_HOME} {USER}; mkdir -p {ACCOUNT_HOME} && chown {USER}: {ACCOUNT_HOME}")
    lab_twin.write_file(PATH, PROGRAM, mode=0o644)
    yield lab_twin
    lab_twin.run(f"userdel {USER}; rm -rf {ACCOUNT_HOME} {PATH.rsplit('/', 1)[0]}", check=False)


def _unit() -> str:
    profile = load_profile("nvfp4-ctx8k")
    data = {**profile.data, "service": {**profile.data["service"], "user": USER}}
    return render(type(profile)(name=profile.name, data=data, origins=profile.origins, files=profile.files)).unit


def _doc(twin, cmd: str) -> dict:
    out = twin.run(cmd, check=False, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_the_probe_runs_in_the_units_sandbox_with_an_empty_home(probe_twin):
    sha = hashlib.sha256(PROGRAM.encode()).hexdigest()
    argv = ["/usr/bin/python3", "-I", PATH, probe_twin.address]          # the twin's own, non-loopback
    cmd = probe_command(argv, script=PATH, sha256=sha, unit=_unit())
    for _ in range(2):          # the second run finds nothing of the first's
        doc = _doc(probe_twin, cmd)
        assert (doc["user"], doc["no_new_privs"], doc["home"], doc["home_at_start"]) == (USER, "1", "/tmp", [])
        assert doc["env"]["XDG_CACHE_HOME"] == "/tmp/.cache" and doc["write_home"] == "ok"
        assert doc["write_account_home"] == "OSError Read-only file system"
        assert doc["connect_loopback"] == "ok" and doc["connect_peer"] in ("TimeoutError", "PermissionError")
    # the control: the same program, the same user, without the unit's sandbox (as the probe ran before)
    before = cmd.split("systemd-run ", 1)[0] + shlex.join(
        ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "--", "env", f"HOME={ACCOUNT_HOME}", *argv])
    doc = _doc(probe_twin, before)
    assert (doc["write_account_home"], doc["connect_peer"]) == ("ok", "ok")
    # what the program exits with is what the deploy's command exits with, its output apart
    fail = probe_command(["/usr/bin/python3", "-c", "import sys; print('out'); sys.exit(3)"], script=PATH,
                         sha256=sha, unit=_unit())
    out = probe_twin.run(fail, check=False, timeout=60)
    assert (out.returncode, out.stdout) == (3, "out\n")
