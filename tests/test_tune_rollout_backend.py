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
    slow = rb.measurement_from_report(json.loads((FIX / "gate-cannot-reach.json").read_text()), 64, None)
    assert slow.cannot_reach and slow.gate_passed is False


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
