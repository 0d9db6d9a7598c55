"""The tune report: JSON with every candidate (refused ones with reasons) and the front,
Markdown, and a PNG plot."""

from __future__ import annotations

import json

import pytest

from checkout import profiles_dir
from dsv4deploy.tune.command import prepare
from dsv4deploy.tune.report import TuneReport, report_dir, write_report
from dsv4deploy.tune.scheduler import successive_halving
from dsv4deploy.tune.state import TuneState

from tune_fakes import FakeClock, TableMeasure


@pytest.fixture
def rep(profile_dir):
    prep = prepare("fp8-ctx1m-baseline", directory=profiles_dir())
    speeds = {None: 29.7, 8192: 531.7, 32768: 450.0}

    def speed(o):   # two replicas serve more; 0.75 a little more than 0.70
        return (speeds[o.get("server.context_length")] * (1.4 if o.get("replicas.count") == 2 else 1.0)
                + 10 * (o.get("server.mem_fraction_static") == 0.75))
    table = {frozenset(c.overrides.items()): (speed(c.overrides), 300.0, 64_000 / speed(c.overrides), 0)
             for c in prep.ready}
    clock = FakeClock()
    result = successive_halving(prep.candidates, prep.method, TableMeasure(table, clock),
                                TuneState(None, prep.base.name, prep.method), budget_s=10_000, clock=clock)
    return TuneReport(prep.base.name, prep.space, prep.method, prep.candidates, result, "profiles/x-tuned.yaml")


def test_json_lists_every_candidate_with_its_status_refused_ones_with_the_validators_reason(rep, tmp_path):
    files = write_report(rep, tmp_path / "r", png=False)
    doc = json.loads((tmp_path / "r" / "tune.json").read_text())
    assert [p.name for p in files] == ["tune.json", "tune.md"]
    assert len(doc["candidates"]) == len(rep.candidates) == 13
    refused = [c for c in doc["candidates"] if c["status"] == "refused"]
    assert len(refused) == 4 and all("CUDA-graph capture would run out" in c["why"] for c in refused)
    assert all(not c["trials"] for c in refused)
    assert doc["chosen"] == rep.result.chosen.id
    assert doc["chosen_overrides"] == {"replicas.count": 2, "server.context_length": 8192,
                                        "server.mem_fraction_static": 0.75}
    chosen = next(c for c in doc["candidates"] if c["id"] == doc["chosen"])
    assert chosen["status"] == "chosen" and chosen["trials"][-1]["num_prompts"] == 128
    assert doc["front"]["p99_tpot_ms"][-1] == doc["chosen"]


def test_markdown_has_the_verdict_and_a_row_per_candidate(rep, tmp_path):
    write_report(rep, tmp_path, png=False)
    md = (tmp_path / "tune.md").read_text()
    assert rep.result.verdict in md
    assert sum(1 for line in md.splitlines() if line.startswith("| c") or line.startswith("| base")) == 13
    assert "| refused |" in md and "Pareto front" in md


def test_the_plot_is_a_png(rep, tmp_path):
    files = write_report(rep, tmp_path)
    png = tmp_path / "tune.png"
    assert png in files and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "![tune plot](tune.png)" in (tmp_path / "tune.md").read_text()


def test_the_report_folder_is_named_after_the_profile_and_the_utc_time(tmp_path):
    assert report_dir(tmp_path, "fp8-ctx1m-baseline", 0).name == "tune-fp8-ctx1m-baseline-19700101T000000Z"
