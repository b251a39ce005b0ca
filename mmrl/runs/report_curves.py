"""The curves of a run's ``metrics.jsonl`` for its report page: one small plot per logged quantity.

Which keys are drawn, grouped as the page shows them: the training reward and each reward
function's (``reward``, ``reward/<fn>``), every held-out metric (``eval/<metric>``, step 0 being the
evaluation before training, with the before/after confidence intervals of ``summary.json`` drawn
on it), the policy's KL, entropy, clip fractions and completion length, and one plot of the step
time split into rollout (``rollout_time``) and update (``step_time`` minus it). A key that the run
did not log, or logged without a finite value, gets no plot. Each plot is an SVG drawn with
matplotlib (without pyplot, so the user's backend is left alone) and put in the page as a data
URI: the page needs nothing beside it.
"""

from __future__ import annotations

import base64
import html
import io
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


def _svg(draw: Callable[[Any], None]) -> str:
    """A small figure drawn by ``draw(axes)``, as a data URI of its SVG (text kept as text)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with rc_context({"svg.fonttype": "none", "font.size": 7, "svg.hashsalt": "mmrl"}):
        fig = Figure(figsize=(2.9, 2.0), dpi=100)
        fig.subplots_adjust(left=0.2, right=0.96, bottom=0.19, top=0.89)  # fixed: a layout engine costs 2x
        ax = fig.add_subplot()
        draw(ax)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(keys: list[str], title: str, uri: str) -> str:
    return (f'<figure class="plot" data-keys="{html.escape(" ".join(keys))}">'
            f'<img src="{uri}" alt="{html.escape(title)}"></figure>')


def _plot_key(records: list[dict], key: str, intervals: dict) -> str:
    steps, values = _series(records, key)
    metric = key[len("eval/"):] if key.startswith("eval/") else None

    def draw(ax) -> None:
        ax.plot(steps, values, marker="o" if metric or len(steps) < 30 else None, markersize=3)
        for when, step in (("before", 0), ("after", steps[-1])):
            low_high = (intervals.get(when) or {}).get(metric) if metric else None
            if isinstance(low_high, list) and len(low_high) == 2 and None not in map(number, low_high) \
                    and step in steps:
                v = values[steps.index(step)]
                ax.errorbar([step], [v], yerr=[[max(v - low_high[0], 0)], [max(low_high[1] - v, 0)]],
                            color="C3", capsize=3)
        ax.set_title(key, fontsize=8)

    return _figure([key], key, _svg(draw))


def _plot_time(records: list[dict], keys: list[str]) -> str:
    steps, total = _series(records, "step_time")
    r_steps, rollout = _series(records, "rollout_time")

    def draw(ax) -> None:
        if steps and r_steps == steps:
            update = [max(t - r, 0.0) for t, r in zip(total, rollout)]
            ax.stackplot(steps, rollout, update, labels=["rollout", "update"], alpha=0.8)
        else:
            for key in keys:
                ax.plot(*_series(records, key), label=key)
        ax.legend(loc="upper left", fontsize=6)
        ax.set_ylabel("seconds")
        ax.set_title("step time: rollout + update", fontsize=8)

    return _figure(keys, "step time split into rollout and update", _svg(draw))


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
