"""The SLI job's HTML report: one self-contained page (inline SVG charts, no scripts).

The page skeleton, its styles and fixed texts are the template ``report.html`` beside this module
(package data); :func:`render_html` fills in the parts computed from the job's rows: the
verdict banner and table first, then p99 publish latency, p99 delivery latency, error rate and
backlog age over time against their targets, then the worst topics, subscriptions and errors.
Pure: rows in, text out (the one clock read is the "generated" time).
"""

from __future__ import annotations

import functools
import html
import math
from datetime import UTC, datetime
from importlib import resources
from string import Template
from typing import Any

from pubsubd.spark.sli.slo import Check, SloConfig, error_rate

TEMPLATE = "report.html"

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
MAX_SERIES = 8


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value * 100:.2f}%"
    if unit == "ms":  # delivery latencies reach seconds: keep axis labels short
        return f"{value:,.0f} ms" if abs(value) >= 1000 else f"{value:.2f} ms"
    if unit == "s":
        return f"{value:.1f} s"
    return f"{value:g}"


UNITS = {
    "publish_p99_ms": "ms",
    "publish_p95_ms": "ms",
    "error_rate": "%",
    "backlog_oldest_age_s": "s",
    "delivery_p99_ms": "ms",
    "delivery_p95_ms": "ms",
}
LABELS = {
    "publish_p99_ms": "Publish latency p99",
    "publish_p95_ms": "Publish latency p95",
    "error_rate": "Error rate",
    "backlog_oldest_age_s": "Oldest unacked message",
    "delivery_p99_ms": "Delivery latency p99 (publish to ack)",
    "delivery_p95_ms": "Delivery latency p95 (publish to ack)",
}


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = float(10.0 ** math.floor(math.log10(v)))
    for m in (1, 2, 2.5, 5, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def svg_chart(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    unit: str,
    threshold: float | None = None,
    width: int = 1000,
    height: int = 260,
    xrange: tuple[float, float] | None = None,
) -> str:
    """A line chart: x = epoch seconds, y in ``unit``; a dashed red line at ``threshold``."""
    left, right, top, bottom = 70, 230, 30, 40
    pw, ph = width - left - right, height - top - bottom
    e = html.escape
    parts = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="system-ui,sans-serif" font-size="12">',
        f'<text x="{left}" y="18" font-size="14" font-weight="600">{e(title)}</text>',
    ]
    points = [p for pts in series.values() for p in pts]
    if not points:
        parts.append(
            f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" fill="#888">'
            "no data in this window</text></svg>"
        )
        return "".join(parts)
    x0, x1 = xrange or (min(p[0] for p in points), max(p[0] for p in points))
    if x1 - x0 < 600:  # at least ten minutes wide, the data centred
        mid = (x0 + x1) / 2
        x0, x1 = mid - 300, mid + 300
    ymax = _nice_max(max([p[1] for p in points] + ([threshold * 1.1] if threshold else [])))

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - min(y, ymax) / ymax * ph

    for i in range(5):  # y grid and labels
        y = ymax * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            f'stroke="#e5e5e5"/><text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" '
            f'fill="#555">{e(_fmt(y, unit))}</text>'
        )
    step = next(s for s in TICK_STEPS_S if (x1 - x0) / s <= 8)
    for x in range(int(math.ceil(x0 / step) * step), int(x1) + 1, step):  # x labels (UTC)
        fmt = "%H:%M" if step < 86_400 else "%m-%d"
        label = datetime.fromtimestamp(x, UTC).strftime(fmt)
        parts.append(
            f'<text x="{sx(x):.1f}" y="{top + ph + 18}" text-anchor="middle" fill="#555">'
            f"{label}</text>"
        )
    parts.append(
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#999"/>'
        f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#999"/>'
        f'<text x="{left + pw}" y="{top + ph + 34}" text-anchor="end" fill="#888">time (UTC)'
        "</text>"
    )
    if threshold is not None:
        ty = sy(threshold)
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#d93025" '
            f'stroke-width="2" stroke-dasharray="6,4"/><text x="{left + pw - 4}" y="{ty - 5:.1f}" '
            f'text-anchor="end" fill="#d93025" font-weight="600">SLO {e(_fmt(threshold, unit))}'
            "</text>"
        )
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(pts)
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        if len(pts) > 1:
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        if len(pts) <= 60:
            parts.extend(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
                f"<title>{e(name)} {e(_fmt(y, unit))}</title></circle>"
                for x, y in pts
            )
        ly = top + 6 + i * 18
        short = _short(name)
        short = short if len(short) <= 28 else "…" + short[-27:]
        parts.append(
            f'<rect x="{left + pw + 14}" y="{ly}" width="12" height="12" fill="{color}"/>'
            f'<text x="{left + pw + 32}" y="{ly + 10}">{e(short)}<title>{e(name)}</title></text>'
        )
    parts.append("</svg>")
    return "".join(parts)


TICK_STEPS_S = [60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600, 43_200, 86_400, 7 * 86_400]


def _short(name: str) -> str:
    """``projects/P/topics/T`` -> ``P/T`` (legends are narrow)."""
    parts = name.split("/")
    return f"{parts[1]}/{parts[3]}" if len(parts) == 4 and parts[0] == "projects" else name


def _epoch(t: Any) -> float:
    if isinstance(t, datetime):
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    return float(t)


def _top(series: dict[str, list[tuple[float, float]]]) -> dict[str, list[tuple[float, float]]]:
    """The MAX_SERIES series with the highest peaks (the ones worth looking at)."""
    ranked = sorted(series.items(), key=lambda kv: -max(y for _, y in kv[1]))
    return dict(ranked[:MAX_SERIES])


def _percentile_cells(row: Any) -> str:
    """The p50/p95/p99 and volume-weighted p99 table cells of one report row (a dash where
    there is no value)."""
    keys = ("p50_ms", "p95_ms", "p99_ms", "weighted_p99_ms")
    values = [row.get(k) if hasattr(row, "get") else row[k] for k in keys]
    return "".join(
        f"<td class='num'>{_fmt(float(v), 'ms') if v is not None else '&ndash;'}</td>"
        for v in values
    )


@functools.cache
def _template() -> Template:
    text = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    return Template(text.removesuffix("\n"))


def render_html(
    checks: list[Check],
    publish: list[Any],
    totals: list[Any],
    errors: list[Any],
    backlog: list[Any],
    slo: SloConfig,
    source: str,
    delivery: list[Any] | None = None,
    delivery_totals: list[Any] | None = None,
) -> str:
    """The report page for the job's collected rows (see :func:`pubsubd.spark.sli.jobs.run`)."""
    e = html.escape
    delivery = delivery or []
    failed = [c for c in checks if c.status == "FAIL"]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    minutes = sorted({_epoch(r["minute"]) for rows in (publish, errors, delivery) for r in rows})
    window = (
        f"{datetime.fromtimestamp(minutes[0], UTC):%Y-%m-%d %H:%M} to "
        f"{datetime.fromtimestamp(minutes[-1], UTC):%H:%M} UTC ({len(minutes)} min)"
        if minutes
        else "no events"
    )
    if not checks:
        banner = "<div class='banner bad'>No SLI events found: nothing to check.</div>"
    elif failed:
        banner = f"<div class='banner bad'>✗ {len(failed)} of {len(checks)} SLO checks FAIL</div>"
    else:
        banner = f"<div class='banner ok'>✓ All {len(checks)} SLO checks pass</div>"
    summary_rows = []
    for c in sorted(checks, key=lambda c: (c.status == "PASS", c.slo, -c.actual)):
        unit = UNITS[c.slo]
        summary_rows.append(
            f"<tr class='{c.status}row'><td class='{c.status}'>{c.status}</td>"
            f"<td>{e(LABELS[c.slo])}</td><td>{e(c.scope)}</td>"
            f"<td class='num'>≤ {e(_fmt(c.target, unit))}</td>"
            f"<td class='num'>{e(_fmt(c.actual, unit))}</td>"
            f"<td class='num'>{c.bad_minutes} / {c.minutes}</td></tr>"
        )

    every = [_epoch(r["minute"]) for rows in (publish, errors, backlog, delivery) for r in rows]
    span = (min(every), max(every)) if every else None  # one time axis for all charts
    if span is not None and span[1] - span[0] < 600:
        span = ((span[0] + span[1]) / 2 - 300, (span[0] + span[1]) / 2 + 300)
    p99: dict[str, list[tuple[float, float]]] = {}
    for r in publish:
        if r["p99_ms"] is not None:
            p99.setdefault(r["topic"], []).append((_epoch(r["minute"]), float(r["p99_ms"])))
    d99: dict[str, list[tuple[float, float]]] = {}
    for r in delivery:
        if r["p99_ms"] is not None:
            d99.setdefault(r["subscription"], []).append((_epoch(r["minute"]), float(r["p99_ms"])))
    ok: dict[float, int] = {}
    for r in publish:
        m = _epoch(r["minute"])
        ok[m] = ok.get(m, 0) + r["publishes"] - r["failed"]
    err: dict[float, int] = {}
    for r in errors:
        m = _epoch(r["minute"])
        err[m] = err.get(m, 0) + r["errors"]
    rate = [(m, error_rate(err.get(m, 0), ok.get(m, 0))) for m in sorted(set(ok) | set(err))]
    age: dict[str, list[tuple[float, float]]] = {}
    for r in backlog:
        age.setdefault(r["subscription"], []).append(
            (_epoch(r["minute"]), float(r["max_oldest_age_s"] or 0.0))
        )

    topic_rows = [
        f"<tr><td>{e(t['topic'])}</td><td class='num'>{t['publishes']}</td>"
        f"<td class='num'>{t['failed']}</td>{_percentile_cells(t)}</tr>"
        for t in sorted(totals, key=lambda t: -(t["p99_ms"] or 0.0))[:20]
    ]
    if delivery_totals:
        subscriptions = [
            "<table><thead><tr><th>Subscription</th><th>Topic</th><th>Acked</th><th>p50</th>"
            "<th>p95</th><th>p99</th><th>p99 by volume</th></tr></thead><tbody>"
        ]
        subscriptions.extend(
            f"<tr><td>{e(t['subscription'])}</td><td>{e(t['topic'])}</td>"
            f"<td class='num'>{t['acked']}</td>{_percentile_cells(t)}</tr>"
            for t in sorted(delivery_totals, key=lambda t: -(t["p99_ms"] or 0.0))[:20]
        )
        subscriptions.append("</tbody></table>")
    else:
        subscriptions = ["<p>No acknowledged messages in this window.</p>"]
    by_code: dict[tuple[str, str], int] = {}
    for r in errors:
        key = (r["method"], r["code"])
        by_code[key] = by_code.get(key, 0) + r["errors"]
    if by_code:
        error_table = ["<table><thead><tr><th>Method</th><th>Code</th><th>Errors</th></tr></thead>"]
        error_table.extend(
            f"<tr><td>{e(m)}</td><td>{e(c)}</td><td class='num'>{n}</td></tr>"
            for (m, c), n in sorted(by_code.items(), key=lambda kv: -kv[1])
        )
        error_table.append("</table>")
    else:
        error_table = ["<p>No errors.</p>"]

    return _template().substitute(
        window=e(window),
        source=e(source),
        generated=when,
        banner=banner,
        summary_rows="".join("\n" + row for row in summary_rows),
        publish_chart=svg_chart(
            "p99 publish latency by topic",
            _top(p99),
            "ms",
            slo.default["publish_p99_ms"],
            xrange=span,
        ),
        delivery_chart=svg_chart(
            "p99 delivery latency by subscription",
            _top(d99),
            "ms",
            slo.default["delivery_p99_ms"],
            xrange=span,
        ),
        error_chart=svg_chart(
            "errors / (successful publishes + errors)",
            {"all RPCs": rate},
            "%",
            slo.default["error_rate"],
            xrange=span,
        ),
        backlog_chart=svg_chart(
            "oldest unacked age by subscription",
            _top(age),
            "s",
            slo.default["backlog_oldest_age_s"],
            xrange=span,
        ),
        topic_rows="".join("\n" + row for row in topic_rows),
        subscriptions="\n".join(subscriptions),
        errors="\n".join(error_table),
    )
