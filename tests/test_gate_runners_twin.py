"""SGLang's own bench_serving gates a twin deploy, and agrees with the built-in client (issue 36,
item 6). On an isolated twin whose venv is the real host's (its lock: sglang 0.5.23, CUDA torch,
transformers; DSV4_SIM_LAUNCH_CHECK=sglang, the default) and whose stand-in checkpoint carries a
tokenizer, the gate's `auto` runner picks bench_serving as on a real host; then both runners
measure the same server at every level of nvfp4-ctx8k's gate (ct200twin/host/gate_runs.py).

The fleet is DSV4_SIM_BENCH_FLEET (default `bench`): a twin of its own, stopped at the end.
"""

from __future__ import annotations

import json
import os

import pytest

from sim_fixtures import _isolated_twin

from ct200twin.faultlab import FAST_START, FAULTS, QUICK_GATE, REPO, deploy, releases
from ct200twin.host import gate_runs

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

BENCH_FLEET = os.environ.get("DSV4_SIM_BENCH_FLEET", "bench")
ENV = {"DSV4_SIM_FLEET": BENCH_FLEET, "DSV4_SIM_LAUNCH_CHECK": "sglang"}
QUICK = "bsquick"          # nvfp4-ctx8k's server with a short gate: the deploy proves the runner, not the rate
TOLERANCE = 0.01


@pytest.fixture(scope="module")
def bench_twin():
    yield from _isolated_twin(BENCH_FLEET)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profiles")
    for src in (REPO / "profiles").glob("*.yaml"):
        (folder / src.name).write_text(src.read_text())
    (folder / f"{QUICK}.yaml").write_text("extends: nvfp4-ctx8k\n" + QUICK_GATE)
    return folder


@pytest.fixture(scope="module")
def served(bench_twin, profiles):
    """The twin serving nvfp4-ctx8k's server, deployed with the short gate."""
    bench_twin.write_file(FAULTS, json.dumps(FAST_START))
    out = deploy(QUICK, env=ENV, profiles_dir=profiles, inventory="inventory/fleet-sim.py", timeout=1800)
    yield bench_twin, out
    bench_twin.run(f"rm -f {FAULTS}", check=False)


def test_a_twin_deploy_is_gated_by_bench_serving_as_the_gate_account(served):
    twin, out = served
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    last = releases(twin)[-1]
    assert last["status"] == "deployed" and last["gate"]["passed"], last
    doc = json.loads(twin.read_file(f"/var/lib/dsv4deploy/releases/{last['release']:04d}/gate/gate.json"))
    result = doc["result"]
    assert result["runner"] == "bench_serving", result["client"].get("runner_choice")
    assert result["client"]["runner_choice"].startswith("auto: ")       # picked, as on a real host
    for level in result["levels"]:
        assert level["status"] == "ok" and level["completed"] == level["num_prompts"], level
        # the checkpoint's tokenizer counts what came back as the server counted it
        assert level["extra"]["total_output_tokens_retokenized"] == level["total_output_tokens"]
    # nothing of the gate account's caches is left behind
    assert twin.run("ls -d /tmp/dsv4deploy-gate.* 2>/dev/null | wc -l").stdout.strip() == "0"


def test_both_runners_agree_within_one_percent_at_every_level(served, profiles):
    twin, _ = served
    spec, server = gate_runs.deployed_server("nvfp4-ctx8k", profiles)
    results = gate_runs.run_both(twin, spec, server)
    assert results["bench_serving"].runner == "bench_serving" and results["builtin"].runner == "builtin"
    pairs = gate_runs.agreements(results)
    assert [p.label for p in pairs] == [lv.label for lv in spec.levels]
    table = "\n".join([gate_runs.HEADER] + [p.row() for p in pairs])
    for pair in pairs:
        assert pair.builtin.status == pair.bench_serving.status == "ok", table
        for name, (ours, theirs) in pair.tokens().items():
            assert ours == theirs, f"{pair.label} {name}: {ours} vs {theirs}\n{table}"
        assert abs(pair.throughput_gap) <= TOLERANCE, table
