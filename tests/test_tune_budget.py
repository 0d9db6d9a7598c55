"""The tuner and the deploy use the host's calibrated memory budget (tune/budget.py, rollout_for):
a candidate the host's own starts refuse is never deployed, and the refusal names the release that
showed it; a candidate that ran out of memory at start refuses its neighbours (same memory layout,
same or higher fraction) before they are tried."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pyinfra.api import DeployError

from checkout import load_profile, profiles_dir, settings
from dsv4deploy.cli.settings import Settings
from dsv4deploy.profile import calibration
from dsv4deploy.release.rollout import rollout_for
from dsv4deploy.tune.budget import Screen, calibrate_candidates, memory_layout
from dsv4deploy.tune.command import prepare
from dsv4deploy.tune.objective import Measurement
from dsv4deploy.tune.scheduler import Scheduler
from dsv4deploy.tune.state import TuneState

from tune_fakes import FakeClock, TableMeasure, key

CTX, MEM = "server.context_length", "server.mem_fraction_static"
OOM_TEXT = "release 0007 ran out of GPU memory at start at 0.75 (asked 2.20 GiB, 0.88 GiB free)"


@pytest.fixture
def prep():
    """base (1M context, 0.70), then context 8192 / 32768 x fraction 0.70 / 0.75, one server."""
    return prepare("fp8-ctx1m-baseline", [f"{CTX}=8192,32768", f"{MEM}=0.70,0.75", "replicas.count=1"],
                   directory=profiles_dir())


def by(prep, **overrides):
    wanted = {k.replace("__", "."): v for k, v in overrides.items()}
    return next(c for c in prep.candidates if c.overrides == wanted)


def oom_evidence(cand, host: str = "ct200", number: int = 7) -> dict:
    """The host's calibration after CAND's layout ran out of memory at start at 0.75."""
    layout = calibration.layout(cand.profile.data, cand.report.budget)
    return {"host": host, "evidence": [{"release": number, "profile": "x", "layout": layout, "fraction": 0.75,
                                        "kind": "oom", "need_gib": 24.2, "text": OOM_TEXT}]}


def run(prep, table, screen):
    clock = FakeClock()
    measure = TableMeasure(table, clock)
    result = Scheduler(prep.method, measure, TuneState(None, prep.base.name, prep.method), budget_s=10_000,
                       clock=clock, screen=screen).run(prep.candidates)
    return result, measure


TABLE = {key(): (29.7, 900.0, 2100.0, 0),
         key(**{CTX: 8192}): (531.7, 300.0, 118.0, 0),
         key(**{CTX: 8192, MEM: 0.75}): Measurement(0.0, error="no gate ran (exit 1): release 0003 failed: out of "
                                                             "memory at start", out_of_memory=True),
         key(**{CTX: 32768}): (450.0, 400.0, 140.0, 0),
         key(**{CTX: 32768, MEM: 0.75}): (460.0, 400.0, 140.0, 0)}


def test_context_does_not_change_the_memory_layout_but_the_fraction_is_not_part_of_it(prep):
    a, b = by(prep, server__context_length=8192), by(prep, server__context_length=32768, server__mem_fraction_static=0.75)
    assert memory_layout(a) == memory_layout(b) is not None


def test_a_candidate_that_ran_out_of_memory_refuses_its_neighbours_before_they_are_tried(prep):
    result, measure = run(prep, TABLE, Screen())
    oom = by(prep, server__context_length=8192, server__mem_fraction_static=0.75).id
    neighbour = by(prep, server__context_length=32768, server__mem_fraction_static=0.75).id
    lower = by(prep, server__context_length=32768).id
    measured = {cid for cid, _ in measure.calls}
    assert oom in measured and neighbour not in measured and lower in measured
    assert f"{oom} ran out of GPU memory at start at 0.75" in result.refused[neighbour][0]
    assert result.chosen.overrides == {CTX: 8192}


def test_without_the_screen_the_neighbour_would_have_been_deployed(prep):
    _, measure = run(prep, TABLE, None)
    assert by(prep, server__context_length=32768, server__mem_fraction_static=0.75).id in {c for c, _ in measure.calls}


def test_the_calibration_a_deploy_rewrites_is_read_again_before_the_next_deploy(prep):
    """The OOM's figures land in the host's calibration (the deploy writes it); a 0.75 candidate of
    that layout queued after it is refused with the release named, though the search itself did not
    flag the failure as out of memory."""
    doc = {"now": None}
    oom = by(prep, server__context_length=8192, server__mem_fraction_static=0.75)
    table = {**TABLE, key(**{CTX: 8192, MEM: 0.75}): Measurement(0.0, error="no gate ran (exit 1)")}

    class Deploys(TableMeasure):
        def __call__(self, candidate, level):
            if candidate.id == oom.id:
                doc["now"] = oom_evidence(oom)
            return super().__call__(candidate, level)

    clock = FakeClock()
    measure = Deploys(table, clock)
    result = Scheduler(prep.method, measure, TuneState(None, "x", prep.method), budget_s=10_000, clock=clock,
                       screen=Screen(lambda: doc["now"])).run(prep.candidates)
    neighbour = by(prep, server__context_length=32768, server__mem_fraction_static=0.75).id
    assert neighbour not in {c for c, _ in measure.calls}
    assert any(f"ct200: {OOM_TEXT}" in why for why in result.refused[neighbour])


def test_before_the_search_the_hosts_calibration_refuses_what_it_must(prep):
    doc = oom_evidence(prep.candidates[0])
    refused = calibrate_candidates(prep.candidates, doc)
    high = {c.id for c in prep.candidates if c.overrides.get(MEM) == 0.75}
    assert set(refused) == high
    for cid in high:
        cand = next(c for c in prep.candidates if c.id == cid)
        assert cand.refused and any(f"on ct200: {OOM_TEXT}" in r for r in cand.reasons)
    assert not prep.candidates[0].refused and calibrate_candidates(prep.candidates, None) == []


def test_a_deploy_refuses_a_fraction_the_hosts_own_evidence_refuses(tmp_path, prep):
    base = settings()
    run_settings = Settings(checkout=base.checkout, profiles=base.profiles, reports=tmp_path / "reports",
                            cache=base.cache, environ=base.environ)
    data = {"weights_source": {"type": "hf"}, "profile": "nvfp4-ctx8k", "settings": run_settings}
    assert rollout_for(data, "ct200").report.ok                         # no calibration yet: the model's budget
    nvfp4 = load_profile("nvfp4-ctx8k")
    cand = replace(prep.candidates[0], profile=nvfp4)
    from dsv4deploy.profile.validate import validate
    cand.report = validate(nvfp4)
    doc = oom_evidence(cand)
    doc["evidence"][0]["fraction"], doc["evidence"][0]["need_gib"] = 0.70, 28.0   # 0.70 itself ran out
    calibration.write(calibration.path_for(tmp_path / "reports", "ct200"), doc)
    with pytest.raises(DeployError) as exc:
        rollout_for(data, "ct200")
    assert "server.mem_fraction_static" in str(exc.value) and f"on ct200: {OOM_TEXT}" in str(exc.value)
    assert rollout_for(data, "other-host").report.ok                    # another host's evidence is not this one's
    (tmp_path / "reports" / "ct200" / "calibration.json").write_text("{broken")
    with pytest.raises(DeployError, match="calibration.json:1: not JSON"):
        rollout_for(data, "ct200")
    assert json.loads(json.dumps(doc))       # the evidence is plain JSON
