"""Fixtures for tests that need a CT200 twin (import them into a test module or conftest).

    from sim_fixtures import sim_twin  # noqa: F401

`sim_twin` (session scope) brings twin-1 up (building the cached root the first
time), resets its GPUs to CT200's defaults and yields its `SimHost`.  At the end
it stops the twin again unless it was already running before the session (or
DSV4_SIM_KEEP=1).  Twin tests skip only when not root: CI runs as root.
"""

from __future__ import annotations

import os
import time

import pytest

from ct200twin import faultlab
from ct200twin.host import machines as simhost
from ct200twin.host import uv_cache
from ct200twin.server.faults import DEFAULT_PATH as TWIN_FAULTS

NOT_ROOT = os.geteuid() != 0
NOT_ROOT_REASON = "the CT200 twin needs root (mmdebstrap, systemd-nspawn); CI runs as root"

needs_root = pytest.mark.skipif(NOT_ROOT, reason=NOT_ROOT_REASON)


@pytest.fixture(scope="session")
def sim_twin():
    if NOT_ROOT:
        pytest.skip(NOT_ROOT_REASON)
    was_running = simhost.SimHost(1).running()
    try:
        twin = simhost.up(1)[0]
    except simhost.SimError as exc:
        # Seen on a busy 2-core machine: nspawn told to halt within a second of a twin's first boot.
        # Once more, after the address is free again; a second failure is reported as it is.
        if "exited during boot" not in str(exc) and "already in use" not in str(exc):
            raise
        deadline = time.monotonic() + 60
        while simhost._port_in_use(simhost.twin_address(1)) and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(5)
        twin = simhost.up(1)[0]
    uv_cache.share(twin.root, wait=True)      # its venv is the real host's: the release's wheels warm
    _calibrated(twin)
    yield twin
    _calibrated(twin)
    if not was_running and os.environ.get("DSV4_SIM_KEEP") != "1":
        simhost.down([1])


def _calibrated(twin) -> None:
    """CT200's GPUs and no fault file: what the tests start from, and what they leave (a twin that
    `make deploy` boots next would otherwise start its server with the tests' fast load)."""
    twin.set_gpus(reset=True)
    twin.run(f"rm -f {TWIN_FAULTS}")


LAB_FLEET = os.environ.get("DSV4_SIM_LAB_FLEET", "lab")    # another name: a lab twin of one's own
# The lab's deploys: the fault matrix and the replica sets test the rollout, not the launch check,
# so the lab twin keeps the twin's own parser (ct200twin/host/stand_ins.py) instead of installing
# CPU torch and importing SGLang's parser (~2.6 CPU s) at every new argv. SGLang's own parser on a twin:
# tests/test_deploy_twin.py.
LAB_ENV = {"DSV4_SIM_FLEET": LAB_FLEET, "DSV4_SIM_LAUNCH_CHECK": "twin"}


def _isolated_twin(fleet: str, real_venv: bool = False):
    """Twin 1 of FLEET (`sim up --fleet FLEET`: its own network namespace, docs/fleet.md), reset to
    CT200's GPUs; stopped at the end unless it ran before (or DSV4_SIM_KEEP=1). REAL_VENV: its
    deploys install the real host's venv, so its uv cache first gets the release's wheels once
    make test's background fetch of them is done (ct200twin/host/uv_cache.py)."""
    if NOT_ROOT:
        pytest.skip(NOT_ROOT_REASON)
    was_running = simhost.SimHost(1, fleet).running()
    twin = simhost.up(1, fleet=fleet)[0]
    if real_venv:
        uv_cache.share(twin.root, wait=True)
    _calibrated(twin)
    yield twin
    _calibrated(twin)
    if not was_running and os.environ.get("DSV4_SIM_KEEP") != "1":
        simhost.down(fleet=fleet)


@pytest.fixture(scope="session")
def lab_twin():
    """An isolated twin for the fault matrix and the replica sets: they run in one of `make test`'s
    isolated-twin processes (marker `fleet`), beside the default twin's tests, and share this one
    twin (one venv install)."""
    yield from _isolated_twin(LAB_FLEET)


SETS_FLEET = os.environ.get("DSV4_SIM_SETS_FLEET", "sets")
# Fault 15 (a replica set converges) and the tuner through the gateway: the lab's parser (LAB_ENV)
# on a twin of their own.
SETS_ENV = {"DSV4_SIM_FLEET": SETS_FLEET, "DSV4_SIM_LAUNCH_CHECK": "twin"}


@pytest.fixture(scope="session")
def sets_twin():
    """An isolated twin for tests/test_faults_converge_twin.py and tests/test_tune_gateway_twin.py:
    together about as long as the rest of the lab's tests, and mostly waiting on smg and the twin
    servers (not CPU), so a pytest process of their own beside the lab's halves the lab's wall
    time (bench/results/lab-twin-time-2026-12-06.md)."""
    yield from _isolated_twin(SETS_FLEET)


ROLLBACK_FLEET = os.environ.get("DSV4_SIM_ROLLBACK_FLEET", "rollbacks")
# The rollbacks' deploys test what a failed release leaves serving, not the launch check: the twin's
# own parser, as in the lab (LAB_ENV).
ROLLBACK_ENV = {"DSV4_SIM_FLEET": ROLLBACK_FLEET, "DSV4_SIM_LAUNCH_CHECK": "twin"}


@pytest.fixture(scope="session")
def rollback_twin():
    """An isolated twin of its own for tests/test_rollbacks_twin.py and
    tests/test_faults_rollback_twin.py, which run in `make test`'s process of the fleet of three
    after it (so that neither the default twin's process nor the lab's is the longest)."""
    yield from _isolated_twin(ROLLBACK_FLEET)


def recovered(row: faultlab.Row) -> None:
    """Every strike of ROW struck (a strike that did not land is no evidence) and it recovered."""
    tails = "\n".join(f"--- {k} ---\n{v[-2500:]}" for k, v in row.outputs.items())
    assert row.recovered, "; ".join(row.not_struck + row.why_not) + "\n" + tails


FAULT_BASE = "fbase"    # the fault tests' baseline: nvfp4-ctx8k's server with a one-level gate (and its own context)


def fault_lab(twin, profiles_dir, env: dict[str, str], baseline: str = FAULT_BASE):
    """A faultlab.Lab on TWIN (an isolated twin of inventory/fleet-sim.py, ENV naming it) from a
    good release serving (BASELINE's), put back to a clean host after the module. Any release that
    passed its gate is a clean start (each test leaves one), and a fault that ends with one serving
    is not deployed a second time: bench/faults.py does both in full."""
    profiles = faultlab.write_profiles(profiles_dir, {**faultlab.VARIANTS, FAULT_BASE: faultlab.variant(7680)})
    lab = faultlab.Lab(twin, profiles, baseline=baseline, any_good=True, rerun=False,
                       inventory="inventory/fleet-sim.py", env=env)
    lab.baseline()
    yield lab
    lab.reset_host()
    twin.run(f"rm -f {faultlab.FAULTS}", check=False)


RUNNER_FLEET = os.environ.get("DSV4_SIM_RUNNER_FLEET", "runners")
# The gate runners' comparison: SGLang's bench_serving runs from the server's venv, so this twin's
# venv is the real host's (no DSV4_SIM_LAUNCH_CHECK=twin), as on the default twin.
RUNNER_ENV = {"DSV4_SIM_FLEET": RUNNER_FLEET}


@pytest.fixture(scope="session")
def runner_twin():
    """An isolated twin with the real host's venv for tests/test_gate_runners_twin.py, then
    tests/test_deploy_twin_hf.py: make test runs them in a process of their own, beside the default
    twin's (both runners' full levels take about 4 minutes, which that process need not wait for)."""
    yield from _isolated_twin(RUNNER_FLEET, real_venv=True)


BASELINE_FLEET = os.environ.get("DSV4_SIM_BASELINE_FLEET", "baseline")
# The shipped slow baseline gated by SGLang's bench_serving: the real host's venv, as RUNNER_ENV.
BASELINE_ENV = {"DSV4_SIM_FLEET": BASELINE_FLEET}


@pytest.fixture(scope="session")
def baseline_twin():
    """An isolated twin with the real host's venv for tests/test_slow_baseline_twin.py (its gate
    stops after about 3.5 minutes, mostly waiting): a process of its own in make test."""
    yield from _isolated_twin(BASELINE_FLEET, real_venv=True)


ROOT_FLEET = os.environ.get("DSV4_SIM_ROOT_FLEET", "root")
# CT200's likely login: root over SSH with a key, no sudo (DSV4_SIM_USER=root); the twin's own
# parser for the launch check, as for the rollbacks (what is tested is the login, not the parser).
ROOT_ENV = {"DSV4_SIM_FLEET": ROOT_FLEET, "DSV4_SIM_LAUNCH_CHECK": "twin", "DSV4_SIM_USER": "root"}


@pytest.fixture(scope="session")
def root_login_twin():
    """An isolated twin of its own for tests/test_root_login_twin.py (deploys as root, no sudo)."""
    yield from _isolated_twin(ROOT_FLEET)
