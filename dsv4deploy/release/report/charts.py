"""Charts as inline SVG text, so the page needs no script and no library: one line per series
across releases, floors and ceilings as dashed steps, every point with its value in a <title>
(shown on hover, read by screen readers) and in data- attributes (what the browser test reads).
Pure: numbers in, markup out; every value is escaped."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 28, 40
COLOURS = ("#1f5fa8", "#b0450e", "#2d7d2d", "#7a3b96", "#8a6d00", "#0f7b7b")
MARKERS = ("circle", "square", "diamond", "triangle")   # told apart without colour too


@dataclass(frozen=True)
class Series:
    """NAME's value at each release label (None: that release's gate judged the level failed
    without a figure, drawn as a cross on the axis); LIMIT: a floor or ceiling (dashed)."""

    name: str
    points: list[tuple[str, float | None]]
    limit: bool = False


def fmt(value: float) -> str:
    """A figure as the page prints it everywhere (charts, tables): one decimal."""
    return f"{value:.1f}"


def _ticks(top: float) -> list[float]:
    if top <= 0:
        return [0.0]
    raw = top / 4
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 0.1
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    return [i * step for i in range(int(top / step) + 2) if i * step <= top * 1.0001 + step]


def _marker(kind: str, x: float, y: float, colour: str, attrs: str, tip: str, r: float = 4) -> str:
    shape = {"circle": f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:g}"',
             "square": f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:g}" height="{2 * r:g}"',
             "diamond": f'<path d="M{x:.1f} {y - r - 1:.1f} L{x + r + 1:.1f} {y:.1f} L{x:.1f} {y + r + 1:.1f} L{x - r - 1:.1f} {y:.1f} Z"',
             "triangle": f'<path d="M{x:.1f} {y - r - 1:.1f} L{x + r + 1:.1f} {y + r:.1f} L{x - r - 1:.1f} {y + r:.1f} Z"'}[kind]
    return f'{shape} fill="{colour}" class="point" {attrs}><title>{escape(tip)}</title>' + \
        ("</circle>" if kind == "circle" else "</rect>" if kind == "square" else "</path>")


def line_chart(chart_id: str, title: str, unit: str, x_labels: list[str], series: list[Series]) -> str:
    """An SVG line chart of SERIES over X_LABELS (release numbers, oldest first)."""
    values = [v for s in series for _, v in s.points if v is not None]
    top = max(values, default=0.0) * 1.12 or 1.0
    ticks = _ticks(top)
    top = max(top, ticks[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(x_labels) - 1, 1)
    xs = {label: LEFT + (i * step if len(x_labels) > 1 else plot_w / 2) for i, label in enumerate(x_labels)}

    def y_of(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    t = escape(title)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" role="img" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" aria-labelledby="{escape(chart_id)}-t">',
           f'<title id="{escape(chart_id)}-t">{t}</title>',
           f'<text x="{LEFT}" y="16" class="chart-title">{t}</text>']
    for tick in ticks:
        y = y_of(tick)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{tick:g}</text>')
    for label, x in xs.items():
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" class="tick">{escape(label)}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle" class="axis">release</text>'
               f'<text x="12" y="{TOP + plot_h / 2:.1f}" transform="rotate(-90 12 {TOP + plot_h / 2:.1f})" '
               f'text-anchor="middle" class="axis">{escape(unit)}</text>')
    legend_y = TOP + 4
    measured = 0
    colour = COLOURS[0]
    for s in series:     # a limit follows its series and takes its colour (and a dashed line)
        colour = colour if s.limit else COLOURS[measured % len(COLOURS)]
        missing = [(xs[label], label) for label, v in s.points if label in xs and v is None]
        pts = [(xs[label], y_of(v), label, v) for label, v in s.points if label in xs and v is not None]
        if not pts and not missing:
            continue
        name = escape(s.name)
        if s.limit:   # a step: the limit holds from one release to the next
            path = f"M{pts[0][0]:.1f} {pts[0][1]:.1f}" + "".join(f" H{x:.1f} V{y:.1f}" for x, y, _, _ in pts[1:])
            path += f" H{LEFT + plot_w:.1f}"
            out.append(f'<path d="{path}" class="limit" data-series="{name}" stroke="{colour}"/>')
            for x, y, label, v in pts:
                out.append(f'<g class="limit-value" data-series="{name}" data-release="{escape(label)}" '
                           f'data-value="{fmt(v)}"><title>{name} at release {escape(label)}: {fmt(v)} {escape(unit)}'
                           f'</title></g>')
            out.append(f'<line x1="{WIDTH - RIGHT + 12}" x2="{WIDTH - RIGHT + 34}" y1="{legend_y}" y2="{legend_y}" '
                       f'class="limit" stroke="{colour}"/>')
        else:
            marker = MARKERS[measured % len(MARKERS)]
            measured += 1
            if pts:
                out.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in pts)}" fill="none" '
                           f'stroke="{colour}" class="line"/>')
            for x, label in missing:
                y = TOP + plot_h
                out.append(f'<path d="M{x - 5:.1f} {y - 5:.1f} L{x + 5:.1f} {y + 5:.1f} M{x - 5:.1f} {y + 5:.1f} '
                           f'L{x + 5:.1f} {y - 5:.1f}" stroke="{colour}" stroke-width="2.5" class="point failed" '
                           f'data-series="{name}" data-release="{escape(label)}" data-value="-"><title>{name}, release '
                           f'{escape(label)}: gate failed, not measured</title></path>')
            for x, y, label, v in pts:
                out.append(_marker(marker, x, y, colour, f'data-series="{name}" data-release="{escape(label)}" '
                                   f'data-value="{fmt(v)}"', f"{s.name}, release {label}: {fmt(v)} {unit}"))
            out.append(_marker(marker, WIDTH - RIGHT + 23, legend_y, colour, 'aria-hidden="true"', s.name))
        out.append(f'<text x="{WIDTH - RIGHT + 40}" y="{legend_y + 4}" class="legend">{name}</text>')
        legend_y += 18
    out.append("</svg>")
    return "\n".join(out)


@dataclass(frozen=True)
class Moment:
    """One interval of the watch: when (epoch s and its ISO text), its result and its probe's
    figure (None: the interval measured none, e.g. failed or paused)."""

    t: float
    at: str
    result: str
    value: float | None
    tip: str


def _x_ticks(t0: float, t1: float) -> tuple[list[tuple[float, str]], str]:
    """Five instants from T0 to T1, labelled as finely as the span needs, and the axis's title
    (with the day when all are on one)."""
    span = max(t1 - t0, 1.0)
    fmt_ = "%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%m-%d %H:%M"
    days = {dt.datetime.fromtimestamp(t, dt.timezone.utc).date() for t in (t0, t1)}
    axis = f"time (UTC) on {days.pop()}" if len(days) == 1 and span < 86400 else "time (UTC)"
    return [(t0 + span * i / 4, dt.datetime.fromtimestamp(t0 + span * i / 4, dt.timezone.utc).strftime(fmt_))
            for i in range(5)], axis


def time_chart(chart_id: str, title: str, unit: str, series: dict[str, list[Moment]]) -> str:
    """An SVG of each target's watch intervals over time: its probe figure where it measured one
    (passed: filled marker, inconclusive: hollow), and below the axis every interval without a
    figure (failed: a cross, the others a ring), so every result is on it."""
    moments = [m for ms in series.values() for m in ms]
    t0, t1 = min((m.t for m in moments), default=0.0), max((m.t for m in moments), default=1.0)
    values = [m.value for m in moments if m.value is not None]
    top = max(values, default=0.0) * 1.15 or 1.0
    ticks = _ticks(top)
    top = max(top, ticks[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM - 14     # a strip under the plot
    strip_y = TOP + plot_h + 10

    def x_of(t: float) -> float:
        return LEFT + plot_w * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)

    t = escape(title)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" role="img" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" aria-labelledby="{escape(chart_id)}-t">',
           f'<title id="{escape(chart_id)}-t">{t}</title>', f'<text x="{LEFT}" y="16" class="chart-title">{t}</text>']
    for tick in ticks:
        y = TOP + plot_h * (1 - tick / top)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{tick:g}</text>')
    out.append(f'<text x="{LEFT - 6}" y="{strip_y + 4:.1f}" text-anchor="end" class="tick">no figure</text>')
    x_ticks, axis = _x_ticks(t0, t1)
    for tx, label in x_ticks:
        out.append(f'<text x="{x_of(tx):.1f}" y="{HEIGHT - 18}" text-anchor="middle" class="tick">{label}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle" class="axis">{axis}</text>'
               f'<text x="12" y="{TOP + plot_h / 2:.1f}" transform="rotate(-90 12 {TOP + plot_h / 2:.1f})" '
               f'text-anchor="middle" class="axis">{escape(unit)}</text>')
    legend_y = TOP + 4
    for i, (name, ms) in enumerate(series.items()):
        colour, marker = COLOURS[i % len(COLOURS)], MARKERS[i % len(MARKERS)]
        for m in ms:
            attrs = (f'data-series="{escape(name)}" data-at="{escape(m.at)}" data-result="{escape(m.result)}" '
                     f'data-value="{"-" if m.value is None else fmt(m.value)}"')
            x = x_of(m.t)
            if m.value is not None:
                y = TOP + plot_h * (1 - m.value / top)
                fill = colour if m.result == "passed" else "#fff"
                out.append(_marker(marker, x, y, fill, f'stroke="{colour}" {attrs}', m.tip, r=3))
            elif m.result == "failed":
                out.append(f'<path d="M{x - 4:.1f} {strip_y - 4:.1f} L{x + 4:.1f} {strip_y + 4:.1f} M{x - 4:.1f} '
                           f'{strip_y + 4:.1f} L{x + 4:.1f} {strip_y - 4:.1f}" stroke="#b00020" stroke-width="2" '
                           f'class="point failed" {attrs}><title>{escape(m.tip)}</title></path>')
            else:
                out.append(f'<circle cx="{x:.1f}" cy="{strip_y:.1f}" r="3" fill="none" stroke="{colour}" '
                           f'class="point" {attrs}><title>{escape(m.tip)}</title></circle>')
        out.append(_marker(marker, WIDTH - RIGHT + 23, legend_y, colour, 'aria-hidden="true"', name))
        out.append(f'<text x="{WIDTH - RIGHT + 40}" y="{legend_y + 4}" class="legend">{escape(name)}</text>')
        legend_y += 18
    out.append("</svg>")
    return "\n".join(out)
