"""Successive halving over the candidates that passed pruning, within a wall-clock budget.

Rung 0 measures every candidate cheaply (one wave of requests at the target concurrency); the
best 1/eta that meet the SLOs go on to the next rung, which sends more requests; the last rung
is the gate's own level. A candidate that breaks an SLO, fails a request, stops early as
"cannot reach" or does not serve is out at once. The base profile is always measured first: it
is the reference, and the search picks a candidate only if it beats it (or the base fails its
SLOs). Otherwise nothing is chosen and the host keeps the release it started with.

`measure(candidate, level) -> Measurement` is injected (the host backend, or a table in tests),
and so is the clock; so is the memory screen (tune/budget.py): asked before each deploy, it
refuses a candidate the host's calibrated budget refuses now, which is then never started. Before each measurement the scheduler checks the budget: it starts none
when the time spent plus the mean time of this rung's measurements so far would pass it.
Finished measurements come from the state when there, at no cost and without calling measure.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from dsv4deploy.tune.candidates import Candidate
from dsv4deploy.tune.objective import Level, Measurement, Method, infeasible
from dsv4deploy.tune.state import TuneState

Measure = Callable[[Candidate, Level], Measurement]


class NoScreen:
    """No memory screen: every candidate that passed pruning may be deployed."""

    def refuse(self, cand: Candidate) -> list[str]:
        return []

    def observe(self, cand: Candidate, m: Measurement) -> None:
        pass


@dataclass
class Trial:
    candidate: Candidate
    level: Level
    measurement: Measurement
    why_out: list[str]               # empty: it met every constraint at this level
    from_state: bool = False

    @property
    def feasible(self) -> bool:
        return not self.why_out


@dataclass
class TuneResult:
    trials: list[Trial] = field(default_factory=list)
    chosen: Candidate | None = None  # None: keep the base (nothing better passed)
    best_trial: Trial | None = None  # the chosen candidate's last measurement
    base_trial: Trial | None = None
    verdict: str = ""
    budget_exhausted: bool = False
    spent_s: float = 0.0
    skipped: list[str] = field(default_factory=list)   # candidate ids the budget left unmeasured
    eliminated: dict[str, str] = field(default_factory=dict)  # id -> why it went no further
    refused: dict[str, list[str]] = field(default_factory=dict)  # id -> why the calibrated budget stopped its deploy

    def last_trial(self, cand_id: str) -> Trial | None:
        mine = [t for t in self.trials if t.candidate.id == cand_id]
        return max(mine, key=lambda t: t.level.index) if mine else None


def restart_order(cands: list[Candidate]) -> list[Candidate]:
    """Keep the given order, but put candidates that differ only in restart-free knobs next to
    each other (at the place of the first of them), so the server restarts once per group."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(c.restart_key, []).append(c)
    return [c for group in groups.values() for c in group]


class Scheduler:
    def __init__(self, method: Method, measure: Measure, state: TuneState, *, budget_s: float,
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = lambda s: None,
                 screen=None):
        self.method, self.measure, self.state = method, measure, state
        self.screen = screen or NoScreen()
        self.budget_s, self.clock, self.log = budget_s, clock, log
        self.result = TuneResult()
        self._start = clock()
        self._spent_before = state.spent_s
        self._walls: dict[int, list[float]] = {}

    def spent(self) -> float:
        return self._spent_before + (self.clock() - self._start)

    def _affordable(self, level: Level) -> bool:
        walls = self._walls.get(level.index) or [0.0]
        return self.spent() + sum(walls) / len(walls) < self.budget_s

    def _trial(self, cand: Candidate, level: Level) -> Trial | None:
        """Measure (or recall) one candidate at one level; None when the budget forbids it."""
        known = self.state.get(cand.key, level.index)
        if known is not None:
            self._walls.setdefault(level.index, []).append(known.wall_s)
            trial = Trial(cand, level, known, infeasible(known, self.method.slo), from_state=True)
        else:
            if not self._affordable(level):
                return None
            t0 = self.clock()
            try:
                m = self.measure(cand, level)
            except Exception as exc:  # the backend broke on this candidate: it is out, the search goes on
                m = Measurement(0.0, error=f"{type(exc).__name__}: {exc}")
            m = replace(m, wall_s=self.clock() - t0)
            self.screen.observe(cand, m)
            self._walls.setdefault(level.index, []).append(m.wall_s)
            self.state.record(cand.key, level.index, m, cand.overrides, self.spent())
            trial = Trial(cand, level, m, infeasible(m, self.method.slo))
        self.result.trials.append(trial)
        tag = " (from state)" if trial.from_state else ""
        self.log(f"{cand.id} level {level.index} ({level.num_prompts} prompts at C={level.concurrency}): "
                 f"{trial.measurement.output_throughput:.1f} tok/s{trial.measurement.basis()}"
                 + ("" if trial.feasible else " OUT: " + "; ".join(trial.why_out)) + tag)
        return trial

    def run(self, candidates: list[Candidate]) -> TuneResult:
        r = self.result
        ready = [c for c in candidates if not c.refused]
        base = next((c for c in ready if c.is_base), None)
        queue = restart_order(([base] if base else []) + [c for c in ready if not c.is_base])
        want = measured = len(queue)   # rung 0 measures everyone
        for level in self.method.levels:
            passed: list[Trial] = []
            for i, cand in enumerate(queue):
                if len(passed) >= want:  # enough went through: the rest of the ranking stops here
                    for c in queue[i:]:
                        r.eliminated[c.id] = f"level {level.index - 1}: not in the best {want} of {measured}"
                    break
                if self.state.get(cand.key, level.index) is None and (why := self.screen.refuse(cand)):
                    r.refused[cand.id] = why           # never deployed: the budget refuses it on this host now
                    r.eliminated[cand.id] = f"level {level.index}: refused before its deploy: " + "; ".join(why)
                    self.log(f"{cand.id} level {level.index}: REFUSED before its deploy: " + "; ".join(why))
                    continue
                trial = self._trial(cand, level)
                if trial is None:
                    r.budget_exhausted = True
                    r.skipped += [c.id for c in queue[i:]]
                    break
                if cand.is_base:
                    r.base_trial = trial
                if trial.feasible:
                    passed.append(trial)
                else:
                    r.eliminated[cand.id] = f"level {level.index}: " + "; ".join(trial.why_out)
            if r.budget_exhausted or level.final or not passed:
                break
            # the next rung tries them best first, until the best 1/eta went through (a promoted
            # candidate that fails there is replaced by the next in this rung's ranking)
            ranked = sorted(passed, key=lambda t: (-t.measurement.output_throughput, t.candidate.index))
            measured = sum(1 for t in r.trials if t.level.index == level.index)
            want = max(1, math.ceil(measured / self.method.eta))
            queue = [t.candidate for t in ranked]
        r.spent_s = self.spent()
        last = [r.last_trial(c.id) for c in ready]
        ok = [t for t in last if t is not None and t.feasible and t.candidate.id not in r.refused]
        best = max(ok, key=lambda t: (t.level.index, t.measurement.output_throughput, -t.candidate.index),
                   default=None)
        self._choose(best)
        return r

    def _choose(self, best: Trial | None) -> None:
        r = self.result
        base = r.base_trial
        base_last = r.last_trial(base.candidate.id) if base else None
        if best is None:
            r.verdict = "no candidate met the SLOs: keep the base" if r.trials else \
                "nothing was measured (budget): keep the base"
            return
        if best.candidate.is_base:
            r.verdict = f"the base is the best that passed ({best.measurement.output_throughput:.1f} tok/s): keep it"
            return
        if base_last is not None and base_last.feasible and \
                base_last.measurement.output_throughput >= best.measurement.output_throughput:
            r.verdict = (f"nothing beat the base ({base_last.measurement.output_throughput:.1f} tok/s; best other "
                         f"{best.candidate.id} {best.measurement.output_throughput:.1f}): keep it")
            return
        r.chosen, r.best_trial = best.candidate, best
        ref = (f"base {base_last.measurement.output_throughput:.1f} tok/s"
               + ("" if base_last.feasible else " (fails: " + "; ".join(base_last.why_out) + ")")
               if base_last else "base not measured")
        rung = "" if best.level.final else f" (at level {best.level.index}: the budget ran out before the last)"
        r.verdict = (f"{best.candidate.id} {best.candidate.label}: {best.measurement.output_throughput:.1f} tok/s at "
                     f"C={best.level.concurrency}{rung}; {ref}")


def successive_halving(candidates: list[Candidate], method: Method, measure: Measure, state: TuneState, *,
                       budget_s: float, clock: Callable[[], float] = time.monotonic,
                       log: Callable[[str], None] = lambda s: None) -> TuneResult:
    """Run the search without a memory screen (Scheduler takes one); see the module docstring."""
    return Scheduler(method, measure, state, budget_s=budget_s, clock=clock, log=log).run(candidates)
