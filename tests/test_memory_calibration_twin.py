"""The host's own numbers, end to end on a twin: a release the validator accepts runs out of GPU
memory at start on this host (its GPUs are smaller than the catalog's card), is recorded failed
with SGLang's out-of-memory figures and rolled back; the host's calibration is remade from it on the
control node, and `dsv4deploy validate --host` then refuses that fraction, naming the release.

On the rollbacks' isolated twin (same make test group as tests/test_rollbacks_twin.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ct200twin import faultlab
from ct200twin.faultlab import FAST_START, FAULTS, QUICK_GATE, releases
from dsv4deploy.cli.settings import CHECKOUT
from dsv4deploy.profile import calibration
from sim_fixtures import ROLLBACK_ENV, ROLLBACK_FLEET, rollback_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

INVENTORY = "inventory/fleet-sim.py"
HOST = f"{ROLLBACK_FLEET}-1"
# 80,000 MiB GPUs (78.1 GiB): TP4 bs 32 over NCCL needs 21.24 GiB at capture (memory_facts), so
# 0.70 leaves 22.4 GiB and starts, 0.75 leaves 18.5 GiB and runs out; on the catalog's 97,887 MiB
# card the validator accepts both.
SMALL_GPU_MIB = 80000
VARIANTS = {"mem16k": faultlab.variant(16384, gate=QUICK_GATE),
            "mem075": faultlab.variant(17408, gate=QUICK_GATE, extra="  mem_fraction_static: 0.75\n")}


def deploy(profile: str, profiles_dir):
    return faultlab.deploy(profile, profiles_dir=profiles_dir, env=ROLLBACK_ENV, inventory=INVENTORY)


def validate(profile: str, profiles_dir, *host: str):
    return subprocess.run([sys.executable, "-m", "dsv4deploy", "validate", profile, *host], capture_output=True,
                          text=True, env={**os.environ, "DSV4_PROFILES_DIR": str(profiles_dir)})


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    return faultlab.write_profiles(tmp_path_factory.mktemp("profiles"), VARIANTS)


@pytest.fixture(scope="module")
def twin(rollback_twin, profiles):  # noqa: F811
    path = calibration.path_for(CHECKOUT / "reports", HOST)
    path.unlink(missing_ok=True)
    rollback_twin.write_file(FAULTS, json.dumps(FAST_START))
    out = deploy("mem16k", profiles)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    yield rollback_twin
    rollback_twin.set_gpus(reset=True)
    rollback_twin.run(f"rm -f {FAULTS}", check=False)


def test_an_oom_at_start_is_recorded_calibrated_and_refused_next_time(twin, profiles):
    assert validate("mem075", profiles).returncode == 0          # the model alone accepts 0.75
    twin.set_gpus(memory_mib=SMALL_GPU_MIB)
    try:
        out = deploy("mem075", profiles)
    finally:
        twin.set_gpus(reset=True)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "SGLang at start: out of memory at start: tried to allocate 2.20 GiB" in text, text[-3000:]
    failed = [r for r in releases(twin) if r["profile"] == "mem075"][-1]
    assert failed["status"] == "failed"
    assert failed["startup"]["started"] is False and failed["startup"]["fraction"] == 0.75
    assert failed["startup"]["figures"]["oom"]["tried_gib"] == 2.2
    assert releases(twin)[-1]["kind"] == "rollback"                # the good release serves again

    doc = calibration.read(calibration.path_for(CHECKOUT / "reports", HOST))
    kinds = {e["profile"]: e["kind"] for e in doc["evidence"]}
    assert kinds["mem075"] == "oom" and kinds["mem16k"] == "started"

    refused = validate("mem075", profiles, "--host", HOST)
    assert refused.returncode == 2
    name = f"release {failed['release']:04d}"
    assert f"on {HOST}: {name} ran out of GPU memory at start at 0.75" in refused.stdout, refused.stdout[-2000:]
    assert validate("mem16k", profiles, "--host", HOST).returncode == 0    # 0.70 still fits there
