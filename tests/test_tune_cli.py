"""`dsv4deploy tune` as a user runs it: --plan with no host and nothing written, bad input exit 2
naming the key, exit 1 with no backend; and the whole run against a stand-in backend."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from checkout import load_profile, profiles_dir
from dsv4deploy.tune.backend import Backend
from dsv4deploy.tune.command import TuneFolders, prepare, run_tune
from dsv4deploy.profile.validate import validate

from tune_fakes import FakeClock, TableMeasure


@pytest.fixture(autouse=True)
def _no_shipped_tuned_profile(request):
    """These tests write fp8-ctx1m-baseline-tuned.yaml themselves: start without the shipped one."""
    if "profile_dir" in request.fixturenames:
        request.getfixturevalue("profile_dir").path.joinpath("fp8-ctx1m-baseline-tuned.yaml").unlink(missing_ok=True)

REPO = Path(__file__).resolve().parent.parent


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dsv4deploy", "tune", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


def snapshot(*folders: Path) -> dict:
    """Every path under FOLDERS and its mtime; under reports/ only what a tune writes (tune-*):
    the deploys of make test's other pytest processes write reports/<host>/ meanwhile."""
    def ours(p: Path) -> bool:
        rel = p.relative_to(REPO / "reports").parts if p.is_relative_to(REPO / "reports") else ()
        return not rel or (rel[0].startswith("tune-") and not re.fullmatch(r"tune-[0-9]+", rel[0]))
    return {str(p): p.stat().st_mtime_ns for f in folders if f.exists() for p in f.rglob("*") if ours(p)}


def test_plan_lists_candidates_and_refusals_with_reasons_and_writes_nothing(profile_dir, tmp_path):
    watched = (profile_dir.path, REPO / "reports", REPO / ".cache" / "tune", tmp_path)
    before = snapshot(*watched)
    out = run("fp8-ctx1m-baseline", "--plan", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "tune fp8-ctx1m-baseline: 13 candidates, 9 to try, 4 refused (never measured)"
    rows = [line.split(None, 2) for line in lines if line[:4] in ("base", "c01 ", "c03 ")]
    assert rows[0] == ["base", "try", "(the base profile as it is)"]
    assert rows[1] == ["c01", "try", "server.context_length=8192"]
    assert rows[2][:2] == ["c03", "refused"] and "server.mem_fraction_static=0.85" in rows[2][2]
    assert sum("reason: server.mem_fraction_static: CUDA-graph capture would run out" in x for x in lines) == 4
    assert any(line.split(None, 2)[1:] == ["try", "replicas.count=2, server.context_length=8192"]
               for line in lines if line.startswith("c"))       # the layout is searched
    assert snapshot(*watched) == before


def test_plan_json_is_machine_readable(profile_dir):
    out = run("fp8-ctx1m-baseline", "--plan", "--json", "--set", "server.context_length=8192",
              "--set", "replicas.count=1")
    doc = json.loads(out.stdout)
    assert doc["concurrency"] == 64 and doc["tuned_profile"] == "fp8-ctx1m-baseline-tuned"
    assert [c["status"] for c in doc["candidates"]] == ["try", "try", "try", "refused"]


@pytest.mark.parametrize("args, words", [
    (["--set", "server.contxt_length=8192"], "--set server.contxt_length: unknown knob"),
    (["--set", "server.context_length=128k"], "--set server.context_length: '128k': expected a plain integer"),
    (["--set", "nccl.preset=fast"], "--set nccl.preset: 'fast' is not one of"),
    (["--budget-s", "10"], "--budget-s: 10 is out of range"),
    (["--concurrency", "0"], "--concurrency: 0 is out of range"),
])
def test_bad_input_exits_2_naming_the_key_and_writes_nothing(profile_dir, tmp_path, args, words):
    before = snapshot(profile_dir.path, tmp_path)
    out = run("fp8-ctx1m-baseline", *args, "--state-dir", str(tmp_path / "s"), "--reports-dir", str(tmp_path / "r"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.startswith("<command line>: ") and words in out.stderr
    assert "Traceback" not in out.stderr
    assert snapshot(profile_dir.path, tmp_path) == before


def test_a_bad_tune_block_exits_2_with_file_and_line(profile_dir):
    profile_dir.write("typo", """
        extends: fp8-ctx1m-baseline
        tune:
          space:
            server.mem_fraction: [0.7]
    """)
    out = run("typo", "--plan")
    assert out.returncode == 2 and "typo.yaml:4: tune.space" in out.stderr and "did you mean" in out.stderr


def test_without_a_reachable_host_it_says_so_and_exits_1_writing_nothing(profile_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path / "no-twins"))
    out = run("fp8-ctx1m-baseline", "--state-dir", str(tmp_path / "s"), "--reports-dir", str(tmp_path / "r"))
    assert out.returncode == 1, out.stderr
    assert "cannot reach the host of inventory/sim.py" in out.stderr and "no CT200 twin is running" in out.stderr
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()
    assert not (profile_dir.path / "fp8-ctx1m-baseline-tuned.yaml").exists()


def test_make_tune_plan(profile_dir):
    out = subprocess.run(["make", "-s", "--no-print-directory", "-o", ".venv/.installed", "tune", "PROFILE=fp8-ctx1m-baseline", "PLAN=1",
                          "BIN=" + str(Path(sys.executable).parent)],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "4 refused (never measured)" in out.stdout


# --- the whole run, with a stand-in for the host ------------------------------------------------

class StandIn:
    """A backend as open_backend must return: measure from a table, settle recorded."""

    def __init__(self, table):
        self.clock = FakeClock()
        self.measure = TableMeasure(table, self.clock)
        self.settled = []

    def backend(self) -> Backend:
        def settle(chosen, tuned):
            self.settled.append((chosen.id if chosen else None, tuned))
            return f"serving {tuned or 'the starting release'}"
        return Backend(self.measure, settle)


def table_for(prep, speed):
    return {frozenset(c.overrides.items()): (speed(c.overrides), 300.0, 100.0, 0) for c in prep.ready}


def test_a_run_writes_the_tuned_profile_and_the_report_and_serves_the_winner(profile_dir, tmp_path):
    prep = prepare("fp8-ctx1m-baseline", directory=profiles_dir())
    stand_in = StandIn(table_for(prep, lambda o: {8192: 531.7, 32768: 450.0}.get(o.get("server.context_length"), 29.7)))
    outcome = run_tune(prep, stand_in.backend(), TuneFolders(tmp_path / "s", tmp_path / "r"),
                       clock=stand_in.clock, log=lambda s: None, png=False)
    assert outcome.result.chosen.overrides == {"server.context_length": 8192}
    assert stand_in.settled == [(outcome.result.chosen.id, "fp8-ctx1m-baseline-tuned")]
    tuned = yaml.safe_load(outcome.tuned_profile.read_text())
    assert tuned["extends"] == "fp8-ctx1m-baseline" and tuned["server"] == {"context_length": 8192}
    assert set(tuned) == {"extends", "description", "server"}
    assert validate(load_profile("fp8-ctx1m-baseline-tuned")).ok
    doc = json.loads(next(p for p in outcome.report_files if p.name == "tune.json").read_text())
    assert doc["chosen"] == outcome.result.chosen.id and doc["tuned_profile"] == str(outcome.tuned_profile)
    assert outcome.report_files[0].parent.name.startswith("tune-fp8-ctx1m-baseline-")
    assert (tmp_path / "s" / "fp8-ctx1m-baseline.json").exists()


def test_a_run_that_finds_nothing_better_writes_no_profile_and_keeps_the_starting_release(profile_dir, tmp_path):
    prep = prepare("fp8-ctx1m-baseline", ["server.context_length=8192,32768", "server.mem_fraction_static=0.7"], directory=profiles_dir())
    stand_in = StandIn(table_for(prep, lambda o: 600.0 if not o else 450.0))   # the base is the fastest
    outcome = run_tune(prep, stand_in.backend(), TuneFolders(tmp_path / "s", tmp_path / "r"),
                       clock=stand_in.clock, log=lambda s: None, png=False)
    assert outcome.result.chosen is None and outcome.tuned_profile is None
    assert stand_in.settled == [(None, None)]
    assert not (profile_dir.path / "fp8-ctx1m-baseline-tuned.yaml").exists()
    assert "serving the starting release" in (outcome.report_files[0].parent / "tune.md").read_text()


def test_a_second_run_reuses_every_measurement(profile_dir, tmp_path):
    prep = prepare("fp8-ctx1m-baseline", directory=profiles_dir())
    speed = lambda o: {8192: 531.7}.get(o.get("server.context_length"), 450.0)  # noqa: E731
    first, second = StandIn(table_for(prep, speed)), StandIn(table_for(prep, speed))
    kw = dict(log=lambda s: None, png=False)
    folders = TuneFolders(tmp_path / "s", tmp_path / "r")
    a = run_tune(prep, first.backend(), folders, clock=first.clock, **kw)
    b = run_tune(prep, second.backend(), folders, clock=second.clock, **kw)
    assert first.measure.calls and not second.measure.calls
    assert a.result.chosen.id == b.result.chosen.id


@pytest.mark.slow
def test_a_hand_written_tuned_profile_is_a_note_in_the_plan_and_refused_by_a_run(profile_dir, tmp_path):
    profile_dir.write("fp8-ctx1m-baseline-tuned", "extends: fp8-ctx1m-baseline\n")
    plan = run("fp8-ctx1m-baseline", "--plan")
    assert plan.returncode == 0 and "note: a run would refuse to start" in plan.stdout
    out = run("fp8-ctx1m-baseline", "--state-dir", str(tmp_path / "s"))
    assert out.returncode == 2 and "was not written by dsv4deploy tune" in out.stderr
    assert not (tmp_path / "s").exists()


def test_a_cut_off_run_puts_the_starting_release_back_and_keeps_its_measurements(profile_dir, tmp_path):
    prep = prepare("fp8-ctx1m-baseline", directory=profiles_dir())
    stand_in = StandIn(table_for(prep, lambda o: 531.7))
    stand_in.measure.interrupt_after = 2
    with pytest.raises(KeyboardInterrupt):
        run_tune(prep, stand_in.backend(), TuneFolders(tmp_path / "s", tmp_path / "r"),
                 clock=stand_in.clock, log=lambda s: None, png=False)
    assert stand_in.settled == [(None, None)]
    saved = json.loads((tmp_path / "s" / "fp8-ctx1m-baseline.json").read_text())
    assert sum(len(v) for v in saved["trials"].values()) == 2
    assert not (profile_dir.path / "fp8-ctx1m-baseline-tuned.yaml").exists()
