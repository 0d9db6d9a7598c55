"""The pages themselves: index.html (a card per host, the tune runs) and one page per host (its
release timeline with gate links and profile changes, the gate charts and their figures as a
table, the watch's results). Jinja2 with autoescape: every string of a record is escaped; the
only markup let through is the SVG charts.py builds from numbers and escaped text. Pure: views
in, {file name: HTML} out."""

from __future__ import annotations

import jinja2
from markupsafe import Markup

from dsv4deploy.profile.boundary import Rule
from dsv4deploy.release.report.charts import Series, fmt, line_chart
from dsv4deploy.release.report.model import HostView, ReleaseView, TuneView

# a host's page is named after it: only names that are safe as one file name in reports/
HOST_FILE = Rule("a host name of letters, digits, '.', '_' and '-'", 200, r"[A-Za-z0-9][A-Za-z0-9._-]*")
METRICS = (("throughput", "floor", "output throughput", "tok/s"),
           ("p99_ttft_ms", "ttft_ceiling", "p99 TTFT", "ms"),
           ("p99_tpot_ms", "tpot_ceiling", "p99 TPOT", "ms"))


def host_file(index: int, name: str) -> str:
    return f"host-{name}.html" if HOST_FILE.check(name) is None and name not in (".", "..") else f"host-{index}.html"


def gated(h: HostView) -> list[ReleaseView]:
    return [r for r in h.releases if r.gate is not None]


def charts(h: HostView) -> list[Markup]:
    """Throughput, p99 TTFT and p99 TPOT per gate level across the host's gated releases, with
    the floors (and any latency ceilings) the gates judged against."""
    rels = gated(h)
    labels = [r.label for r in rels]
    levels = sorted({(lv.concurrency, lv.label) for r in rels for lv in r.gate.levels})
    out = []
    for value_key, limit_key, title, unit in METRICS:
        series = []
        for _, level in levels:
            figs = [(r.label, lv) for r in rels for lv in r.gate.levels if lv.label == level]
            series.append(Series(level, [(x, getattr(lv, value_key)) for x, lv in figs   # a failed level: a cross
                                         if getattr(lv, value_key) is not None or lv.passed is False]))
            limits = [(x, getattr(lv, limit_key)) for x, lv in figs if getattr(lv, limit_key) is not None]
            if limits:
                series.append(Series(f"{level} {'floor' if limit_key == 'floor' else 'ceiling'}", limits, limit=True))
        if any(s.points for s in series):
            chart_id = f"chart-{value_key.replace('_', '-')}"
            out.append(Markup(line_chart(chart_id, f"{title} per gate level, by release ({unit})", unit, labels, series)))
    return out


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("dsv4deploy.release.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fig"] = lambda v: "-" if v is None else fmt(v)
    env.filters["when"] = lambda s: (s or "")[:19].replace("T", " ")
    return env


def render_site(hosts: list[HostView], tunes: list[TuneView], generated_at: str, inventory: str) -> dict[str, str]:
    """index.html and each host's page, as text by file name (relative to reports/)."""
    env = _env()
    files = {h.name: host_file(i, h.name) for i, h in enumerate(hosts)}
    common = {"generated_at": generated_at, "inventory": inventory, "files": files}
    pages = {"index.html": env.get_template("index.html.j2").render(hosts=hosts, tunes=tunes, **common)}
    for h in hosts:
        pages[files[h.name]] = env.get_template("host.html.j2").render(
            host=h, charts=charts(h), gated=gated(h), **common)
    return pages
