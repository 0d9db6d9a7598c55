"""dsv4deploy/tune/rollout_backend.py: a candidate deployed as a release and measured by the
gate's own report. The runner is a stand-in for `pyinfra deploy/serve.py` that prints what the
rollout prints and leaves a recorded gate report (tests/fixtures/tune/) where the rollout does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from checkout import load_profile, profiles_dir
from dsv4deploy.cli.settings import Settings
from dsv4deploy.tune import rollout_backend as rb
from dsv4deploy.tune.candidates import Candidate, candidate_profile
from dsv4deploy.tune.objective import Level

FIX = Path(__file__).parent / "fixtures" / "tune"
LEVEL = Level(index=1, concurrency=64, num_prompts=128, input_len=256, output_len=256, final=True, floor=400.0)


@pytest.fixture
def base():
    return load_profile("fp8-ctx1m-baseline")


def _cand(base, overrides):
    return Candidate(3, overrides, candidate_profile(base, overrides), "k")


def test_the_candidate_profile_extends_the_base_with_its_overrides_and_one_gate_level(base, tmp_path):
    cand = _cand(base, {"server.context_length": 8192, "nccl.preset": "p2p"})
    doc = rb.candidate_document(base, cand, LEVEL)
    assert doc["extends"] == "fp8-ctx1m-baseline"
    assert doc["server"] == {"context_length": 8192} and doc["nccl"] == {"preset": "p2p"}
    assert doc["gate"] == {"levels": [{"concurrency": 64, "num_prompts": 128, "input_len": 256, "output_len": 256,
                                       "min_output_throughput": 400.0}]}
    # it is a deployable profile: it loads and validates through the real code
    for p in profiles_dir().glob("*.yaml"):
        shutil.copyfile(p, tmp_path / p.name)
    (tmp_path / "cand.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    from dsv4deploy.profile.validate import validate
    prof = load_profile("cand", tmp_path)
    assert prof.data["server"]["context_length"] == 8192 and not validate(prof).errors


def test_measurement_from_recorded_gate_reports():
    passed = rb.measurement_from_report(json.loads((FIX / "gate-pass-c64.json").read_text()), 64, 25)
    assert passed.output_throughput > 400 and passed.gate_passed and not passed.cannot_reach
    assert passed.p99_ttft_ms is not None and passed.failed == 0 and passed.release == 25
    # the gate passed C=64 early: the figure rests on its first 64 of 128 requests, and says so
    assert passed.passed_early and (passed.completed, passed.num_prompts) == (64, 128)
    assert passed.basis() == " (passed early: 64 of 128 requests)"
    slow = rb.measurement_from_report(json.loads((FIX / "gate-cannot-reach.json").read_text()), 64, None)
    assert slow.cannot_reach and slow.gate_passed is False and not slow.passed_early and slow.basis() == ""


def _settings(checkout: Path) -> Settings:
    """The run's settings: the shipped profiles, the reports under CHECKOUT (a scratch folder)."""
    return Settings.from_environment({"DSV4_PROFILES_DIR": str(profiles_dir())}, checkout)


def _runner(report: str | None, settings: Settings, rc: int = 0, release: str = "0007"):
    calls = []

    def run(inventory, profile, profiles, extra):
        calls.append((inventory, profile, Path(profiles)))
        if report is None:
            return 1, "preflight refused the host:\n  - tp_size 4 needs 4 GPUs"
        folder = settings.reports / "h" / f"{release}-{profile}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(FIX / report, folder / "gate.json")
        done = f"release {release} deployed: {profile} is serving" if rc == 0 else "failed the smoke gate"
        return rc, f"[h] gate report: {settings.shown(folder)}\n[h] {done}\n"
    return run, calls


def test_measure_deploys_the_candidate_file_and_reads_its_report(base, tmp_path):
    settings = _settings(tmp_path)
    run, calls = _runner("gate-pass-c64.json", settings)
    backend = rb.RolloutBackend("inventory/sim.py", base, None, settings, runner=run)
    try:
        m = backend.measure(_cand(base, {"server.context_length": 8192}), LEVEL)
        (inventory, name, folder), = calls
        assert name == "fp8-ctx1m-baseline-tune-c03-l1" and (folder / f"{name}.yaml").is_file()
        assert (folder / "fp8-ctx1m-baseline.yaml").is_file()          # the chain it extends is there
        assert m.output_throughput > 400 and m.release == 7 and m.error is None
    finally:
        backend.close()
    assert not folder.exists()


def test_a_candidate_that_never_reached_its_gate_is_an_error_not_an_exception(base, tmp_path):
    settings = _settings(tmp_path)
    run, _ = _runner(None, settings)
    backend = rb.RolloutBackend("inventory/sim.py", base, None, settings, runner=run)
    try:
        m = backend.measure(_cand(base, {"server.context_length": 8192}), LEVEL)
    finally:
        backend.close()
    assert m.error and m.error.startswith("no gate ran (exit 1): preflight refused the host:") and "tp_size 4 needs 4 GPUs" in m.error


# --- a replica set is scored where users reach it: through its gateway ------------------------

def _gate(folder: Path, tok_s: float, split: list[int] | None = None) -> None:
    """A gate report at FOLDER: the recorded pass at C=64 with TOK_S output tok/s, and through a
    gateway the requests each replica served (SPLIT)."""
    doc = json.loads((FIX / "gate-pass-c64.json").read_text())
    for level in doc["result"]["levels"]:
        if level["concurrency"] == 64:
            level["output_throughput"] = tok_s
    doc["result"]["replicas"] = [{"index": i, "url": f"http://127.0.0.1:{30001 + i}", "requests": n}
                                 for i, n in enumerate(split or [])]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gate.json").write_text(json.dumps(doc))


def _set_runners(settings: Settings, rolled: bool):
    """pyinfra stand-in: a rolled set gates each replica alone (529.6, 529.8 tok/s), a set started
    together is gated through its gateway (760 tok/s); `dsv4deploy bench` stand-in: the gateway."""
    calls = []

    def deploy(inventory, profile, profiles, extra):
        calls.append(("deploy", profile))
        host = settings.reports / "h"
        if rolled:
            lines = []
            for i, tok in enumerate((529.6, 529.8)):
                _gate(host / f"0009-{profile}-replica-{i}", tok)
                lines.append(f"[h] gate report: {settings.shown(host / f'0009-{profile}-replica-{i}')}")
            return 0, "\n".join(lines + [f"[h] release 0009 deployed: {profile} serves from 2 replicas"]) + "\n"
        _gate(host / f"0009-{profile}", 760.0, [64, 64])
        return 0, f"[h] gate report: {settings.shown(host / f'0009-{profile}')}\n[h] release 0009 deployed\n"

    def bench(inventory, profile, profiles, extra):
        calls.append(("bench", profile))
        _gate(settings.reports / "h" / f"adhoc-{profile}", 758.0, [64, 64])
        return 0, f"[h] gate report: {settings.shown(settings.reports / 'h' / f'adhoc-{profile}')}\n"
    return deploy, bench, calls


@pytest.mark.parametrize("rolled", [True, False])
def test_a_two_replica_candidate_scores_its_sets_throughput_through_the_gateway(base, tmp_path, rolled):
    settings = _settings(tmp_path)
    deploy, bench, calls = _set_runners(settings, rolled)
    backend = rb.RolloutBackend("inventory/sim.py", base, None, settings, runner=deploy, bench=bench)
    try:
        m = backend.measure(_cand(base, {"replicas.count": 2, "server.context_length": 8192}), LEVEL)
    finally:
        backend.close()
    assert m.scope == "through the gateway (2 replicas)" and m.requests_per_replica == [64, 64]
    assert m.release == 9 and m.error is None and m.gate_passed
    if rolled:      # the release's own figure would be the weakest replica's 529.6
        assert m.output_throughput == 758.0 and [k for k, _ in calls] == ["deploy", "bench"]
        assert m.per_replica == [{"replica": 0, "output_throughput": 529.6, "passed": True},
                                 {"replica": 1, "output_throughput": 529.8, "passed": True}]
    else:           # gated through the gateway by the deploy itself: nothing more to run
        assert m.output_throughput == 760.0 and [k for k, _ in calls] == ["deploy"] and m.per_replica == []


def test_an_out_of_memory_start_is_flagged_for_the_budget(base, tmp_path):
    settings = _settings(tmp_path)

    def deploy(inventory, profile, profiles, extra):
        return 1, ("[h] release 0004: SGLang at start: out of memory at start: tried to allocate 2.20 GiB\n"
                   "[h] release 0004 (x) failed: the server did not become healthy\n")
    backend = rb.RolloutBackend("inventory/sim.py", base, None, settings, runner=deploy)
    try:
        m = backend.measure(_cand(base, {"server.context_length": 8192}), LEVEL)
    finally:
        backend.close()
    assert m.error and m.out_of_memory
