"""Gate reports: ``gate.json`` (full metrics per level, the spec and the verdict), ``gate.md``
(verdict tables, metrics, comparison with the previous gate measured the same way) and
``gate.png`` (output throughput vs concurrency with the floors; TTFT and TPOT percentiles).

Pure functions of the data and a target folder; matplotlib (Agg) is imported only to plot.
"Measured the same way" = same runner and same level (concurrency, prompts, input/output
lengths), both run to the end, or both passed early over the same number of requests (an early
pass's figures rest on its first requests alone); regressions beyond 5 %: output throughput
down, p99 TTFT or p99 TPOT up.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsv4deploy.gate.result import EARLY_STOP, OK, SKIPPED, GateResult
from dsv4deploy.gate.runner import GateOutcome
from dsv4deploy.gate.split import routing_lines, warnings as split_warnings

REPORT_SCHEMA = "dsv4deploy.gate.report/1"
REGRESSION_PCT = 5.0
# metric name -> (getter, unit, higher_is_better)
METRICS = {
    "output throughput": (lambda r: r.output_throughput, "tok/s", True),
    "p99 TTFT": (lambda r: r.ttft_ms.p99, "ms", False),
    "p99 TPOT": (lambda r: r.tpot_ms.p99, "ms", False),
}


@dataclass
class Change:
    level: str
    metric: str
    previous: float
    current: float
    unit: str
    change_pct: float
    regression: bool

    def text(self) -> str:
        return (f"{self.level} {self.metric} {self.previous:.1f} -> {self.current:.1f} {self.unit} "
                f"({self.change_pct:+.1f}%)")


@dataclass
class Comparison:
    comparable: bool
    reason: str = ""
    previous: dict[str, Any] = field(default_factory=dict)   # what we compared with (release, time, runner)
    changes: list[Change] = field(default_factory=list)
    threshold_pct: float = REGRESSION_PCT

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["regressions"] = [c.text() for c in self.regressions]
        return d


@dataclass
class ReportFiles:
    json: Path
    markdown: Path
    png: Path | None
    comparison: Comparison | None


# ------------------------------------------------------------------------------ loading
def load_previous(src: Any) -> tuple[GateResult, dict] | None:
    """A previous gate from a gate.json path, its parsed dict, a GateOutcome or a GateResult."""
    if src is None:
        return None
    if isinstance(src, GateOutcome):
        return src.result, {}
    if isinstance(src, GateResult):
        return src, {}
    if isinstance(src, (str, Path)):
        p = Path(src)
        if not p.is_file():
            return None
        src = json.loads(p.read_text())
    if not isinstance(src, dict):
        raise TypeError(f"cannot read a previous gate from {type(src).__name__}")
    if "result" in src:
        meta = {k: src.get(k) for k in ("release", "title", "written_at", "passed") if src.get(k) is not None}
        return GateResult.from_dict(src["result"]), meta
    return GateResult.from_dict(src), {}


def compare(previous: Any, current: GateResult, threshold_pct: float = REGRESSION_PCT) -> Comparison:
    loaded = load_previous(previous)
    if loaded is None:
        return Comparison(False, "no previous gate", threshold_pct=threshold_pct)
    prev, meta = loaded
    info = dict(meta, runner=prev.runner, started_at=prev.started_at)
    if prev.runner != current.runner:
        return Comparison(False, f"not measured the same way: runner {prev.runner} then {current.runner}",
                          info, threshold_pct=threshold_pct)
    pk, ck = prev.by_key(), current.by_key()
    ran = [k for k in sorted(ck) if k in pk and pk[k].status == OK and ck[k].status == OK]
    common = [k for k in ran if pk[k].basis() == ck[k].basis()]
    apart = "; ".join(f"{ck[k].label} rests on {ck[k].basis()}, the previous on {pk[k].basis()}"
                      for k in ran if k not in common)
    if not common:
        return Comparison(False, "no level measured the same way (same concurrency, prompts and lengths, "
                                 "both run to the end or both passed early over as many requests) in both gates"
                          + (f": {apart}" if apart else ""), info, threshold_pct=threshold_pct)
    changes: list[Change] = []
    for k in common:
        a, b = pk[k], ck[k]
        for name, (get, unit, higher_better) in METRICS.items():
            va, vb = get(a), get(b)
            if va is None or vb is None or va <= 0:
                continue
            pct = 100.0 * (vb - va) / va
            worse = -pct if higher_better else pct
            changes.append(Change(b.label, name, va, vb, unit, pct, worse > threshold_pct))
    differ = sorted(set(pk) ^ set(ck))
    notes = [f"levels only in one gate: {', '.join(f'C={k[0]} n={k[1]} {k[2]}/{k[3]}' for k in differ)}"] if differ else []
    notes += [f"not compared: {apart}"] if apart else []
    return Comparison(True, "; ".join(notes), info, changes, threshold_pct)


# ------------------------------------------------------------------------------ markdown
def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _stat(s) -> str:
    return "n/a" if s.mean is None else f"{s.mean:.1f} / {s.median:.1f} / {s.p90:.1f} / {s.p99:.1f}"


def _replicas_section(parts: list[dict], levels: list) -> list[str]:
    """Which replica served the gate's requests through the gateway (gate/split.py)."""
    total = sum(p.get("requests") or 0 for p in parts)
    out = ["## Requests per replica", "",
           "Through the gateway, from each replica's own `sglang:num_requests_total` before and after the gate.", "",
           "| replica | url | requests | share |", "|---|---|---:|---:|"]
    for p in parts:
        n = p.get("requests")
        share = f"{100 * n / total:.0f}%" if n is not None and total else "n/a"
        out.append(f"| {p.get('index')} | {p.get('url')} | {_f(n)} | {share} |")
    out.append("")
    lines, warns = routing_lines(levels, len(parts))
    out += [f"- {line}" for line in lines]
    out += [f"- **warning**: {w}" for w in split_warnings(parts) + warns]
    return out + [""]


def render_markdown(outcome: GateOutcome, comparison: Comparison | None = None, *, title: str | None = None,
                    png_name: str | None = "gate.png") -> str:
    r, v, spec = outcome.result, outcome.verdict, outcome.spec
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.started_at)) if r.started_at else "n/a"
    out = [f"# Gate report{': ' + title if title else ''}", "",
           f"**{'PASS' if v.passed else 'FAIL'}**: {v.summary}", "",
           f"- runner: `{r.runner}`" + (f" ({r.client.get('runner_choice')})" if r.client.get("runner_choice") else ""),
           f"- server: {r.base_url or 'n/a'}; started {when}; wall {r.wall_s:.1f} s of budget "
           f"{_f(r.budget_s, 0)} s" + ("; **budget exhausted**" if r.budget_exhausted else ""),
           f"- method: random token ids, fixed lengths, ignore_eos, max concurrency C, request rate inf; "
           f"{spec.warmup_requests} warm-up request(s) per level; max failed requests {spec.max_failed_requests}",
           ""]
    if r.error:
        out += [f"Runner error: `{r.error}`", ""]
    if v.failures:
        out += ["## Failures", ""] + [f"- {m}" for m in v.failures] + [""]
    out += ["## Verdict", ""]
    for lv in v.levels:
        state = {True: "pass", False: "FAIL", None: "not run"}[lv.passed]
        spec_lv = next((x for x in spec.levels if x.key == lv.key), None)
        desc = f" ({spec_lv.num_prompts} prompts, {spec_lv.input_len}/{spec_lv.output_len} tokens)" if spec_lv else ""
        out += [f"### {lv.label}{desc}: {state}", ""]
        if lv.passed is None:
            out += [f"{lv.reason or 'not run'}", ""]
            continue
        out += ["| metric | observed | | threshold | result | note |", "|---|---:|:-:|---:|:-:|---|"]
        for row in lv.rows:
            note = row.note.replace("|", "\\|")
            out.append(f"| {row.metric} | {row.observed_text()} | {row.comparator} | {row.threshold_text()} | "
                       f"{row.verdict_text()} | {note} |")
        out.append("")
    out += ["## Metrics", "",
            "Latencies in ms as mean / median / p90 / p99.", "",
            "| level | status | completed | failed | duration s | req/s | output tok/s | total tok/s | "
            "TTFT | TPOT | ITL | E2E | client CPU |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|"]
    for lr in sorted(r.levels, key=lambda x: x.concurrency):
        if lr.status == SKIPPED:
            out.append(f"| {lr.label} | not run | | | | | | | | | | | |")
            continue
        tp = _f(lr.output_throughput)
        if lr.status == EARLY_STOP and lr.running_output_throughput is not None:
            tp += f" (running {lr.running_output_throughput:.1f})"
        cpu = "" if lr.client_cpu_share is None else f"{100 * lr.client_cpu_share:.1f}%"
        out.append(f"| {lr.label} | {lr.status} | {lr.completed}/{lr.num_prompts} | {lr.failed} | "
                   f"{lr.duration_s:.1f} | {lr.request_throughput:.2f} | {tp} | {lr.total_throughput:.1f} | "
                   f"{_stat(lr.ttft_ms)} | {_stat(lr.tpot_ms)} | {_stat(lr.itl_ms)} | {_stat(lr.e2e_ms)} | {cpu} |")
    out.append("")
    if r.replicas:
        out += _replicas_section(r.replicas, r.levels)
    out += ["## Comparison with the previous gate", ""]
    if comparison is None or not comparison.comparable:
        out += [f"Not compared: {comparison.reason if comparison else 'no previous gate'}.", ""]
    else:
        p = comparison.previous
        ref = ", ".join(f"{k} {p[k]}" for k in ("release", "title") if p.get(k)) or "previous gate.json"
        out += [f"Compared with {ref} (runner {p.get('runner')}); regressions beyond "
                f"{comparison.threshold_pct:g}%:", ""]
        regs = comparison.regressions
        out += ([f"- **{c.text()}**" for c in regs] if regs else ["- none"]) + [""]
        if comparison.reason:
            out += [f"Note: {comparison.reason}.", ""]
        out += ["| level | metric | previous | current | change |", "|---|---|---:|---:|---:|"]
        for c in comparison.changes:
            flag = " **regression**" if c.regression else ""
            out.append(f"| {c.level} | {c.metric} | {c.previous:.1f} {c.unit} | {c.current:.1f} {c.unit} | "
                       f"{c.change_pct:+.1f}%{flag} |")
        out.append("")
    if png_name:
        out += [f"![gate plot]({png_name})", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------ plot
def new_figure():
    """The plot's empty figure and its three axes (`plot` draws into one; host/gate.py makes one
    while a server starts: a fifth of the plot's time, 20 ms, off the deploy's path)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 3, figsize=(16, 4.8))


def warm_figure():
    """new_figure(), drawn once empty (its axes make their tick objects), after a scratch figure
    with a log axis and a legend (the fonts loaded, the mathtext parser built for the log ticks'
    labels): the first plot of a process skips that work, 20 to 90 ms of its 0.12 to 0.24 s. A
    deploy calls this while its server starts (host/gate.py warm_plotting); the pixels are the
    same as a new_figure()'s (tests/test_gate_report.py)."""
    import matplotlib

    matplotlib.use("Agg")       # before pyplot picks a backend: no display's, in any thread
    import matplotlib.pyplot as plt

    scratch, ax = plt.subplots(figsize=(4, 3), dpi=110)
    try:
        ax.set_yscale("log")
        ax.bar([0, 1], [100, 2000], label="warm-up")
        ax.annotate("warm\nup", (0, 100))
        ax.legend(fontsize=8)
        scratch.canvas.draw()
    finally:
        plt.close(scratch)
    fig, axes = new_figure()
    fig.canvas.draw()
    return fig, axes


def plot(outcome: GateOutcome, path: str | Path, previous: GateResult | None = None, figure=None) -> Path:
    """gate.png: throughput against the floors, TTFT and TPOT percentiles against the ceilings.
    FIGURE: a new_figure() or warm_figure() made ahead (None: made now); it is used once and closed."""
    import matplotlib.pyplot as plt

    fig, axes = figure or new_figure()
    try:
        return _draw(outcome, fig, axes, Path(path), previous)
    finally:
        plt.close(fig)


def _draw(outcome: GateOutcome, fig, axes, path: Path, previous: GateResult | None) -> Path:
    r, spec = outcome.result, outcome.spec
    ran = sorted([lr for lr in r.levels if lr.status != SKIPPED], key=lambda x: x.concurrency)
    title = f"dsv4deploy gate: {'PASS' if outcome.passed else 'FAIL'} ({r.runner})"
    fig.suptitle(title, fontsize=13, color="tab:green" if outcome.passed else "tab:red")

    # 1. output throughput vs concurrency, floors
    ax = axes[0]
    cs = sorted({lv.concurrency for lv in spec.levels})
    ok = [lr for lr in ran if lr.status == OK]
    if ok:
        ax.plot([x.concurrency for x in ok], [x.output_throughput for x in ok], "o-", color="tab:blue",
                label="measured", zorder=3)
        for x in ok:
            ax.annotate(f"{x.output_throughput:.1f}", (x.concurrency, x.output_throughput),
                        textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
    bad = [lr for lr in ran if lr.status != OK]
    for x in bad:
        y = x.running_output_throughput if x.running_output_throughput is not None else x.output_throughput
        ax.plot([x.concurrency], [y], "X", color="tab:red", markersize=10, zorder=4,
                label=f"stopped ({x.status})" if x is bad[0] else None)
        ax.annotate(f"{y:.1f}\n{x.status}", (x.concurrency, y), textcoords="offset points", xytext=(0, 8),
                    ha="center", fontsize=8, color="tab:red")
    floors = [(lv.concurrency, lv.min_output_throughput) for lv in spec.levels if lv.min_output_throughput]
    if floors:
        ax.plot([c for c, _ in floors], [f for _, f in floors], "_", color="tab:red", markersize=28,
                markeredgewidth=2.5, label="floor", zorder=2)
    for lr in r.levels:
        if lr.status == SKIPPED:
            lv = next((x for x in spec.levels if x.key == lr.key), None)
            y = (lv.min_output_throughput if lv and lv.min_output_throughput else 0.0)
            ax.annotate("not run", (lr.concurrency, y), textcoords="offset points", xytext=(0, 8), ha="center",
                        fontsize=8, color="grey")
    if previous is not None:
        pv = sorted([lr for lr in previous.levels if lr.status == OK], key=lambda x: x.concurrency)
        if pv:
            ax.plot([x.concurrency for x in pv], [x.output_throughput for x in pv], "s--", color="grey",
                    alpha=0.7, label="previous", zorder=1)
    ax.set_xscale("log", base=2)
    if cs:
        ax.set_xlim(min(cs) / 1.6, max(cs) * 1.6)
    ax.set_xticks(cs)
    ax.set_xticklabels([str(c) for c in cs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Output throughput vs concurrency", y=1.0)   # y given: no search for a place
    ax.set_ylim(bottom=0)
    top = max([x.output_throughput for x in ran] + [x.running_output_throughput or 0 for x in ran]
              + [f for _, f in floors] + [1.0])
    ax.set_ylim(0, top * 1.25)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")

    # 2./3. TTFT and TPOT percentiles per level, ceilings
    for ax, name, attr, ceil_attr in ((axes[1], "TTFT", "ttft_ms", "max_p99_ttft_ms"),
                                      (axes[2], "TPOT", "tpot_ms", "max_p99_tpot_ms")):
        levels = [lr for lr in ran if getattr(lr, attr).mean is not None]
        pcts = (("mean", "mean"), ("median", "p50"), ("p90", "p90"), ("p99", "p99"))
        width = 0.8 / len(pcts)
        xs = list(range(len(levels)))
        for i, (key, lab) in enumerate(pcts):
            vals = [getattr(getattr(lr, attr), key) or 0.0 for lr in levels]
            ax.bar([x + (i - 1.5) * width for x in xs], vals, width, label=lab)
        labeled = False
        for x, lr in zip(xs, levels):
            lv = next((s for s in spec.levels if s.key == lr.key), None)
            ceil = getattr(lv, ceil_attr) if lv else None
            if ceil:
                ax.hlines(ceil, x - 0.45, x + 0.45, colors="tab:red", linestyles="--",
                          label=None if labeled else "p99 ceiling")
                labeled = True
        if not levels:
            ax.text(0.5, 0.5, "no completed request", ha="center", va="center", transform=ax.transAxes,
                    fontsize=11, color="grey")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{name} percentiles", y=1.0)
            continue
        ax.set_xticks(xs)
        ax.set_xticklabels([lr.label + ("" if lr.status == OK else f"\n({lr.status})") for lr in levels])
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} percentiles", y=1.0)
        vals = [getattr(getattr(lr, attr), "p99") or 0 for lr in levels]
        if vals and min(v for v in vals if v > 0) * 20 < max(vals):
            ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    # fixed margins: tight_layout measured every label first, a third of the plot's time (the
    # report is drawn while a deploy waits); these fit the longest labels the gate writes
    fig.subplots_adjust(left=0.045, right=0.99, bottom=0.15, top=0.86, wspace=0.2)
    fig.set_dpi(110)
    fig.canvas.draw()
    # a plot has few colours: a 256-colour palette looks the same at a third of the size (about
    # 23 KB), so the reports travel to the host inside one command (host/gate.py keep_reports);
    # quantized straight from the canvas's pixels, not from a PNG encoded and decoded again
    from PIL import Image
    pixels = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    pixels.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path)
    return path


# ------------------------------------------------------------------------------ all of it
def report_document(outcome: GateOutcome, comparison: Comparison | None = None, *, title: str | None = None,
                    release: str | None = None) -> dict:
    return {"schema": REPORT_SCHEMA, "title": title, "release": release,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "passed": outcome.passed, "summary": outcome.verdict.summary, "headline": outcome.verdict.headline,
            **outcome.to_dict(), "comparison": comparison.to_dict() if comparison else None}


def write_report(outcome: GateOutcome, target_dir: str | Path, *, previous: Any = None, title: str | None = None,
                 release: str | None = None, png: bool = True, figure=None) -> ReportFiles:
    """Write gate.json, gate.md and gate.png into target_dir (created).  ``previous``: the last
    gate to compare with (a gate.json path, its dict, a GateOutcome or GateResult; None: none).
    ``figure``: the plot's new_figure() or warm_figure(), made ahead (None: made when drawn)."""
    d = Path(target_dir)
    d.mkdir(parents=True, exist_ok=True)
    loaded = load_previous(previous)
    comparison = compare(loaded[0] if loaded else None, outcome.result) if loaded else None
    if comparison is not None and loaded and loaded[1]:
        comparison.previous.update({k: v for k, v in loaded[1].items() if k not in comparison.previous})
    doc = report_document(outcome, comparison, title=title, release=release)
    jp = d / "gate.json"
    jp.write_text(json.dumps(doc, indent=2) + "\n")
    pp = None
    if png:
        pp = plot(outcome, d / "gate.png", loaded[0] if (loaded and comparison and comparison.comparable) else None,
                  figure=figure)
    mp = d / "gate.md"
    mp.write_text(render_markdown(outcome, comparison, title=title or release, png_name=pp.name if pp else None))
    return ReportFiles(jp, mp, pp, comparison)


def load_outcome(path: str | Path) -> GateOutcome:
    """A GateOutcome back from a gate.json (for `history`, re-rendering)."""
    from dsv4deploy.gate.spec import GateSpec, LevelSpec
    from dsv4deploy.gate.verdict import judge

    doc = json.loads(Path(path).read_text())
    sd = doc["spec"]
    spec = GateSpec(levels=tuple(LevelSpec.from_dict(x) for x in sd["levels"]),
                    max_failed_requests=int(sd.get("max_failed_requests", 0)),
                    warmup_requests=int(sd.get("warmup_requests", 2)), budget_s=float(sd.get("budget_s", 1800)),
                    runner=sd.get("runner", "auto"))
    result = GateResult.from_dict(doc["result"])
    return GateOutcome(spec, result, judge(spec, result))


__all__ = ["write_report", "compare", "render_markdown", "plot", "new_figure", "warm_figure", "load_previous", "load_outcome",
           "Comparison", "Change", "ReportFiles"]
