"""The tuner scores a replica set where users reach it, on the CT200 twin (issue 41, item 3).

Three candidates of one base, each deployed by the tune's rollout backend as a release: one TP4
server, then two TP4 replicas behind the smg gateway (started together: the deploy gates them
through the gateway), then the set again with another context (rolled one replica at a time: the
deploy gates each replica alone, so the backend measures the set again through its gateway). Both
set candidates score above the single server, and above any one replica's own gate, which the
measurement keeps beside the score.

On an isolated twin shared with fault 15 (tests/test_faults_converge_twin.py; DSV4_SIM_SETS_FLEET
names it; marker `fleet`), about 1.5 minutes.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ct200twin.faultlab import FAST_START, FAULTS
from dsv4deploy.cli.settings import CHECKOUT, PROFILES_VAR, Settings
from dsv4deploy.profile.load import load_profile
from dsv4deploy.tune.candidates import Candidate, candidate_profile
from dsv4deploy.tune.objective import Level
from dsv4deploy.tune.rollout_backend import RolloutBackend
from sim_fixtures import SETS_ENV, sets_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

BASE = "tgw-base"
LEVEL = Level(index=0, concurrency=64, num_prompts=64, input_len=128, output_len=32, final=True, floor=100.0)
UNITS = "sglang.service sglang@0.service sglang@1.service sglang@2.service sglang-gateway.service"  # (fault 15 ran three)


@pytest.fixture(scope="module")
def backend(sets_twin, tmp_path_factory):  # noqa: F811
    profiles = tmp_path_factory.mktemp("profiles")
    for path in (CHECKOUT / "profiles").glob("*.yaml"):
        shutil.copyfile(path, profiles / path.name)
    (profiles / f"{BASE}.yaml").write_text("extends: nvfp4-ctx8k\n")
    sets_twin.run(f"systemctl disable --now {UNITS} 2>/dev/null; true", check=False)
    sets_twin.write_file(FAULTS, json.dumps(FAST_START))
    settings = Settings.from_environment({**os.environ, **SETS_ENV, PROFILES_VAR: str(profiles)}, CHECKOUT)
    rb = RolloutBackend("inventory/fleet-sim.py", load_profile(BASE, profiles), None, settings)
    yield rb
    rb.close()
    sets_twin.run(f"systemctl disable --now {UNITS} 2>/dev/null; rm -f {FAULTS}; true", check=False)


def measure(rb: RolloutBackend, index: int, overrides: dict):
    cand = Candidate(index, overrides, candidate_profile(rb.base, overrides), f"k{index}")
    m = rb.measure(cand, LEVEL)
    assert m.error is None and m.gate_passed, (m, rb.log[-1][-3000:])
    return m


def test_a_two_replica_candidate_scores_its_sets_throughput_above_one_server(backend):
    one = measure(backend, 1, {"server.context_length": 7680})
    fresh = measure(backend, 2, {"replicas.count": 2, "server.context_length": 7680})
    rolled = measure(backend, 3, {"replicas.count": 2, "server.context_length": 7168})
    assert one.scope == "the server" and not one.per_replica
    assert fresh.scope == rolled.scope == "through the gateway (2 replicas)"
    assert not fresh.per_replica                     # started together: the deploy's gate went through the gateway
    assert [g["replica"] for g in rolled.per_replica] == [0, 1] and all(g["passed"] for g in rolled.per_replica)
    assert all(n and n > 0 for n in rolled.requests_per_replica)     # both replicas served the score
    alone = max(g["output_throughput"] for g in rolled.per_replica)
    for s in (fresh, rolled):
        assert s.output_throughput > 1.2 * one.output_throughput, (one, s)
    assert rolled.output_throughput > 1.2 * alone, rolled
