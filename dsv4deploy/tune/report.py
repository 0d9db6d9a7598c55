"""The tune's report, `reports/tune-<profile>-<UTC time>/`: tune.json (everything), tune.md (the
verdict, every candidate with its status and numbers, the refused ones with the validator's
reasons) and tune.png (throughput against p99 TTFT and p99 TPOT, every measured candidate, the
Pareto front and the SLOs). Pure functions of the search's data and a folder; matplotlib (Agg)
is imported only to plot, as in gate/report.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from dsv4deploy.tune.candidates import Candidate
from dsv4deploy.tune.objective import Method, pareto_front
from dsv4deploy.tune.scheduler import Trial, TuneResult
from dsv4deploy.tune.space import Space

SCHEMA = "dsv4deploy.tune.report/1"
LATENCIES = (("p99_ttft_ms", "p99 TTFT"), ("p99_tpot_ms", "p99 TPOT"))


@dataclass
class TuneReport:
    profile: str
    space: Space
    method: Method
    candidates: list[Candidate]
    result: TuneResult
    tuned_profile: str | None = None
    notes: tuple[str, ...] = ()

    def status(self, c: Candidate) -> tuple[str, str]:
        """(status, why) of one candidate, as the report shows it."""
        r = self.result
        if c.refused:
            return "refused", "; ".join(c.reasons)
        if r.chosen is not None and c.id == r.chosen.id:
            return "chosen", "the best that passed, and better than the base"
        if c.id in r.refused:
            return "refused", "the host's calibrated budget: " + "; ".join(r.refused[c.id])
        if c.id in r.eliminated:
            return "out", r.eliminated[c.id]
        if c.id in r.skipped:
            return "skipped", "the budget ran out before it was measured" if r.last_trial(c.id) is None else \
                "the budget ran out before its next level"
        if r.last_trial(c.id) is None:
            return "not measured", ""
        return "passed", "met every constraint" + (" (the reference)" if c.is_base else "")

    def points(self) -> list[tuple[Candidate, Trial]]:
        """Each measured candidate with its last (highest-level) measurement."""
        out = []
        for c in self.candidates:
            t = self.result.last_trial(c.id)
            if t is not None and not t.measurement.error:
                out.append((c, t))
        return out

    def front(self, latency: str) -> list[str]:
        """Pareto front (throughput up, latency down) of candidates with no failed request."""
        pts = [(c.id, t.measurement.output_throughput, getattr(t.measurement, latency))
               for c, t in self.points() if t.measurement.failed == 0 and getattr(t.measurement, latency) is not None]
        return pareto_front(pts)

    def document(self) -> dict:
        r = self.result
        cands = []
        for c in self.candidates:
            status, why = self.status(c)
            trials = [{"level": t.level.index, "num_prompts": t.level.num_prompts, "from_state": t.from_state,
                       "feasible": t.feasible, "why_out": t.why_out, "measurement": t.measurement.to_dict()}
                      for t in r.trials if t.candidate.id == c.id]
            cands.append({**c.to_dict(), "status": status, "why": why, "trials": trials})
        return {"schema": SCHEMA, "profile": self.profile,
                "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "space": self.space.to_dict(), "method": self.method.to_dict(),
                "verdict": r.verdict, "chosen": r.chosen.id if r.chosen else None,
                "chosen_overrides": r.chosen.overrides if r.chosen else None,
                "tuned_profile": self.tuned_profile, "budget_s": self.space.budget_s, "spent_s": round(r.spent_s, 3),
                "budget_exhausted": r.budget_exhausted, "notes": list(self.notes),
                "front": {key: self.front(key) for key, _ in LATENCIES}, "candidates": cands}


def _f(v, nd: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(rep: TuneReport, png_name: str | None = "tune.png") -> str:
    r, m = rep.result, rep.method
    refused = [c for c in rep.candidates if c.refused]
    out = [f"# Tune report: {rep.profile}", "",
           f"**{'chosen: ' + r.chosen.id if r.chosen else 'keep the base'}**: {r.verdict}", "",
           f"- objective: highest output tok/s at C={m.concurrency} ({m.input_len}/{m.output_len} tokens); "
           f"{m.slo.describe()}",
           f"- successive halving: eta {m.eta}, prompts per level {list(m.rung_prompts)}",
           f"- candidates: {len(rep.candidates)} ({len(refused)} refused by the validator, never measured); "
           f"measurements: {len(r.trials)} ({sum(t.from_state for t in r.trials)} from the saved state)",
           f"- wall time: {r.spent_s:.0f} s of {rep.space.budget_s} s" + (" (**budget exhausted**)" if r.budget_exhausted else ""),
           f"- tuned profile: {rep.tuned_profile or 'none written'}"]
    out += [f"- note: {n}" for n in rep.notes] + [""]
    out += ["## Candidates", "", "| id | overrides | status | level | output tok/s | p99 TTFT ms | p99 TPOT ms | why |",
            "|---|---|---|---:|---:|---:|---:|---|"]
    for c in rep.candidates:
        status, why = rep.status(c)
        t = r.last_trial(c.id)
        mm = t.measurement if t else None
        out.append(f"| {c.id} | {_cell(c.label)} | {status} | {t.level.index if t else ''} | "
                   f"{_f(mm.output_throughput) + mm.basis() if mm else ''} | {_f(mm.p99_ttft_ms) if mm else ''} | "
                   f"{_f(mm.p99_tpot_ms) if mm else ''} | {_cell(why)} |")
    out += ["", "## Pareto front", ""]
    for key, name in LATENCIES:
        out.append(f"- output throughput vs {name}: {', '.join(rep.front(key)) or 'none'}")
    out.append("")
    if png_name:
        out += [f"![tune plot]({png_name})", ""]
    return "\n".join(out)


def plot(rep: TuneReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = rep.points()
    chosen = rep.result.chosen.id if rep.result.chosen else None
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    fig.suptitle(f"dsv4deploy tune {rep.profile}: C={rep.method.concurrency}, "
                 f"{'chosen ' + chosen if chosen else 'keep the base'}", fontsize=12)
    for ax, (key, name) in zip(axes, LATENCIES):
        drawn = [(c, t) for c, t in pts if getattr(t.measurement, key) is not None]
        for c, t in drawn:
            x, y = getattr(t.measurement, key), t.measurement.output_throughput
            style = ("*", "gold", 16) if c.id == chosen else ("s", "tab:grey", 8) if c.is_base else \
                ("o", "tab:blue", 7) if t.feasible else ("x", "tab:red", 8)
            ax.plot([x], [y], style[0], color=style[1], markersize=style[2], zorder=3,
                    markeredgecolor="black" if c.id == chosen else None)
            ax.annotate(c.id, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        front = {cid for cid in rep.front(key)}
        fpts = sorted((getattr(t.measurement, key), t.measurement.output_throughput) for c, t in drawn if c.id in front)
        if fpts:
            ax.step([p[0] for p in fpts], [p[1] for p in fpts], where="post", color="tab:green", alpha=0.7,
                    label="Pareto front", zorder=2)
        ceiling = getattr(rep.method.slo, "max_" + key)
        if ceiling:
            ax.axvline(ceiling, color="tab:red", linestyle="--", label=f"{name} ceiling")
        if rep.method.slo.min_output_throughput:
            ax.axhline(rep.method.slo.min_output_throughput, color="tab:red", linestyle=":", label="floor")
        for marker, color, label in (("o", "tab:blue", "passed"), ("x", "tab:red", "out"),
                                     ("s", "tab:grey", "base"), ("*", "gold", "chosen")):
            ax.plot([], [], marker, color=color, linestyle="none", label=label)
        if not drawn:
            ax.text(0.5, 0.5, "nothing measured", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel(f"output throughput at C={rep.method.concurrency} (tok/s)")
        ax.set_title(f"throughput vs {name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_dir(root: Path, profile: str, when: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return root / f"tune-{profile}-{stamp}"


def write_report(rep: TuneReport, folder: Path, *, png: bool = True) -> list[Path]:
    """tune.json, tune.md and tune.png in `folder` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "tune.json"]
    written[0].write_text(json.dumps(rep.document(), indent=2) + "\n")
    if png:
        written.append(plot(rep, folder / "tune.png"))
    md = folder / "tune.md"
    md.write_text(render_markdown(rep, "tune.png" if png else None))
    return [written[0], md] + written[1:]
