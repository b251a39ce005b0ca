"""How ``mmrl bench algos`` shows its results: the table (terminal and Markdown), the train-reward
plot, the JSON of every figure, and the caveats a reader of the table needs; below the table, the
IQM and mean over seeds with 95% bootstrap intervals, and the performance profiles
(``<report_name>_profiles.png``), from :mod:`mmrl.bench.algo_stats`.

:func:`write_report` also fills in the steps-to-threshold column, since the threshold (unless
given) is set from all variants' results: halfway from the reward before training to the best
variant's reward after.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from . import algo_stats
from .algo_figures import FINAL_WINDOW, MA_WINDOW, mean_or_nan, steps_to_threshold
from .algo_variants import BASE_OVERRIDES
from .rliable_import import RliableMissingError

def _columns(results: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    metric = results[0].get("metric") or "task metric" if results else "task metric"
    k = results[0].get("pass_k") if results else None
    return ("variant", f"{metric} before", f"{metric} after", "pass@1 after", f"pass@{k or 'k'} after",
            "reward before -> after", "final train reward", "steps to threshold", "s/step")


def _spread(mean: float | None, sd: float | None) -> str:
    """``0.375`` for one seed, ``0.375 ± 0.012`` (sample standard deviation) for several."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    return f"{mean:.3f}" if sd is None else f"{mean:.3f} ± {sd:.3f}"


def _cells(r: dict[str, Any]) -> list[str]:
    stt = r["steps_to_threshold"]
    sd = r.get("sd", {})
    reward_before = f"{r['before']:.3f}" if r["before"] is not None else "-"
    return [
        r["variant"],
        _spread(r.get("metric_before"), sd.get("metric_before")),
        _spread(r.get("metric_after"), sd.get("metric_after")),
        _spread(r.get("pass1_after"), sd.get("pass1_after")),
        _spread(r.get("passk_after"), sd.get("passk_after")),
        f"{reward_before} -> {_spread(r['after'], sd.get('after'))}",
        _spread(r["final_train_reward"], sd.get("final_train_reward")),
        str(stt) if stt is not None else f"not in {r['steps']}",
        f"{r['time_per_step_s']:.2f}",
    ]


def markdown_rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table of string cells (every bench's .md report)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    return markdown_rows(_columns(results), [_cells(r) for r in results])


def _rich_table(results: Sequence[dict[str, Any]], threshold: float, title: str):
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(_columns(results)):
        table.add_column(col, justify="left" if i == 0 else "right")
    for r in results:
        table.add_row(*_cells(r))
    table.caption = (f"before/after: held-out task metric (greedy), pass@1 / pass@k from k samples per example "
                     f"(eval.pass_k), held-out reward; with several seeds: mean ± sample sd over seeds; "
                     f"final train reward: mean of the last {FINAL_WINDOW} steps; "
                     f"steps to threshold: first step the {MA_WINDOW}-step moving average of the train "
                     f"reward reaches {threshold:.3f}; wall time: sum of step times (evals excluded)")
    return table


def _plot(results: Sequence[dict[str, Any]], threshold: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    styles = ("-", "--", "-.", ":")  # identical curves (e.g. grpo and gspo on-policy) stay visible
    for i, r in enumerate(results):
        ax.plot(r["curve"]["step"], r["curve"]["reward_ma"], label=r["variant"], linewidth=1.6,
                linestyle=styles[i % len(styles)])
    ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel(f"train reward ({MA_WINDOW}-step moving average)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)


def _aggregates_and_profiles(results: list[dict[str, Any]], path: Path,
                             title: str) -> tuple[dict[str, Any] | None, list[str]]:
    """IQM / mean / median / optimality gap with bootstrap intervals (each variant's ``aggregates``)
    and the performance-profile PNG; without rliable, None and a note saying how to install it."""
    try:
        stats = algo_stats.aggregate_over_seeds(results)
        profile = algo_stats.performance_profiles(stats)
    except RliableMissingError as exc:
        return None, [str(exc)]
    for r in results:
        r["aggregates"] = stats["variants"][r["variant"]]
    algo_stats.plot_profiles(profile, stats["score"], path, f"performance profiles: {title}")
    return {**stats, "profiles_png": path.name, "profiles": profile}, algo_stats.stats_notes(stats)


def _stats_rich_table(stats: dict[str, Any], notes: Sequence[str]):
    from rich.markup import escape
    from rich.table import Table

    header, rows = algo_stats.table_rows(stats)
    table = Table(title=f"{stats['score']} over seeds: IQM and mean, {stats['confidence']:.0%} stratified-bootstrap "
                        f"intervals (rliable, {stats['reps']} resamples, seed {stats['bootstrap_seed']})")
    for i, col in enumerate(header):
        table.add_column(escape(col), justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*map(escape, row))  # "[0.5, 0.7]" is not markup
    table.caption = escape("; ".join(notes)) or None
    return table


def write_report(
    results: list[dict[str, Any]],
    out_dir: Path,
    *,
    config: str,
    steps: int,
    seed: int | Sequence[int],
    extra_overrides: Sequence[str] = (),
    threshold: float | None = None,
    notes: Sequence[str] = (),
    console: Any = None,
    base_overrides: Sequence[str] = BASE_OVERRIDES,
    report_name: str = "algos",
) -> None:
    """Fill in the threshold columns, print the tables, write <report_name>.json / .md / .png and
    <report_name>_profiles.png."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    out_dir = Path(out_dir)
    extra = list(extra_overrides)
    notes = list(notes)
    befores = [r["before"] for r in results if r["before"] is not None]
    if threshold is None:
        start = mean_or_nan(befores) if befores else min(r["curve"]["reward"][0] for r in results)
        best = max(r["after"] for r in results)
        threshold = start + 0.5 * (best - start)
        threshold_source = "before + 0.5 x (best after - before)"
    else:
        threshold_source = "given"
    for r in results:
        r["threshold"] = threshold
        r["steps_to_threshold"] = steps_to_threshold(r["curve"]["step"], r["curve"]["reward_ma"], threshold)

    seeds_text = f"seed {seed}" if isinstance(seed, int) else f"seeds {', '.join(map(str, seed))}"
    seed_text = seeds_text if isinstance(seed, int) else f"{seeds_text} (mean ± sd)"
    title = f"{config}: {steps} steps, {seed_text}"
    profiles_path = out_dir / f"{report_name}_profiles.png"
    stats, stats_notes = _aggregates_and_profiles(results, profiles_path, f"{config}: {steps} steps, {seeds_text}")
    summary = {
        "config": str(config), "steps": steps, "seed": seed, "extra_overrides": extra,
        "base_overrides": list(base_overrides), "threshold": threshold, "threshold_source": threshold_source,
        "ma_window": MA_WINDOW, "final_window": FINAL_WINDOW, "notes": notes + stats_notes,
        "aggregates": stats and {k: v for k, v in stats.items() if k != "variants"},  # per variant: in each row
        "variants": results,
    }
    (out_dir / f"{report_name}.json").write_text(json.dumps(summary, indent=2, default=_json_default))
    md = (f"`{config}`, {steps} steps, {seed_text}"
          + (f", overrides `{' '.join(extra)}`" if extra else "")
          + f"; threshold {threshold:.3f} ({threshold_source}) on the {MA_WINDOW}-step moving average"
          + " of the train reward\n\n" + markdown_table(results)
          + "".join(f"\n- {n}" for n in notes) + ("\n" if notes else "")
          + (f"\n{markdown_rows(*algo_stats.table_rows(stats))}" if stats else "")
          + "".join(f"\n- {n}" for n in stats_notes) + ("\n" if stats_notes else ""))
    (out_dir / f"{report_name}.md").write_text(md)
    _plot(results, threshold, out_dir / f"{report_name}.png", title)
    console.print(_rich_table(results, threshold, title))
    for n in notes if stats else notes + stats_notes:
        console.print(f"note: {escape(n)}", highlight=False)
    if stats:
        console.print(_stats_rich_table(stats, stats_notes))
    console.print(f"wrote {out_dir / (report_name + '.json')}, {out_dir / (report_name + '.md')}, "
                  f"{out_dir / (report_name + '.png')}" + (f", {profiles_path}" if stats else ""))


def caveats(results: Sequence[dict[str, Any]], base_cfg: Any) -> list[str]:
    """Caveats a reader of the table needs: on-policy updates, variants that ran identically."""
    notes = []
    samples = int(base_cfg.train.prompts_per_step) * int(base_cfg.rollout.num_generations)
    mini = int(base_cfg.train.mini_batch_size) or samples
    if int(base_cfg.algo.num_iterations) == 1 and mini >= samples:
        notes.append("one optimizer step per rollout batch (algo.num_iterations=1, no mini-batches): every update "
                     "is on-policy (ratio = 1), so clip ranges (epsilon, epsilon_high) have no effect and GSPO's "
                     "sequence ratio has the gradient of GRPO's per-sequence token mean; use "
                     "train.mini_batch_size or algo.num_iterations to make them matter")
    seen: dict[tuple, str] = {}
    for r in results:
        key = tuple(r["curve"]["reward"])
        if key in seen:
            notes.append(f"{r['variant']} ran identically to {seen[key]} (the same train reward at every step)")
        else:
            seen[key] = r["variant"]
    return notes


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, Path):
        return str(o)
    return str(o)
