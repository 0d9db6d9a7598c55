"""The pages themselves: index.html (a card per host, grouped by the inventory it was read
through, the tune runs) and one page per host (its release timeline with gate links and profile
changes, the gate charts and their figures as a table, a replica's own gates charted apart, the
watch's results over time). Jinja2 with autoescape: every string of a record is escaped; the
only markup let through is the SVG charts.py builds from numbers and escaped text. Pure: views
in, {file name: HTML} out."""

from __future__ import annotations

import jinja2
from markupsafe import Markup

from dsv4deploy.profile.boundary import Rule
from dsv4deploy.release.report.charts import Moment, Series, fmt, line_chart, time_chart
from dsv4deploy.release.report.model import GateView, HostView, ReleaseView, TuneView

# a host's page is named after it: only names that are safe as one file name in reports/
HOST_FILE = Rule("a host name of letters, digits, '.', '_' and '-'", 200, r"[A-Za-z0-9][A-Za-z0-9._-]*")
METRICS = (("throughput", "floor", "output throughput", "tok/s"),
           ("p99_ttft_ms", "ttft_ceiling", "p99 TTFT", "ms"),
           ("p99_tpot_ms", "tpot_ceiling", "p99 TPOT", "ms"))


def host_file(index: int, name: str) -> str:
    return f"host-{name}.html" if HOST_FILE.check(name) is None and name not in (".", "..") else f"host-{index}.html"


def gated(h: HostView) -> list[tuple[ReleaseView, GateView]]:
    """Every gate report of the host, by release, the server's (or set's) before each replica's."""
    return [(r, g) for r in h.releases for g in r.gates]


def parts(h: HostView) -> list[str | None]:
    """The gates the host's releases ran: None (the server, or a set through its gateway), then
    each replica gated alone (`replica-0`, ...)."""
    found = {g.part for _, g in gated(h)}
    return sorted(found, key=lambda p: -1 if p is None else int(p.rsplit("-", 1)[1]))


def charts(h: HostView, part: str | None = None) -> list[Markup]:
    """Throughput, p99 TTFT and p99 TPOT per gate level across the host's releases gated as PART
    (None: the server or the set), with the floors (and any latency ceilings) they were judged
    against."""
    rels = [(r, g) for r, g in gated(h) if g.part == part]
    labels = [r.label for r, _ in rels]
    levels = sorted({(lv.concurrency, lv.label) for _, g in rels for lv in g.levels})
    out = []
    for value_key, limit_key, title, unit in METRICS:
        series = []
        for _, level in levels:
            figs = [(r.label, lv) for r, g in rels for lv in g.levels if lv.label == level]
            series.append(Series(level, [(x, getattr(lv, value_key)) for x, lv in figs   # a failed level: a cross
                                         if getattr(lv, value_key) is not None or lv.passed is False]))
            limits = [(x, getattr(lv, limit_key)) for x, lv in figs if getattr(lv, limit_key) is not None]
            if limits:
                series.append(Series(f"{level} {'floor' if limit_key == 'floor' else 'ceiling'}", limits, limit=True))
        if any(s.points for s in series):
            chart_id = f"chart-{value_key.replace('_', '-')}" + (f"-{part}" if part else "")
            whose = f", {part} gated alone" if part else ""
            out.append(Markup(line_chart(chart_id, f"{title} per gate level, by release ({unit}){whose}", unit,
                                         labels, series)))
    return out


def watch_chart(h: HostView) -> Markup | None:
    """The watch's intervals over time, each target's probe time per output token (docs/watch.md)."""
    results = (h.watch or {}).get("results") or []
    if not results:
        return None
    series: dict[str, list[Moment]] = {}
    for r in results:
        value = r.get("tpot_ms")
        said = f"{fmt(value)} ms" if value is not None else (r.get("why") or "no figure")
        series.setdefault(str(r.get("target")), []).append(Moment(
            t=float(r["t"]), at=str(r.get("at")), result=str(r.get("result")), value=value,
            tip=f"{r.get('target')}, {str(r.get('at'))[:19].replace('T', ' ')} UTC: {r.get('result')}"
                + (f" ({r['cause']})" if r.get("cause") else "") + f", {said}"))
    return Markup(time_chart("chart-watch", "The watch's probe: time per output token at each interval (ms)",
                             "ms", series))


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("dsv4deploy.release.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fig"] = lambda v: "-" if v is None else fmt(v)
    env.filters["when"] = lambda s: (s or "")[:19].replace("T", " ")
    return env


def by_inventory(hosts: list[HostView], inventory: str) -> list[tuple[str, list[HostView]]]:
    """The hosts grouped by the inventory they were read through, INVENTORY (this run's) first."""
    groups: dict[str, list[HostView]] = {inventory: []}
    for h in hosts:
        key = inventory if h.read_now else (h.inventory or "an inventory not recorded")
        groups.setdefault(key, []).append(h)
    return [(name, members) for name, members in groups.items() if members or name == inventory]


def render_site(hosts: list[HostView], tunes: list[TuneView], generated_at: str, inventory: str) -> dict[str, str]:
    """index.html and each host's page, as text by file name (relative to reports/)."""
    env = _env()
    files = {h.name: host_file(i, h.name) for i, h in enumerate(hosts)}
    common = {"generated_at": generated_at, "inventory": inventory, "files": files}
    pages = {"index.html": env.get_template("index.html.j2").render(groups=by_inventory(hosts, inventory),
                                                                     hosts=hosts, tunes=tunes, **common)}
    for h in hosts:
        sections = [(part, charts(h, part)) for part in parts(h)]
        pages[files[h.name]] = env.get_template("host.html.j2").render(
            host=h, sections=sections, gated=gated(h), watch_chart=watch_chart(h), **common)
    return pages
