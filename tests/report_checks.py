"""What a test reads back from a report page, and the figures it must show, taken from gate.json
files directly (not through dsv4deploy's own model): every table cell and chart point is
compared with the gate report it came from, so a figure that differs fails. A replica gated alone
is keyed "<release>/replica-N" (its table rows' data-part, its charts' id suffix)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

METRIC_ROWS = {"throughput": ("output throughput", "observed"), "floor": ("output throughput", "threshold"),
               "p99_ttft_ms": ("p99 TTFT", "observed"), "p99_tpot_ms": ("p99 TPOT", "observed")}
CHARTS = {"chart-throughput": "throughput", "chart-p99-ttft-ms": "p99_ttft_ms", "chart-p99-tpot-ms": "p99_tpot_ms"}
_CHART_ID = re.compile(r"(chart-[a-z0-9-]+?)(?:-(replica-\d+))?")


def chart_of(svg_id: str) -> tuple[str, str | None] | None:
    """(chart, replica part or None) of a gate chart's id; None for another svg."""
    m = _CHART_ID.fullmatch(svg_id or "")
    return (m.group(1), m.group(2)) if m and m.group(1) in CHARTS else None


class _Figures(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells: dict[tuple[str, str, str], str] = {}     # (release[/part], level, metric) -> text shown
        self.points: dict[tuple[str, str, str], str] = {}    # (chart, series, release[/part]) -> data-value
        self.releases: dict[str, str] = {}                   # timeline: release -> data-status
        self.watch: list[tuple[str, str, str, str]] = []     # the watch chart: (target, at, result, value)
        self._in_watch = False
        self._row: tuple[str, str] | None = None
        self._cell: str | None = None
        self._chart: tuple[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and chart_of(a.get("id")):
            self._chart = chart_of(a["id"])
        if tag == "svg" and a.get("id") == "chart-watch":
            self._in_watch = True
        if self._in_watch and "data-at" in a:
            self.watch.append((a["data-series"], a["data-at"], a["data-result"], a["data-value"]))
        if tag == "li" and "data-release" in a:
            self.releases[a["data-release"]] = a.get("data-status", "")
        if tag == "tr" and "data-level" in a:
            self._row = (_key(a["data-release"], a.get("data-part")), a["data-level"])
        if tag == "td" and self._row and "data-metric" in a:
            self._cell, self._text = a["data-metric"], []
        if self._chart and "data-value" in a and "data-release" in a:
            chart, part = self._chart
            self.points[(chart, a["data-series"], _key(a["data-release"], part))] = a["data-value"]

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart, self._in_watch = None, False
        if tag == "td" and self._cell:
            self.cells[(*self._row, self._cell)] = "".join(self._text).strip()
            self._cell = None
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell:
            self._text.append(data)


def _key(release: str, part: str | None) -> str:
    return f"{release}/{part}" if part else release


def shown(html: str) -> _Figures:
    parser = _Figures()
    parser.feed(html)
    return parser


def _fig(v) -> str:
    return "-" if v is None else f"{float(v):.1f}"


def _result(doc: dict, level: dict) -> str:
    """A level's result as the page must say it: an early pass with its completed requests."""
    if level.get("passed") is None:
        return "not run"
    if not level["passed"]:
        return "FAIL"
    res = [r for r in (doc.get("result") or {}).get("levels") or [] if r.get("concurrency") == level["concurrency"]]
    if res and (res[0].get("early_stop") or {}).get("rule") == "pass":
        return f"passed early ({res[0]['completed']} of {res[0]['num_prompts']})"
    return "pass"


def expected(gate_docs: dict[str, dict]) -> dict[tuple[str, str, str], str]:
    """(release label[/part], level, metric) -> the figure as the page must print it, from each
    gate.json's verdict rows (and its result, for an early pass)."""
    out = {}
    for release, doc in gate_docs.items():
        for level in doc["verdict"]["levels"]:
            rows = {r["metric"]: r for r in level["rows"]}
            for metric, (row, field) in METRIC_ROWS.items():
                out[(release, level["label"], metric)] = _fig((rows.get(row) or {}).get(field))
            out[(release, level["label"], "result")] = _result(doc, level)
    return out


def mismatches(html: str, gate_docs: dict[str, dict]) -> list[str]:
    """Every figure of a host page that is not the gate report's, or is missing; empty when the
    page shows exactly the records."""
    page, want = shown(html), expected(gate_docs)
    bad = [f"table {k}: page {page.cells.get(k)!r}, gate.json {v!r}" for k, v in want.items() if page.cells.get(k) != v]
    bad += [f"table {k}: not in any gate.json" for k in page.cells if k not in want]
    for (chart, series, release), value in page.points.items():
        metric = CHARTS[chart]
        limit = series.endswith(" floor") or series.endswith(" ceiling")
        level = series.rsplit(" ", 1)[0] if limit else series
        key = (release, level, "floor" if limit and metric == "throughput" else metric)
        if want.get(key) != value:
            bad.append(f"chart {chart} {series} release {release}: page {value}, gate.json {want.get(key)}")
    plotted = {(r, s, CHARTS[c]) for c, s, r in page.points if not s.endswith(("floor", "ceiling"))}
    bad += [f"chart point missing: {k}" for k, v in want.items()
            if k[2] in CHARTS.values() and v != "-" and k not in plotted]
    return bad


def watch_mismatches(html: str, watch_doc: dict) -> list[str]:
    """Every interval of the kept watch results (reports/<host>/watch.json, as read from the
    host's journal) that the watch chart does not show as recorded, and every point it shows
    that is not one of them; empty when they are the same, each target's in the order read."""
    want = [(r["target"], r["at"], r["result"], _fig(r.get("tpot_ms"))) for r in watch_doc.get("results") or []]
    got = shown(html).watch
    bad = [f"watch chart: missing {w}" for w in want if w not in got]
    bad += [f"watch chart: {g} is not a recorded interval" for g in got if g not in want]
    for target in {w[0] for w in want}:
        if not bad and [g for g in got if g[0] == target] != [w for w in want if w[0] == target]:
            bad.append(f"watch chart: {target}'s intervals are not in the recorded order")
    return bad
