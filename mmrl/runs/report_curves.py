"""The curves of a run's ``metrics.jsonl`` for its report page: one small plot per logged quantity.

Which keys are drawn, grouped as the page shows them: the training reward and each reward
function's (``reward``, ``reward/<fn>``), every held-out metric (``eval/<metric>``, step 0 being the
evaluation before training, with the before/after confidence intervals of ``summary.json`` drawn
on it), the training loss, gradient norm and learning rate (an ``mmrl sft`` run's curves are these
and ``eval/loss``), the policy's KL, entropy, clip fractions and completion length, and one plot of the step
time split into rollout (``rollout_time``) and update (``step_time`` minus it). A key that the run
did not log, or logged without a finite value, gets no plot. Each plot is a small SVG written
here (a frame with the first and last step and the lowest and highest value marked, the line, the
interval bars; a long run's line keeps each pixel column's extremes), put in the page as a data
URI: the page needs nothing beside it, and the curves of a run cost milliseconds (matplotlib, one
figure per plot, took about 0.1 s each, and 0.4 s more to import).
"""

from __future__ import annotations

import base64
import html
import math
from typing import Any, Callable, Optional

__all__ = ["SECTIONS", "curve_keys", "curves_html", "number"]


def number(value: Any) -> Optional[float]:
    """``value`` as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _reward_curve(key: str) -> bool:
    return key == "reward" or (key.startswith("reward/") and not key.endswith("unparsable_frac"))


def _policy_curve(key: str) -> bool:
    if key.startswith(("reward/", "eval/", "data/")):
        return False
    return key in ("kl", "policy_kl") or "entropy" in key or key.startswith("clip_frac") or "length" in key


# Section title -> which keys of metrics.jsonl it draws, one plot per key.
SECTIONS: dict[str, Callable[[str], bool]] = {
    "Reward of the training batches (each reward function)": _reward_curve,
    "Held-out evaluation (step 0: before training)": lambda k: k.startswith("eval/") and k != "eval/skipped",
    "Training loss, gradient norm, learning rate": lambda k: k in ("loss", "grad_norm", "lr"),
    "KL, entropy, clipping, completion length": _policy_curve,
}
TIME_TITLE, TIME_KEYS = "Step time", ("rollout_time", "step_time")  # one plot: the split


def curve_keys(records: list[dict]) -> dict[str, list[str]]:
    """Section title -> the keys drawn in it (those with at least one finite number), in order of
    first appearance; :data:`TIME_TITLE` -> the time keys present. Sections without keys are left out."""
    seen: dict[str, None] = {}
    for rec in records:
        for k, v in rec.items():
            if k not in ("step", "time") and number(v) is not None:
                seen.setdefault(k)
    out = {title: [k for k in seen if wanted(k)] for title, wanted in SECTIONS.items()}
    out[TIME_TITLE] = [k for k in TIME_KEYS if k in seen]
    return {title: keys for title, keys in out.items() if keys}


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key``; of a step logged twice the last value (a re-run step replaces it)."""
    by_step: dict[int, float] = {}
    for rec in records:
        v, s = number(rec.get(key)), number(rec.get("step"))
        if v is not None and s is not None:
            by_step[int(s)] = v
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


# -- the SVG, written by hand: a page of curves in milliseconds (matplotlib took ~0.1 s a plot) -------

W, H, LEFT, RIGHT, TOP, BOTTOM = 290, 200, 52, 280, 24, 168  # the image and its plot area, in pixels
BLUE, ORANGE, RED = "#1f77b4", "#ff7f0e", "#d62728"  # matplotlib's C0, C1 and C3


def _label(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e6 else f"{v:.3g}"


class _Axes:
    """Pixel positions of steps ``xs`` and values ``ys`` in the plot area, with a tick (and its
    number) at the first and last step and at the lowest and highest value; ``also`` (interval
    ends) only widens the range."""

    def __init__(self, xs: list[float], ys: list[float], also: list[float] = ()):
        self.x0, self.x1, self.y0, self.y1 = min(xs), max(xs), min(ys), max(ys)
        lo, hi = min([self.y0, *also]), max([self.y1, *also])
        pad = (hi - lo) * 0.06 or max(abs(lo) * 0.1, 0.5)  # a flat line sits mid-height
        self.lo, self.hi = lo - pad, hi + pad

    def x(self, step: float) -> float:
        span, inset = self.x1 - self.x0, 8  # the first and last point off the frame
        return (LEFT + RIGHT) / 2 if not span else LEFT + inset + (step - self.x0) / span * (RIGHT - LEFT - 2 * inset)

    def y(self, value: float) -> float:
        return BOTTOM - (value - self.lo) / (self.hi - self.lo) * (BOTTOM - TOP)

    def frame(self) -> list[str]:
        out = [f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="none" '
               'stroke="#555"/>']
        for v in sorted({self.y0, self.y1}):
            y = self.y(v)
            out += [f'<line x1="{LEFT}" x2="{RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ccc" stroke-dasharray="2 2"/>',
                    f'<text x="{LEFT - 4}" y="{y + 3.5:.1f}" text-anchor="end">{_label(v)}</text>']
        for s in sorted({self.x0, self.x1}):
            x = self.x(s)
            out += [f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{BOTTOM}" y2="{BOTTOM + 4}" stroke="#555"/>',
                    f'<text x="{x:.1f}" y="{BOTTOM + 14}" text-anchor="middle">{_label(s)}</text>']
        return out + [f'<text x="{(LEFT + RIGHT) / 2}" y="{H - 6}" text-anchor="middle">step</text>']


def _points(ax: _Axes, steps: list[int], values: list[float]) -> list[tuple[float, float]]:
    """The line's points in pixels; a long run keeps each pixel column's lowest and highest value
    (in step order), which draws the same line."""
    pts = [(ax.x(s), ax.y(v)) for s, v in zip(steps, values)]
    if len(pts) <= 4 * (RIGHT - LEFT):
        return pts
    columns: dict[int, list[tuple[float, float]]] = {}
    for p in pts:
        columns.setdefault(int(p[0]), []).append(p)
    out: list[tuple[float, float]] = []
    for col in columns.values():
        lo, hi = max(col, key=lambda p: p[1]), min(col, key=lambda p: p[1])
        out += sorted({lo, hi}, key=col.index)
    return out


def _path(pts: list[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)


def _line(pts: list[tuple[float, float]], color: str, markers: bool) -> list[str]:
    out = [f'<polyline points="{_path(pts)}" fill="none" stroke="{color}" stroke-width="1.5"/>'] if len(pts) > 1 else []
    return out + [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>' for x, y in pts] if markers else out


def _legend(entries: list[tuple[str, str]]) -> list[str]:
    width = 24 + 5.5 * max(len(name) for name, _ in entries)  # on a pale box: readable over the data
    return [f'<rect x="{LEFT + 3}" y="{TOP + 3}" width="{width:.0f}" height="{13 * len(entries) + 3}" fill="#fff" '
            'fill-opacity="0.85"/>'] + [
            f'<rect x="{LEFT + 6}" y="{TOP + 6 + 13 * i}" width="10" height="8" fill="{color}"/>'
            f'<text x="{LEFT + 20}" y="{TOP + 13.5 + 13 * i}">{html.escape(name)}</text>'
            for i, (name, color) in enumerate(entries)]


def _svg(title: str, body: list[str]) -> str:
    """The plot as a data URI of a small SVG: a title, then ``body`` (the frame, lines, marks)."""
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="DejaVu Sans, sans-serif" font-size="9" fill="#222">'
           f'<rect width="{W}" height="{H}" fill="#fff"/><text x="{W / 2}" y="15" text-anchor="middle" '
           f'font-size="11">{html.escape(title)}</text>{"".join(body)}</svg>')
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _figure(keys: list[str], title: str, uri: str) -> str:
    return (f'<figure class="plot" data-keys="{html.escape(" ".join(keys))}">'
            f'<img src="{uri}" alt="{html.escape(title)}"></figure>')


def _interval(intervals: dict, when: str, metric: Optional[str]) -> Optional[tuple[float, float]]:
    low_high = (intervals.get(when) or {}).get(metric) if metric else None
    if isinstance(low_high, (list, tuple)) and len(low_high) == 2 and None not in map(number, low_high):
        return float(low_high[0]), float(low_high[1])
    return None


def _plot_key(records: list[dict], key: str, intervals: dict) -> str:
    """One key's line; for a held-out metric, its before/after intervals as bars at step 0 and the last step."""
    steps, values = _series(records, key)
    metric = key[len("eval/"):] if key.startswith("eval/") else None
    bars = [(step, iv) for when, step in (("before", 0), ("after", steps[-1]))
            if step in steps and (iv := _interval(intervals, when, metric))]
    ax = _Axes(steps, values, [v for _, iv in bars for v in iv])
    body = ax.frame() + _line(_points(ax, steps, values), BLUE, bool(metric) or len(steps) < 30)
    for step, (low, high) in bars:
        x, y_low, y_high = ax.x(step), ax.y(low), ax.y(high)
        body.append(f'<path d="M{x:.1f},{y_low:.1f}V{y_high:.1f}M{x - 3:.1f},{y_low:.1f}h6M{x - 3:.1f},{y_high:.1f}h6" '
                    f'stroke="{RED}" stroke-width="1.2" fill="none"/>')
    return _figure([key], key, _svg(key, body))


def _area(ax: _Axes, steps: list[int], lower: list[float], upper: list[float], color: str) -> str:
    xs = [ax.x(s) for s in steps]
    if len(xs) == 1:  # one step: a bar
        xs, lower, upper = [xs[0] - 6, xs[0] + 6], lower * 2, upper * 2
    top = [(x, ax.y(v)) for x, v in zip(xs, upper)]
    bottom = [(x, ax.y(v)) for x, v in zip(xs, lower)][::-1]
    return f'<polygon points="{_path(top + bottom)}" fill="{color}" fill-opacity="0.8"/>'


def _plot_time(records: list[dict], keys: list[str]) -> str:
    """The step time split into rollout and update, stacked; each time key as a line when the two
    were not logged at the same steps."""
    steps, total = _series(records, "step_time")
    r_steps, rollout = _series(records, "rollout_time")
    title = "step time: rollout + update"
    if steps and r_steps == steps:
        top = [max(t, r) for t, r in zip(total, rollout)]
        ax = _Axes(steps, [0.0, *top])
        body = ax.frame() + [_area(ax, steps, [0.0] * len(steps), rollout, BLUE),
                             _area(ax, steps, rollout, top, ORANGE)]
        body += _legend([("rollout", BLUE), ("update", ORANGE)])
    else:
        series = {key: _series(records, key) for key in keys}
        ax = _Axes([s for st, _ in series.values() for s in st], [v for _, vs in series.values() for v in vs])
        colors = dict(zip(keys, (BLUE, ORANGE)))
        body = ax.frame() + [el for key, (st, vs) in series.items() for el in _line(_points(ax, st, vs), colors[key],
                                                                                  len(st) < 30)]
        body += _legend([(key, colors[key]) for key in keys])
    body.append(f'<text transform="translate(12 {(TOP + BOTTOM) / 2}) rotate(-90)" text-anchor="middle">seconds</text>')
    return _figure(keys, "step time split into rollout and update", _svg(title, body))


def curves_html(records: list[dict], intervals: dict) -> str:
    """The curves part of the page: a heading and a row of plots per section of :func:`curve_keys`."""
    sections = curve_keys(records)
    if not sections:
        return "<p>No metrics logged yet (metrics.jsonl is missing or empty).</p>"
    parts = []
    for title, keys in sections.items():
        figs = [_plot_time(records, keys)] if title == TIME_TITLE else [_plot_key(records, k, intervals) for k in keys]
        parts.append(f"<h3>{html.escape(title)}</h3><div class=\"plots\">{''.join(figs)}</div>")
    return "\n".join(parts)
