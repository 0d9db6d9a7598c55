"""`dsv4deploy tune`: what the command does, step by step, for cli.py to call.

`prepare` checks every input first (the base profile, the space, the name and place of the tuned
profile) and raises ProfileError (exit 2) before anything is written. `plan_text` / `plan_json`
show the candidates and touch nothing. `run_tune` measures through an injected backend, keeps
its state in its TuneFolders (.cache/tune/ from the command), then writes the tuned profile
(validated on the way), the report, and lets the backend settle the host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.profile.load import Profile, load_profile
from dsv4deploy.profile.validate import validate
from dsv4deploy.tune.backend import Backend
from dsv4deploy.tune.budget import Screen, calibrate_candidates
from dsv4deploy.tune.candidates import Candidate, build_candidates
from dsv4deploy.tune.objective import Method, method_for
from dsv4deploy.tune.report import TuneReport, report_dir, write_report
from dsv4deploy.tune.scheduler import Scheduler, TuneResult
from dsv4deploy.tune.space import Space, build_space
from dsv4deploy.tune.state import TuneState
from dsv4deploy.tune.tuned import check_target, tuned_name, write_tuned


@dataclass(frozen=True)
class TuneFolders:
    """Where a tune keeps its resumable state (one file per base profile) and writes its report
    folder: the command's .cache/tune and reports, unless --state-dir / --reports-dir."""

    state: Path
    reports: Path


@dataclass
class Prepared:
    base: Profile
    space: Space
    method: Method
    candidates: list[Candidate]
    tuned_name: str
    tuned_path: Path
    tuned_problem: str = ""    # --plan only: why the tuned profile could not be written (a run refuses)

    @property
    def refused(self) -> list[Candidate]:
        return [c for c in self.candidates if c.refused]

    @property
    def ready(self) -> list[Candidate]:
        return [c for c in self.candidates if not c.refused]


def prepare(name: str, sets: list[str] | None = None, *, directory: Path, concurrency: int | None = None,
            budget_s: int | None = None, plan: bool = False) -> Prepared:
    """Everything checked, nothing written; ProfileError lists what is wrong. DIRECTORY holds the
    base profile and gets the tuned one. With `plan`, a tuned profile that could not be written
    is a note, not an error (a run refuses it first)."""
    base = load_profile(name, directory)
    report = validate(base)
    if report.errors:
        raise ProfileError(report.errors)
    space = build_space(base, sets, concurrency=concurrency, budget_s=budget_s)
    target = tuned_name(name)
    path, problem = directory / f"{target}.yaml", ""
    try:
        check_target(target, directory)
    except ProfileError as exc:
        if not plan:
            raise
        problem = str(exc)
    return Prepared(base, space, method_for(base, space), build_candidates(base, space), target, path, problem)


def plan_text(p: Prepared) -> str:
    m = p.method
    lines = [f"tune {p.base.name}: {len(p.candidates)} candidates, {len(p.ready)} to try, {len(p.refused)} refused "
             "(never measured)",
             f"objective: highest output tok/s at C={m.concurrency} ({m.input_len}/{m.output_len} tokens); "
             f"{m.slo.describe()}",
             f"successive halving: prompts per level {list(m.rung_prompts)}, keep the best 1/{m.eta}; "
             f"budget {p.space.budget_s} s; the best found goes to {_shown_path(p.tuned_path)}"]
    lines += [f"note: {n}" for n in p.space.notes]
    if p.tuned_problem:
        lines.append(f"note: a run would refuse to start: {p.tuned_problem}")
    width = max(len(c.id) for c in p.candidates)
    lines += ["", f"{'id':<{width}}  {'status':<7}  overrides"]
    for c in p.candidates:
        lines.append(f"{c.id:<{width}}  {'refused' if c.refused else 'try':<7}  {c.label}")
        lines += [f"{'':<{width}}    reason: {r}" for r in c.reasons]
        if not c.refused:
            lines += [f"{'':<{width}}    warning: {w.path}: {w.message}" for w in c.new_warnings]
    return "\n".join(lines)


def plan_json(p: Prepared) -> dict:
    return {"profile": p.base.name, "tuned_profile": p.tuned_name, "tuned_problem": p.tuned_problem or None,
            **p.space.to_dict(),
            "method": p.method.to_dict(),
            "candidates": [{**c.to_dict(), "status": "refused" if c.refused else "try"} for c in p.candidates]}


def _shown_path(path: Path) -> str:
    """PATH relative to the working directory (the checkout, for `make tune`), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass
class Outcome:
    result: TuneResult
    report_files: list[Path]
    tuned_profile: Path | None
    serving: str = ""
    notes: list[str] = field(default_factory=list)


def run_tune(p: Prepared, backend: Backend, folders: TuneFolders, *, fresh: bool = False,
             clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = print,
             png: bool = True) -> Outcome:
    """Search, then write the tuned profile (if something beat the base) and the report, then
    let the backend leave the host on the best release that passed."""
    started = time.time()
    with TuneState.open(folders.state / f"{p.base.name}.json", p.base.name, p.method, fresh=fresh) as state:
        notes = [state.note] if state.note else []
        refused = calibrate_candidates(p.candidates, backend.calibration())
        if refused:
            notes.append(f"refused by the host's calibrated memory budget before the search: {', '.join(refused)}")
        for n in notes:
            log(n)
        try:
            result = Scheduler(p.method, backend.measure, state, budget_s=p.space.budget_s, clock=clock, log=log,
                               screen=Screen(backend.calibration)).run(p.candidates)
        except BaseException:  # cut off (Ctrl-C, a broken backend): the starting release serves again
            backend.settle(None, None)
            raise
    tuned = None
    folder = report_dir(folders.reports, p.base.name, started)
    if result.chosen is not None:
        t = result.best_trial
        tuned = write_tuned(
            p.base.name, result.chosen, directory=p.tuned_path.parent,
            description=(f"{p.base.name} tuned for C={p.method.concurrency}: {result.chosen.label} "
                         f"({t.measurement.output_throughput:.1f} tok/s measured)"),
            notes=[f"Report: {_shown_path(folder)}", f"Verdict: {result.verdict}"]
            + ([f"Measured on: {backend.where}"] if backend.where else []))
    serving = ""
    try:
        serving = backend.settle(result.chosen, p.tuned_name if tuned else None)
    finally:
        rep = TuneReport(p.base.name, p.space, p.method, p.candidates, result,
                         str(tuned) if tuned else None, tuple(notes + list(p.space.notes)
                                                             + ([f"serving: {serving}"] if serving else [])))
        files = write_report(rep, folder, png=png)
    return Outcome(result, files, tuned, serving, notes)
