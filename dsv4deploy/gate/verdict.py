"""The gate's verdict (pure): per level a table of rows (metric, observed, comparator, threshold,
pass/fail) and failure messages that name them, e.g.
``C=64 output throughput 29.7 tok/s < floor 400 tok/s``.

Rules per level: failed requests <= max_failed_requests; output throughput >= its floor; p99
TTFT / p99 TPOT <= their ceilings; the level ran to the end (an early stop, the budget running
out, a failed warm-up or a runner error is a failure with its reason).  A level stopped early is
judged on its running output rate (tokens streamed per second once every slot was busy): the
completed-only number is meaningless after a few seconds.  Levels the gate did not run (it stops
at the first failing level) are shown as "not run" and are not extra failures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dsv4deploy.gate.result import BUDGET, EARLY_STOP, OK, SKIPPED, GateResult, LevelResult
from dsv4deploy.gate.spec import GateSpec, LevelSpec


@dataclass
class Row:
    metric: str
    observed: Any
    unit: str = ""
    comparator: str = ""          # "<=", ">=", "==" or "" (informational)
    threshold: Any = None
    passed: bool | None = None    # None: informational, not judged
    note: str = ""

    def observed_text(self) -> str:
        return _fmt(self.observed, self.unit)

    def threshold_text(self) -> str:
        if self.threshold is None:
            return ""
        return _fmt(self.threshold, self.unit, exact=True)

    def verdict_text(self) -> str:
        return {True: "pass", False: "FAIL", None: "-"}[self.passed]


@dataclass
class LevelVerdict:
    label: str
    concurrency: int
    key: tuple
    status: str
    passed: bool | None                   # None: not run
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    reason: str | None = None


@dataclass
class GateVerdict:
    passed: bool
    levels: list[LevelVerdict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    summary: str = ""
    headline: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        """One line for an exit message: the first failure, or the summary."""
        return self.failures[0] if self.failures else self.summary

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """Plain-text tables for a terminal."""
        out = [("PASS" if self.passed else "FAIL") + ": " + self.summary]
        for lv in self.levels:
            state = {True: "pass", False: "FAIL", None: "not run"}[lv.passed]
            out.append(f"  {lv.label} [{state}]" + (f" ({lv.reason})" if lv.reason and lv.passed is not True else ""))
            for r in lv.rows:
                out.append(f"    {r.metric:<22} {r.observed_text():>16} {r.comparator:>2} "
                           f"{r.threshold_text():<14} {r.verdict_text()}" + (f"  {r.note}" if r.note else ""))
        return out


def _fmt(value: Any, unit: str, exact: bool = False) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        s = str(value)
    elif exact:
        s = f"{value:g}"
    else:
        s = f"{value:.1f}"
    return f"{s} {unit}".rstrip()


def _match(spec_level: LevelSpec, result: GateResult) -> LevelResult | None:
    by_key = result.by_key()
    if spec_level.key in by_key:
        return by_key[spec_level.key]
    return result.level(spec_level.concurrency)


def judge_level(lv: LevelSpec, res: LevelResult | None, max_failed: int) -> LevelVerdict:
    label = lv.label
    if res is None:
        msg = f"{label} was not measured"
        return LevelVerdict(label, lv.concurrency, lv.key, "missing", False,
                            [Row("run", "missing", "", "==", "measured", False)], [msg], msg)
    if res.status == SKIPPED:
        return LevelVerdict(label, lv.concurrency, lv.key, SKIPPED, None,
                            [Row("run", "not run", note=res.reason or "")], [], res.reason)
    rows: list[Row] = []
    failures: list[str] = []
    early = res.status == EARLY_STOP
    ran_to_end = res.status == OK
    if not ran_to_end:
        what = {EARLY_STOP: "stopped early", BUDGET: "budget exhausted"}.get(res.status, "failed")
        at = f" after {res.duration_s:.1f} s" if res.duration_s else ""
        rows.append(Row("run", f"{what}{at}", "", "==", "complete", False, res.reason or ""))
        if early:
            failures.append(f"{label} stopped early after {res.duration_s:.1f} s: {res.reason}")
        elif res.status == BUDGET:
            failures.append(f"{label}: {res.reason or 'gate budget exhausted'}")
        else:
            failures.append(f"{label} failed: {res.reason or 'level did not complete'}")
    # failed requests
    ok_failed = res.failed <= max_failed
    rows.append(Row("failed requests", res.failed, "", "<=", max_failed, ok_failed,
                    "; ".join(f"{e['message']} (x{e['count']})" for e in res.errors[:2]) if res.errors else ""))
    if not ok_failed:
        failures.append(f"{label} failed requests {res.failed} > max {max_failed}")
    # output throughput
    obs, note = res.output_throughput, ""
    if early and res.running_output_throughput is not None:
        obs, note = res.running_output_throughput, "running rate when stopped"
    elif early and not res.completed:
        obs, note = None, "not measured (stopped early)"
    elif not ran_to_end:
        note = "partial"
    floor = lv.min_output_throughput
    if floor is not None:
        passed = False if early else (obs >= floor if (ran_to_end and obs is not None) else None)
        rows.append(Row("output throughput", obs, "tok/s", ">=", floor, passed, note))
        if obs is not None and obs < floor and (ran_to_end or early):
            extra = f" (running rate, stopped early after {res.duration_s:.1f} s)" if early else ""
            # the throughput line is the headline: put it before the early-stop reason
            failures.insert(0, f"{label} output throughput {obs:.1f} tok/s < floor {floor:g} tok/s{extra}")
    else:
        rows.append(Row("output throughput", obs, "tok/s", note=note))
    # latency ceilings
    for metric, stat, ceiling in (("p99 TTFT", res.ttft_ms, lv.max_p99_ttft_ms),
                                  ("p99 TPOT", res.tpot_ms, lv.max_p99_tpot_ms)):
        p99 = stat.p99
        if ceiling is None:
            rows.append(Row(metric, p99, "ms", note="" if ran_to_end else "partial"))
            continue
        if p99 is None:
            rows.append(Row(metric, None, "ms", "<=", ceiling, False if ran_to_end else None,
                            "no completed request"))
            if ran_to_end:
                failures.append(f"{label} {metric} not measured (no completed request), ceiling {ceiling:g} ms")
            continue
        passed = p99 <= ceiling
        rows.append(Row(metric, p99, "ms", "<=", ceiling, passed, "" if ran_to_end else "partial"))
        if not passed:
            failures.append(f"{label} {metric} {p99:.1f} ms > ceiling {ceiling:g} ms")
    # informational
    rows.append(Row("completed", f"{res.completed}/{res.num_prompts}",
                    note=res.reason if res.passed_early else ""))  # the runner's reason says "passed early: ..."
    rows.append(Row("duration", res.duration_s, "s"))
    passed = ran_to_end and not failures
    return LevelVerdict(label, lv.concurrency, lv.key, res.status, passed, rows, failures, res.reason)


def judge(spec: GateSpec, result: GateResult) -> GateVerdict:
    levels = [judge_level(lv, _match(lv, result), spec.max_failed_requests)
              for lv in sorted(spec.levels, key=lambda x: x.concurrency)]
    failures: list[str] = []
    if result.error:
        failures.append(f"gate runner ({result.runner}) failed: {result.error}")
    for lv in levels:
        failures.extend(lv.failures)
    judged = [lv for lv in levels if lv.passed is not None]
    if not failures and len(judged) < len(levels):  # something was not run and nothing says why
        failures.extend(f"{lv.label} not run: {lv.reason}" for lv in levels if lv.passed is None)
    passed = not failures and bool(judged)
    if not judged and not failures:
        failures.append("no level was run")
    head = _headline(spec, result)
    if passed:
        summary = "gate passed: " + ", ".join(
            f"{lv.label} {_obs(result, lv):.1f} tok/s" + (f" (floor {lv.min_output_throughput:g})"
                                                          if lv.min_output_throughput is not None else "")
            for lv in sorted(spec.levels, key=lambda x: x.concurrency))
    else:
        summary = "gate failed: " + failures[0] + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else "")
    return GateVerdict(passed, levels, failures, summary, head)


def _obs(result: GateResult, lv: LevelSpec) -> float:
    r = _match(lv, result)
    if r is None:
        return 0.0
    if r.status == EARLY_STOP and r.running_output_throughput is not None:
        return r.running_output_throughput
    return r.output_throughput


def _headline(spec: GateSpec, result: GateResult) -> dict:
    """The number history shows: the highest-concurrency level with a floor (C=64 tok/s vs floor),
    and what it rests on: `passed_early` (its figure is over `completed` of `num_prompts` requests)."""
    floored = [lv for lv in spec.levels if lv.min_output_throughput is not None] or list(spec.levels)
    lv = max(floored, key=lambda x: x.concurrency)
    r = _match(lv, result)
    head = {"level": lv.label, "concurrency": lv.concurrency, "floor": lv.min_output_throughput,
            "output_throughput": None if (r is None or r.status == SKIPPED) else round(_obs(result, lv), 2),
            "status": None if r is None else r.status}
    if r is not None and r.passed_early:
        head.update(passed_early=True, completed=r.completed, num_prompts=r.num_prompts)
    return head


def headline_basis(head: dict) -> str:
    """' (passed early: 64 of 128 requests)' for a headline whose figure rests on part of its level's
    requests, '' otherwise: what `history`, the fleet and the page add after the figure."""
    if not head.get("passed_early"):
        return ""
    return f" (passed early: {head.get('completed', '?')} of {head.get('num_prompts', '?')} requests)"
