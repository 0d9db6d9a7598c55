"""The whole cycle as root over SSH without sudo, CT200's likely login: a deploy that passes its
gate, one that crashes at start and rolls back, and the history, on an isolated twin of its own
(`sim up --fleet root`) reached as root with a key (DSV4_SIM_USER=root), host-key checking on.
The twin's sudo is moved aside for the module: a step that still called it would fail.
"""

from __future__ import annotations

import json
import re

import pytest

from ct200twin import faultlab
from ct200twin.faultlab import FAST_START, FAULTS, health, releases, served_context
from ct200twin.faultlab.tool import REPO, run
from dsv4deploy.render.layout import STATE
from sim_fixtures import ROOT_ENV, root_login_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

INVENTORY = "inventory/fleet-sim.py"
VARIANTS = {"root16k": 16384, "rootcrash20k": 20480}
SUDO, SUDO_OFF = "/usr/bin/sudo", "/usr/bin/sudo.dsv4deploy-test-off"


def deploy(profile: str, profiles_dir):
    return faultlab.deploy(profile, profiles_dir=profiles_dir, env=ROOT_ENV, inventory=INVENTORY)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    return faultlab.write_profiles(tmp_path_factory.mktemp("profiles"),
                                   {name: faultlab.variant(ctx) for name, ctx in VARIANTS.items()})


@pytest.fixture(scope="module")
def twin(root_login_twin):  # noqa: F811
    """The root login's twin with no release of an earlier run, no faults, and no sudo."""
    root_login_twin.run("systemctl stop sglang.service 2>/dev/null; systemctl reset-failed 2>/dev/null; "
                        "rm -rf /var/lib/dsv4deploy /etc/dsv4deploy /etc/systemd/system/sglang.service; "
                        f"systemctl daemon-reload; [ ! -e {SUDO} ] || mv {SUDO} {SUDO_OFF}", check=False)
    root_login_twin.write_file(FAULTS, json.dumps(FAST_START))
    try:
        yield root_login_twin
    finally:
        root_login_twin.run(f"rm -f {FAULTS}; [ ! -e {SUDO_OFF} ] || mv {SUDO_OFF} {SUDO}", check=False)


def test_root_without_sudo_deploys_rolls_back_and_reads_its_history(twin, profiles):
    assert twin.run("command -v sudo || echo none").stdout.strip() == "none"
    out = deploy("root16k", profiles)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert [(r["release"], r["status"]) for r in releases(twin)] == [(1, "deployed")]
    assert health(twin) == "200" and served_context(twin) == 16384

    twin.write_file(FAULTS, json.dumps({**FAST_START, "crash_on_start": "simulated CUDA error",
                                        "match_argv": "--context-length 20480"}))
    try:
        out = deploy("rootcrash20k", profiles)
    finally:
        twin.write_file(FAULTS, json.dumps(FAST_START))
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "release 0002 (rootcrash20k) failed: unit" in text and "simulated CUDA error" in text, text[-3000:]
    assert "rolled back: release 0003 (restores 0001, profile root16k) is serving" in text, text[-3000:]
    assert health(twin) == "200" and served_context(twin) == 16384
    assert twin.run(f"ls {STATE}/deploy.lock 2>/dev/null || echo free").stdout.strip() == "free"

    shown = run([str(REPO / ".venv" / "bin" / "dsv4deploy"), "history", "--inventory", INVENTORY, "--json"],
                env=ROOT_ENV, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    history = json.loads(shown.stdout)[twin.name]
    assert [(r["release"], r["status"], r.get("restores")) for r in history] == [
        (1, "superseded", None), (2, "failed", None), (3, "deployed", 1)]


def test_a_login_without_root_or_sudo_is_refused_on_the_host_with_nothing_touched(twin, profiles):
    """An inventory of one's own that logs in as a user without sudo (here the twin's `deploy`,
    its sudo gone): the host's first command says so in one line, and writes nothing."""
    listing = ("find /var/lib/dsv4deploy /etc/dsv4deploy /etc/systemd/system /opt/dsv4deploy /srv/dsv4deploy "
               "/home/deploy -printf '%p %T@ %s\\n' 2>/dev/null | sort | sha256sum")
    before = twin.run(listing).stdout
    env = {k: v for k, v in ROOT_ENV.items() if k != "DSV4_SIM_USER"}     # the `deploy` account
    out = faultlab.deploy("root16k", "--data", "_sudo=false", profiles_dir=profiles, env=env, inventory=INVENTORY)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    said = [line for line in text.splitlines() if "without sudo" in line]
    assert len(said) == 1 and re.search(
        r"the deploy logs in as deploy \(uid \d+\) without sudo, but it writes /opt, /etc, /srv, /var/lib and "
        r"systemd units as root: connect as root, or give deploy passwordless sudo and use it \(CT200_SUDO=1 with "
        r"inventory/ct200\.py, pyinfra's --sudo, or host data _sudo: True\)\. Nothing was changed on the host\.$",
        said[0]), said
    assert "Starting operation" not in text
    assert twin.run(listing).stdout == before
