"""The shipped slow baseline (fp8-ctx1m-baseline, about 30 tok/s at C=64: its full gate would take
about 27 minutes) fails its gate early and is rolled back, gated as on CT200: this isolated twin's
venv is the real host's, so `auto` picks SGLang's bench_serving, which gives no per-request
progress and is stopped once the floor is out of reach in time.

On a twin of its own (about 4 minutes, mostly waiting on bench_serving): make test runs it in a
process of its own beside the default twin's, whose module fails a release through the built-in
client's early stop (tests/test_deploy_twin.py).
"""

from __future__ import annotations

import json
import time

import pytest

from sim_fixtures import BASELINE_ENV, baseline_twin  # noqa: F401

from ct200twin.faultlab import (FAST_START, FAULTS, QUICK_GATE, deploy, health, releases, served_context,
                               write_profiles)

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

GOOD = "base8k"       # nvfp4-ctx8k's server with a short gate of the built-in client: what the rollback restores
SLOW = "fp8-ctx1m-baseline"
INVENTORY = "inventory/fleet-sim.py"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    return write_profiles(tmp_path_factory.mktemp("profiles"),
                          {GOOD: "extends: nvfp4-ctx8k\n" + QUICK_GATE + "  runner: builtin\n"})


@pytest.fixture(scope="module")
def twin(baseline_twin):  # noqa: F811
    """The baseline's twin with no release, no faults and a fast server start."""
    baseline_twin.run("systemctl stop sglang.service 2>/dev/null; systemctl reset-failed 2>/dev/null; "
                      "rm -rf /var/lib/dsv4deploy /etc/dsv4deploy /etc/systemd/system/sglang.service; "
                      "systemctl daemon-reload", check=False)
    baseline_twin.write_file(FAULTS, json.dumps(FAST_START))
    yield baseline_twin
    baseline_twin.run(f"rm -f {FAULTS}", check=False)


def test_the_shipped_slow_baseline_fails_bench_servings_gate_early_and_rolls_back(twin, profiles):
    good = deploy(GOOD, profiles_dir=profiles, timeout=1800, inventory=INVENTORY, env=BASELINE_ENV)
    assert good.returncode == 0, (good.stdout + good.stderr)[-3000:]
    start = time.monotonic()
    out = deploy(SLOW, profiles_dir=profiles, inventory=INVENTORY, env=BASELINE_ENV)
    took = time.monotonic() - start
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"release 0002 ({SLOW}) failed the smoke gate: C=64" in text, text[-3000:]
    # no per-request progress: stopped once the level's floor is out of reach in time
    assert "stopped early" in text and "cannot reach the floor" in text, text[-3000:]
    assert took < 300, "the full gate of this profile would take about 27 minutes"
    assert f"rolled back: release 0003 (restores 0001, profile {GOOD}) is serving" in text
    assert "Traceback" not in text
    recs = releases(twin)
    assert [(r["release"], r["profile"], r["status"]) for r in recs] == [
        (1, GOOD, "superseded"), (2, SLOW, "failed"), (3, GOOD, "deployed")]
    assert recs[1]["gate"]["passed"] is False
    gate = json.loads(twin.run("cat /var/lib/dsv4deploy/releases/0002/gate/gate.json").stdout)
    assert gate["result"]["runner"] == "bench_serving" and gate["result"]["client"]["runner_choice"].startswith("auto: ")
    assert health(twin) == "200" and served_context(twin) == 8192
