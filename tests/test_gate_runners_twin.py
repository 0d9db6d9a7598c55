"""SGLang's bench_serving agrees with the built-in gate client (issue 36, item 6), on an isolated
twin of its own whose venv is the real host's lock (sglang 0.5.23, CUDA torch, transformers), as
the default twin's is, and whose stand-in checkpoint carries a tokenizer. make test runs it in a
process of its own beside the default twin's (the deploy gated by bench_serving through `auto` is
tests/test_deploy_twin.py's first); the fixture deploys a short-gated profile when nothing serves.

Both runners measure the same server at the gate's concurrencies (1, 16, 64; 256 in / 256 out),
each level sized to about 30 s on the twin (24, 265 and 530 tok/s): bench_serving's clock carries a
fixed 20-80 ms of its own start per level (once 660 ms under load), 0.1-0.3% of 30 s; levels of
2-6 s were 0.5-10.9% apart, the profile's full levels (46-85 s) 0.17%. The full every-level
comparison is bench/gate_runners.py's (bench/results/bench-serving-gate-2026-12-05.md).
"""

from __future__ import annotations

import json

import pytest

from sim_fixtures import RUNNER_ENV, runner_twin  # noqa: F401

from ct200twin.faultlab import FAST_START, FAULTS, QUICK_GATE, REPO, deploy, health
from ct200twin.host import gate_runs
from dsv4deploy.gate.spec import GateSpec, LevelSpec

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

# nvfp4-ctx8k's server with a short gate of the built-in client, when nothing serves yet (the
# deploy only brings a server up; bench_serving's start costs ~19 s a level)
QUICK = "bsquick"
# Two runs of ~30 s, one after the other, on make test's machine (five pytest processes on two
# cores) differ by about 1% from the load alone (seen: C=1 -1.05%, C=16 +0.98%, C=64 -0.12% in one
# fresh-clone run): the test allows 2%. The 1% agreement itself is measured on the profile's full
# levels by bench/gate_runners.py (0.17% at most: bench/results/bench-serving-gate-2026-12-05.md).
TOLERANCE = 0.02
# (concurrency, prompts): about 30 s each at the twin's 24, 265 and 530 tok/s
SPEC = GateSpec(levels=tuple(LevelSpec(c, n) for c, n in ((1, 3), (16, 32), (64, 64))))


@pytest.fixture(scope="module")
def served(runner_twin, tmp_path_factory):  # noqa: F811
    """The runners' twin and the server its live release serves (deployed here when nothing serves)."""
    twin = runner_twin
    server = gate_runs.served_server(twin)
    if server is None or health(twin) != "200":
        folder = tmp_path_factory.mktemp("profiles")
        (folder / f"{QUICK}.yaml").write_text("extends: nvfp4-ctx8k\n" + QUICK_GATE + "  runner: builtin\n")
        for src in (REPO / "profiles").glob("*.yaml"):
            (folder / src.name).write_text(src.read_text())
        twin.write_file(FAULTS, json.dumps(FAST_START))
        try:
            out = deploy(QUICK, profiles_dir=folder, timeout=1800, inventory="inventory/fleet-sim.py", env=RUNNER_ENV)
        finally:
            twin.run(f"rm -f {FAULTS}", check=False)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
        server = gate_runs.served_server(twin)
    return twin, server


def test_both_runners_count_the_same_and_agree_within_one_percent(served):
    twin, server = served
    results = gate_runs.run_both(twin, SPEC, server)
    assert results["bench_serving"].runner == "bench_serving" and results["builtin"].runner == "builtin"
    pairs = gate_runs.agreements(results)
    assert [p.label for p in pairs] == [lv.label for lv in SPEC.levels]
    table = "\n".join([gate_runs.HEADER] + [p.row() for p in pairs])
    for pair in pairs:
        assert pair.builtin.status == pair.bench_serving.status == "ok", table
        for name, (ours, theirs) in pair.tokens().items():
            assert ours == theirs, f"{pair.label} {name}: {ours} vs {theirs}\n{table}"
        # the checkpoint's tokenizer counts what came back as the server counted it
        assert pair.bench_serving.extra["total_output_tokens_retokenized"] == pair.bench_serving.total_output_tokens
        assert abs(pair.throughput_gap) <= TOLERANCE, table
    # nothing of the gate account's caches is left behind
    assert twin.run("ls -d /tmp/dsv4deploy-gate.* 2>/dev/null | wc -l").stdout.strip() == "0"
