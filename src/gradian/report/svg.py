"""Hand-written inline SVG plots for the HTML report (no library, nothing fetched).

Every plot is a function of report-model data returning :class:`markupsafe.Markup`.
All text that can come from data (capability names, row ids, check messages)
goes through ``Markup.format``, which HTML-escapes its arguments, and is
cleaned with :func:`gradian.report.safe.clean` first.

Plots:

* :func:`ci_plot`: capability deltas with their confidence intervals (one row
  per capability; zero line; colour = verdict). Capabilities measured in
  different units (accuracy vs nats) get separate plots.
* :func:`profile_plot`: every training row's score, sorted most harmful first
  (negative = degraded); the harmful tail (the rows the clusters hold) in red.
* :func:`cluster_plot`: clusters as points, size (rows) vs share of the harmful
  score; filled when an audit finding explains the cluster.
* :func:`loss_plot`: training loss (and eval loss) against the step, with a
  marker at every step an Audit log check flagged.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from markupsafe import Markup

from gradian.report.safe import clean, shorten

RED = "#c62828"
RED_SOFT = "#ef9a9a"
GREY = "#9e9e9e"
BLUE = "#1565c0"
GREEN = "#2e7d32"
ORANGE = "#ef6c00"
INK = "#212121"
GRID = "#e0e0e0"
VERDICT_COLOUR = {"regressed": RED, "improved": GREEN, "within_noise": GREY}
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


def fmt_num(x: Any, digits: int = 3) -> str:
    """Compact number: ``-3.8e+05``, ``0.0123``, ``12.3``; ``n/a`` for NaN, None or anything but a number."""
    if not isinstance(x, (int, float)) or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    ax = abs(x)
    if ax != 0 and (ax >= 1e4 or ax < 1e-3):
        return f"{x:.{max(1, digits - 1)}e}"
    return f"{x:.{digits}g}"


def fmt_pct(x: Any) -> str:
    """A share as a whole percent: ``0.425`` -> ``42%``; ``n/a`` for anything but a number."""
    return f"{x:.0%}" if isinstance(x, (int, float)) else "n/a"


def fmt_tick(x: float) -> str:
    """An axis label: ``-100k``, ``2.5M``, ``0.25``, ``3e-05``."""
    ax = abs(x)
    if ax >= 1e9:
        return f"{x / 1e9:g}G"
    if ax >= 1e6:
        return f"{x / 1e6:g}M"
    if ax >= 1e4:
        return f"{x / 1e3:g}k"
    return fmt_num(x)


def fmt_score(x: float, unit: str) -> str:
    """A capability score: ``0.56`` for accuracy, ``-1.234 nats`` for log-likelihood."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.2f}" if unit == "accuracy" else f"{x:.3f} nats"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step + 1e-9) * step
    out = []
    v = start
    while v < hi + step * (1 - 1e-9):
        out.append(round(v, 12) + 0.0 if abs(v) > 1e-9 * step else 0.0)
        v += step
    return out


class _Scale:
    def __init__(self, d0: float, d1: float, r0: float, r1: float):
        if d1 == d0:
            d0, d1 = d0 - 1, d1 + 1
        self.d0, self.d1, self.r0, self.r1 = d0, d1, r0, r1

    def __call__(self, v: float) -> float:
        return self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)


def _svg(width: int, height: int, label: str, body: Sequence[Markup], cls: str) -> Markup:
    return Markup(
        '<svg xmlns="http://www.w3.org/2000/svg" class="plot {}" role="img" aria-label="{}" '
        'viewBox="0 0 {} {}" width="{}" height="{}" style="{};font-size:12px;width:100%;height:auto">'
        "<title>{}</title>{}</svg>"
    ).format(cls, clean(label), width, height, width, height, Markup(FONT), clean(label), Markup("").join(body))


def _axis_titles(frame: tuple[float, ...], x_title: str, y_title: str) -> list[Markup]:
    """A plot's x-axis title (centred under the plot) and its y-axis title (rotated, left); ``frame`` is
    ``(width, height, left, right, top, bottom)``.
    """
    width, height, left, right, top, bottom = frame
    return [
        _text((left + width - right) / 2, height - 8, x_title, "middle", "#616161", 11),
        Markup(
            '<text transform="translate(14,{:.1f}) rotate(-90)" text-anchor="middle" fill="#616161" '
            'font-size="11">{}</text>'
        ).format((top + height - bottom) / 2, y_title),
    ]


def _text(
    x: float,
    y: float,
    s: Any,
    anchor: str = "start",
    fill: str = INK,
    size: int | None = None,
    weight: str | None = None,
) -> Markup:
    extra = Markup("")
    if size:
        extra += Markup(' font-size="{}"').format(size)
    if weight:
        extra += Markup(' font-weight="{}"').format(weight)
    return Markup('<text x="{:.1f}" y="{:.1f}" text-anchor="{}" fill="{}"{}>{}</text>').format(
        x, y, anchor, fill, extra, clean(s)
    )


def _line(x1, y1, x2, y2, stroke=GRID, width=1.0, dash: str | None = None) -> Markup:
    d = Markup(' stroke-dasharray="{}"').format(dash) if dash else Markup("")
    return Markup('<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="{}"{}/>').format(
        x1, y1, x2, y2, stroke, width, d
    )


def _x_axis(sx: _Scale, y: float, top: float, ticks: list[float], fmt=fmt_tick) -> list[Markup]:
    out = []
    for t in ticks:
        x = sx(t)
        out.append(_line(x, top, x, y))
        out.append(_text(x, y + 14, fmt(t), "middle", "#616161", 11))
    return out


def _y_axis(sy: _Scale, x0: float, x1: float, ticks: list[float], fmt=fmt_tick) -> list[Markup]:
    out = []
    for t in ticks:
        y = sy(t)
        out.append(_line(x0, y, x1, y))
        out.append(_text(x0 - 6, y + 4, fmt(t), "end", "#616161", 11))
    return out


def ci_plot(caps: Sequence[Any], unit: str = "accuracy") -> Markup:
    """Δ per capability with its CI. ``caps``: :class:`CapabilityView` of one ``unit``."""
    caps = [c for c in caps if c.unit == unit]
    if not caps:
        return Markup("")
    width, left, right, top, row = 900, 170, 290, 26, 30
    height = top + row * len(caps) + 34
    vals = [v for c in caps for v in (c.ci_low, c.ci_high, c.delta) if v is not None and math.isfinite(v)] + [0.0]
    lo, hi = min(vals), max(vals)
    pad = 0.08 * ((hi - lo) or 1.0)
    ticks = nice_ticks(lo - pad, hi + pad, 6)
    lo, hi = min([lo - pad] + ticks), max([hi + pad] + ticks)
    sx = _Scale(lo, hi, left, width - right)
    body: list[Markup] = []
    bottom = top + row * len(caps)
    body += _x_axis(sx, bottom, top - 8, ticks)
    body.append(_line(sx(0), top - 10, sx(0), bottom, INK, 1.2, "4 3"))
    body.append(_text(sx(0), top - 14, "no change", "middle", "#616161", 11))
    for i, c in enumerate(caps):
        y = top + row * i + row / 2
        col = VERDICT_COLOUR.get(c.verdict, GREY)
        body.append(_text(left - 10, y + 4, shorten(c.name, 24), "end", weight="600"))
        if math.isfinite(c.ci_low) and math.isfinite(c.ci_high):
            body.append(_line(sx(c.ci_low), y, sx(c.ci_high), y, col, 3))
            for v in (c.ci_low, c.ci_high):
                body.append(_line(sx(v), y - 6, sx(v), y + 6, col, 2))
        if math.isfinite(c.delta):
            body.append(
                Markup('<circle cx="{:.1f}" cy="{:.1f}" r="6" fill="{}"><title>{}</title></circle>').format(
                    sx(c.delta),
                    y,
                    col,
                    clean(f"{c.name}: Δ {c.delta:+.3f}, CI [{c.ci_low:+.3f}, {c.ci_high:+.3f}], {c.verdict}"),
                )
            )
        verdict = c.verdict.replace("_", " ")
        body.append(
            _text(
                width - right + 12, y + 4, f"Δ {c.delta:+.2f} [{c.ci_low:+.2f}, {c.ci_high:+.2f}] {verdict}", fill=col
            )
        )
    axis = "Δ accuracy (tuned − reference)" if unit == "accuracy" else "Δ mean log-likelihood, nats"
    body.append(_text((left + width - right) / 2, height - 6, axis, "middle", "#616161", 11))
    return _svg(
        width,
        height,
        f"Capability deltas with {int(round(caps[0].confidence * 100))}% confidence intervals",
        body,
        "ci",
    )


def profile_plot(profile: Any, capability: str) -> Markup:
    """Sorted verdict scores (``ScoreProfile``, % of the harmful total), most harmful first; the harmful tail in red."""
    pts = [p for p in profile.points if p[1] is not None and math.isfinite(p[1])]
    if not pts:
        return Markup("")
    width, height, left, right, top, bottom = 900, 270, 78, 20, 30, 40
    n = profile.n
    ys = [p[1] for p in pts] + [0.0]
    lo, hi = min(ys), max(ys)
    pad = 0.05 * ((hi - lo) or 1.0)
    ticks = nice_ticks(lo - pad, hi + pad, 5)
    sy = _Scale(min([lo - pad] + ticks), max([hi + pad] + ticks), height - bottom, top)
    sx = _Scale(0, max(1, n), left, width - right)
    body: list[Markup] = list(_y_axis(sy, left, width - right, ticks, lambda v: f"{fmt_tick(v)}%"))
    y0 = sy(0.0)
    if n <= 120:
        w = max(1.0, (width - left - right) / n - 1)
        for r, s, tail in pts:
            col = RED if tail else (BLUE if s > 0 else GREY)
            y = min(sy(s), y0)
            body.append(
                Markup('<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"/>').format(
                    sx(r) + 0.5, y, w, max(0.5, abs(sy(s) - y0)), col
                )
            )
    else:

        def area(seg, col):
            if not seg:
                return Markup("")
            d = f"M{sx(seg[0][0]):.1f},{y0:.1f} " + " ".join(f"L{sx(r):.1f},{sy(s):.1f}" for r, s, _ in seg)
            d += f" L{sx(seg[-1][0]):.1f},{y0:.1f} Z"
            return Markup('<path d="{}" fill="{}" stroke="{}" stroke-width="0.8"/>').format(d, col, col)

        body.append(area([p for p in pts if p[2]], RED))
        body.append(area([p for p in pts if not p[2] and p[1] <= 0], GREY))
        body.append(area([p for p in pts if not p[2] and p[1] > 0], BLUE))
    body.append(_line(left, y0, width - right, y0, INK, 1))
    if profile.tail_n:
        xt = sx(profile.tail_n)
        body.append(_line(xt, top, xt, height - bottom, RED, 1, "3 3"))
        body.append(
            _text(
                min(xt + 6, width - right - 4),
                top + 12,
                f"harmful tail: {profile.tail_n} row{'s' if profile.tail_n != 1 else ''}, "
                f"{profile.tail_mass:.0%} of the harmful score",
                fill=RED,
            )
        )
    body.append(_text(left, height - bottom + 16, "most harmful", "start", "#616161", 11))
    body.append(_text(width - right, height - bottom + 16, "most reinforcing", "end", "#616161", 11))
    body += _axis_titles(
        (width, height, left, right, top, bottom),
        f"{n} training rows, sorted by score ({profile.n_negative} degraded, {profile.n_positive} reinforced)",
        "score, % of the harmful total (negative = harmful)",
    )
    return _svg(width, height, f"Score of every training row for {capability}, most harmful first", body, "profile")


def cluster_plot(clusters: Sequence[Any], capability: str) -> Markup:
    """Clusters (``ClusterView``): rows (x) vs share of the harmful score (y); filled = explained by Audit."""
    if not clusters:
        return Markup("")
    width, height, left, right, top, bottom = 900, 270, 60, 30, 24, 42
    max_size = max(c.size for c in clusters)
    use_log = max_size > 50
    if use_log:

        def fx(v: float) -> float:
            return math.log10(max(1, v))

        xt = [v for v in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if v <= max_size * 1.2]
        sx = _Scale(0, fx(max_size * 1.3), left, width - right)

        def xpos(v: float) -> float:
            return sx(fx(v))
    else:
        xt = [t for t in nice_ticks(0, max_size + 1, 6) if t >= 0 and float(t).is_integer()] or [0, max_size + 1]
        sx = _Scale(0, max(xt[-1] if xt else 1, max_size + 1), left, width - right)
        xpos = sx
    ymax = max(0.05, max(c.harmful_share for c in clusters) * 1.15)
    yt = nice_ticks(0, ymax, 5)
    sy = _Scale(0, max([ymax] + yt), height - bottom, top)
    body: list[Markup] = list(_y_axis(sy, left, width - right, yt, lambda v: f"{v:.0%}"))
    for t in xt:
        body.append(_line(xpos(t), top, xpos(t), height - bottom))
        body.append(_text(xpos(t), height - bottom + 14, f"{t:g}", "middle", "#616161", 11))
    placed: list[tuple[float, float]] = []  # label anchors already used, to keep labels apart
    for c in sorted(clusters, key=lambda c: (c.size, -c.harmful_share)):
        x, y = xpos(c.size), sy(c.harmful_share)
        ex = [e["text"] for e in c.explanations]
        tip = f"cluster #{c.label}: {c.size} rows, {c.harmful_share:.0%} of the harmful score" + (
            "; " + "; ".join(ex) if ex else "; no audit finding explains it"
        )
        fill = ORANGE if c.explained else "#ffffff"
        body.append(
            Markup(
                '<circle cx="{:.1f}" cy="{:.1f}" r="8" fill="{}" stroke="{}" stroke-width="2" fill-opacity="0.85">'
                "<title>{}</title></circle>"
            ).format(x, y, fill, ORANGE if c.explained else "#455a64", clean(tip))
        )
        lx = x + 12
        while any(abs(lx - px) < 26 and abs(y - py) < 12 for px, py in placed):
            lx += 26
        placed.append((lx, y))
        body.append(_text(lx, y + 4, f"#{c.label}", "start", INK, 11, "600"))
    body += _axis_titles(
        (width, height, left, right, top, bottom),
        "rows in the cluster"
        + (" (log scale)" if use_log else "")
        + "   ● filled: an audit finding explains it   ○ open: no mechanical explanation",
        "share of the harmful score",
    )
    return _svg(
        width, height, f"Harmful clusters for {capability}: size against share of the harmful score", body, "clusters"
    )


def loss_plot(log: Any) -> Markup:
    """Training loss (``TrainingLogView``) with Audit's flagged steps marked."""
    loss = [(s, v) for s, v in log.loss if v is not None and math.isfinite(v)]
    ev = [(s, v) for s, v in log.eval_loss if v is not None and math.isfinite(v)]
    if not loss and not ev:
        return Markup("")
    width, height, left, right, top, bottom = 900, 280, 60, 20, 34, 42
    steps = [s for s, _ in loss + ev] + [s for a in log.anomalies for s in a["steps"]]
    vals = [v for _, v in loss + ev]
    lo, hi = min(vals), max(vals)
    pad = 0.06 * ((hi - lo) or 1.0)
    yt = nice_ticks(max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad, 5)
    sy = _Scale(min([lo - pad] + yt), max([hi + pad] + yt), height - bottom, top)
    s0, s1 = min(steps), max(steps)
    xt = nice_ticks(s0, s1, 6)
    sx = _Scale(min([s0] + xt), max([s1] + xt), left, width - right)
    body: list[Markup] = list(_y_axis(sy, left, width - right, yt))
    body += _x_axis(sx, height - bottom, top, xt, lambda v: f"{v:g}")
    colours = [RED, ORANGE, "#6a1b9a", "#00838f", "#ad1457"]
    for i, a in enumerate(log.anomalies):
        col = colours[i % len(colours)]
        for s in a["steps"]:
            if s0 <= s <= s1:
                body.append(
                    Markup(
                        '<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="{}" stroke-width="1.5" '
                        'stroke-dasharray="4 3" opacity="0.85"><title>{}</title></line>'
                    ).format(
                        sx(s),
                        top,
                        sx(s),
                        height - bottom,
                        col,
                        clean(f"{a['check']} {a['name']} at step {s}: {a['message']}"),
                    )
                )
        if a["steps"]:
            s = min(max(a["steps"][0], s0), s1)
            body.append(_text(sx(s) + 3, top - 8 - 12 * (i % 2), f"{a['check']} {a['name']}", "start", col, 11, "600"))
    if loss:
        pts = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in loss)
        body.append(Markup('<polyline points="{}" fill="none" stroke="{}" stroke-width="1.6"/>').format(pts, BLUE))
    if ev:
        pts = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in ev)
        body.append(Markup('<polyline points="{}" fill="none" stroke="{}" stroke-width="1.6"/>').format(pts, ORANGE))
        for s, v in ev:
            body.append(Markup('<circle cx="{:.1f}" cy="{:.1f}" r="2.5" fill="{}"/>').format(sx(s), sy(v), ORANGE))
    lx = left
    ly = height - 12
    body.append(_text(lx, ly + 4, "step →", "start", "#616161", 11))
    lx += 60
    items = (
        [(BLUE, None, "train loss")]
        + ([(ORANGE, None, "eval loss")] if ev else [])
        + ([(RED, "4 3", "steps flagged by Audit")] if log.anomalies else [])
    )
    for col, dash, label in items:
        body.append(_line(lx, ly, lx + 22, ly, col, 2, dash))
        body.append(_text(lx + 28, ly + 4, label, "start", "#616161", 11))
        lx += 40 + 7 * len(label)
    return _svg(width, height, "Training loss with the log anomalies Audit flagged", body, "loss")


def fmt_verdict(x: Any) -> str:
    """A verdict score (:func:`gradian.sign.verdict_scores`, percent of the harmful total): ``-7.9%``, ``-0.04%``."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "n/a"
    ax = abs(x)
    if ax >= 10:
        return f"{x:+.0f}%"
    if ax >= 0.1 or ax == 0:
        return f"{x:+.1f}%"
    return f"{x:+.2g}%"
