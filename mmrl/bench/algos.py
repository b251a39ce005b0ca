"""``mmrl bench algos``: several RL algorithm variants on the same task, model and seed, compared.

Every variant is GRPO plus the changes its name stands for; all of them start from the same recipe
(``vlm/counting_tiny`` by default), the same seed and the same extra overrides, and train the same
number of steps, so the table differs only where the algorithms differ:

======================  ==========================================================================
variant                 on top of the common base (symmetric clip, ``seq_mean_token_mean``)
======================  ==========================================================================
``grpo``                nothing: group mean/std advantage, PPO clip [1-eps, 1+eps], per-sequence
                        token mean (the GRPO paper's objective)
``dr_grpo``             no std division; ``seq_mean_token_sum_norm`` (Dr. GRPO)
``dapo``                clip-higher (``epsilon_high=0.28``), ``token_mean``, truncated completions
                        left out of the loss (DAPO without dynamic sampling)
``gspo``                sequence-level ratio (``loss_type=gspo``), clip 3e-4 / 4e-4
``spo``                 SPO's per-prompt value tracker, one sample per prompt; the number of
                        prompts per step grows so the samples per step stay the same
``ngrpo``               NGRPO's virtual max-reward sample in the group statistics
``rloo``                leave-one-out baseline
``reinforce_pp``        REINFORCE++ (batch-normalised advantage)
======================  ==========================================================================

The base overrides and a variant's overrides go on top of the recipe and the user's extra
overrides (a variant is defined by its algorithm settings, so those win), then the bench's own
run settings (steps, seed, output directory). The table leads with the task's own metric
(``Task.success_metric``: counting accuracy, grounding IoU >= 0.5, ...) and pass@1 / pass@k
(``eval.pass_k``), since a format reward alone can raise the total reward; with several seeds each
figure is the mean ± the sample standard deviation over seeds. ``run_algo_bench`` writes, under
``out_dir``: one run directory per variant (per variant and seed, ``<variant>-seed<s>``, with
several), ``algos.json`` (everything in the table, each seed's figures, the train-reward curves),
``algos.md`` (the table) and ``algos.png`` (train reward, moving average, vs step).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = [
    "BASE_OVERRIDES",
    "DESCRIPTIONS",
    "VARIANTS",
    "DEFAULT_VARIANTS",
    "MA_WINDOW",
    "UnknownVariantError",
    "variant_overrides",
    "moving_average",
    "steps_to_threshold",
    "read_train_metrics",
    "run_algo_bench",
    "markdown_table",
    "write_report",
]

# Applied to every variant first: GRPO's group mean/std advantage (the tiny recipe uses Dr. GRPO's),
# symmetric clipping (epsilon_high = epsilon; the tiny recipe sets DAPO's 0.28) and GRPO's
# per-sequence token mean, so that e.g. `grpo` and `dapo` differ as named.
BASE_OVERRIDES: tuple[str, ...] = ("algo.advantage=grpo", "algo.epsilon_high=null",
                                   "algo.loss_agg_mode=seq_mean_token_mean")

# ``{samples_per_step}`` is replaced by prompts_per_step x num_generations of the base config.
VARIANTS: dict[str, tuple[str, ...]] = {
    "grpo": (),
    "dr_grpo": ("algo.advantage=dr_grpo", "algo.loss_agg_mode=seq_mean_token_sum_norm"),
    "dapo": ("algo.epsilon_high=0.28", "algo.loss_agg_mode=token_mean", "algo.overlong_filter=true"),
    "gspo": ("algo.loss_type=gspo", "algo.epsilon=3e-4", "algo.epsilon_high=4e-4",
             "algo.loss_agg_mode=seq_mean_token_mean"),
    "spo": ("algo.advantage=spo", "rollout.num_generations=1", "train.prompts_per_step={samples_per_step}"),
    "ngrpo": ("algo.advantage=ngrpo",),
    "rloo": ("algo.advantage=rloo",),
    "reinforce_pp": ("algo.advantage=reinforce_pp",),
    "dapo_dynamic": ("algo.epsilon_high=0.28", "algo.loss_agg_mode=token_mean", "algo.overlong_filter=true",
                     "algo.selection=dynamic_sampling", "algo.max_num_gen_batches=3"),
    "variance_sampling": ("data.sampler=variance",),
    "scaf_grpo": ("algo.scaffold=true",),
    "tempsamp": ("algo.off_policy_guidance=1",),
}

DESCRIPTIONS: dict[str, str] = {
    "grpo": "group mean/std advantage, symmetric clip, per-sequence token mean",
    "dr_grpo": "no std division, seq_mean_token_sum_norm",
    "dapo": "clip-higher 0.28, token_mean, overlong filter",
    "gspo": "sequence-level ratio, clip 3e-4/4e-4",
    "spo": "per-prompt value tracker, 1 sample/prompt, same samples per step",
    "ngrpo": "virtual max-reward sample in the group stats",
    "rloo": "leave-one-out baseline",
    "reinforce_pp": "REINFORCE++ batch-normalised advantage",
    "dapo_dynamic": "dapo + dynamic sampling (zero-variance groups dropped, <= 3 generation rounds)",
    "variance_sampling": "MMR1 variance-aware prompt sampling (half of each batch by VPS)",
    "scaf_grpo": "Scaf-GRPO tiered hints for groups with no solved sample",
    "tempsamp": "TempSamp-R1: 1 reference completion per group, LUFFY-shaped off-policy weight",
}

DEFAULT_VARIANTS: tuple[str, ...] = ("grpo", "dr_grpo", "dapo", "gspo", "spo", "ngrpo")
MA_WINDOW = 5  # moving-average window (steps) for the curves and steps-to-threshold
FINAL_WINDOW = 5  # "final train reward" = mean of the last this many steps


class UnknownVariantError(ValueError):
    """A variant name that is not in :data:`VARIANTS`."""


def check_variants(variants: Sequence[str], table: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The variant names, checked against ``table`` (default: :data:`VARIANTS`)."""
    table = VARIANTS if table is None else table
    names = [v.strip() for v in variants if v.strip()]
    if not names:
        raise UnknownVariantError(f"no variants given (valid: {', '.join(table)})")
    bad = [v for v in names if v not in table]
    if bad:
        raise UnknownVariantError(
            f"unknown variant{'s' if len(bad) > 1 else ''} {', '.join(repr(b) for b in bad)} "
            f"(valid: {', '.join(table)})")
    dup = sorted({v for v in names if names.count(v) > 1})
    if dup:
        raise UnknownVariantError(f"variant listed twice: {', '.join(dup)}")
    return names


def variant_overrides(name: str, base_cfg: Any = None, table: dict[str, tuple[str, ...]] | None = None,
                      base: Sequence[str] | None = None) -> list[str]:
    """``base`` (default BASE_OVERRIDES) + the variant's overrides from ``table`` (default
    VARIANTS), with ``{samples_per_step}`` filled in from ``base_cfg`` (the recipe with the user's
    extra overrides)."""
    table = VARIANTS if table is None else table
    base = BASE_OVERRIDES if base is None else tuple(base)
    check_variants([name], table)
    samples = None
    if base_cfg is not None:
        samples = int(base_cfg.train.prompts_per_step) * int(base_cfg.rollout.num_generations)
    out: dict[str, str] = {}  # by key: a variant's setting replaces the base's
    for o in (*base, *table[name]):
        if "{samples_per_step}" in o:
            if samples is None:
                raise ValueError(f"variant {name!r} needs the base config to size its batch")
            o = o.replace("{samples_per_step}", str(samples))
        key = o.split("=", 1)[0]
        out.pop(key, None)
        out[key] = o
    return list(out.values())


# -- metrics -------------------------------------------------------------------------------------


def read_train_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-step training rows of a metrics.jsonl (rows with ``reward``), one per step (the last
    line wins if a step was logged twice), sorted by step."""
    rows: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "reward" in rec and "step" in rec:
                rows[int(rec["step"])] = rec
    return [rows[s] for s in sorted(rows)]


def moving_average(values: Sequence[float], window: int = MA_WINDOW) -> list[float]:
    """Trailing moving average; the first ``window - 1`` points average what there is so far."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def steps_to_threshold(steps: Sequence[int], smoothed: Sequence[float], threshold: float) -> Optional[int]:
    """The first step whose smoothed reward reaches ``threshold`` (None if it never does)."""
    for s, v in zip(steps, smoothed):
        if v >= threshold - 1e-12:
            return int(s)
    return None


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


# -- output ---------------------------------------------------------------------------------------

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


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    columns = _columns(results)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in results]
    return "\n".join(lines) + "\n"


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


# -- the bench ------------------------------------------------------------------------------------


def _clear_run_dir(run_dir: Path) -> None:
    """A rerun of the bench replaces the variant's previous run (metrics.jsonl is appended to)."""
    if not run_dir.exists():
        return
    if run_dir.is_dir() and (not any(run_dir.iterdir()) or (run_dir / "metrics.jsonl").exists()
                             or (run_dir / "config.yaml").exists()):
        shutil.rmtree(run_dir)
        return
    raise FileExistsError(f"{run_dir} exists and is not a run directory; choose another output directory")


def run_algo_bench(
    variants: Sequence[str],
    steps: int,
    seed: int | Sequence[int],
    out_dir: Path,
    config: str = "vlm/counting_tiny",
    extra_overrides: Sequence[str] = (),
    threshold: float | None = None,
    console: Any = None,
    table: dict[str, tuple[str, ...]] | None = None,
    base: Sequence[str] | None = None,
    report_name: str = "algos",
) -> list[dict[str, Any]]:
    """Train each variant for ``steps`` steps with each seed of ``seed`` (one int or several) and
    compare them (see the module doc).

    Returns one dict per variant, averaged over the seeds: ``variant``, ``overrides``, ``seeds``,
    ``metric`` (the task's success metric, e.g. ``accuracy``) with ``metric_before`` /
    ``metric_after``, ``pass1_after`` / ``passk_after`` and ``pass_k`` (with ``eval.pass_k``),
    ``before``/``after``/``delta`` (held-out reward), ``final_train_reward``,
    ``steps_to_threshold``, ``threshold``, ``steps``, ``wall_time_s`` (sum of step times),
    ``time_per_step_s`` (mean; ``median_step_time_s`` is robust to a busy machine),
    ``total_time_s`` (evals and model loading included), ``curve`` (step, reward, reward_ma: the
    seeds' mean), ``sd`` (sample standard deviations over seeds, with several) and ``runs`` (each
    seed's own figures, ``run_dir`` and ``eval_before``/``eval_after`` with all held-out metrics).
    Raises :class:`UnknownVariantError` for a name not in :data:`VARIANTS` and
    ``mmrl.config.ConfigError`` for a bad override, both before anything trains.
    """
    from rich.console import Console

    import mmrl
    from mmrl.config import builtin_config_path, load_config
    from mmrl.core.trainer import build_task

    names = check_variants(variants, table)
    seeds = [int(seed)] if isinstance(seed, int) else [int(x) for x in seed]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    if steps < 1:
        raise ValueError("steps must be >= 1")
    out_dir = Path(out_dir)
    console = console or Console()
    extra = list(extra_overrides)
    base_cfg = load_config(builtin_config_path(config), extra)
    metric = build_task(base_cfg).success_metric
    plans = []
    for name in names:
        for s in seeds:
            run_name = name if len(seeds) == 1 else f"{name}-seed{s}"
            overrides = [*extra, *variant_overrides(name, base_cfg, table, base), f"train.steps={steps}",
                         f"train.seed={s}", f"log.output_dir={out_dir}", f"log.run_name={run_name}",
                         "log.progress=false", "log.save_every=0", "resume=false"]
            load_config(builtin_config_path(config), overrides)  # every config error before any training
            plans.append((name, s, run_name, overrides))

    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i, (name, s, run_name, overrides) in enumerate(plans, 1):
        console.print(f"[bold][{i}/{len(plans)}] {run_name}[/]: "
                      f"{' '.join(variant_overrides(name, base_cfg, table, base)) or '(base)'}", highlight=False)
        _clear_run_dir(out_dir / run_name)
        t0 = time.perf_counter()
        res = mmrl.train(config, overrides)
        runs[name].append(_run_figures(name, s, res, steps, time.perf_counter() - t0, metric))
    results = [_over_seeds(name, runs[name], variant_overrides(name, base_cfg, table, base)) for name in names]

    write_report(results, out_dir, config=str(config), steps=steps, seed=seeds[0] if len(seeds) == 1 else seeds,
                 extra_overrides=extra, threshold=threshold, notes=_notes(results, base_cfg), console=console,
                 base_overrides=BASE_OVERRIDES if base is None else base, report_name=report_name)
    return results


def _run_figures(name: str, seed: int, res: Any, steps: int, total: float, metric: str | None) -> dict[str, Any]:
    """One run's figures: held-out task metric, pass@k, reward, train curve and times."""
    rows = read_train_metrics(Path(res.run_dir) / "metrics.jsonl")
    if len(rows) != steps:
        raise RuntimeError(f"{name}: expected {steps} logged steps in {res.run_dir}/metrics.jsonl, got {len(rows)}")
    rewards = [float(r["reward"]) for r in rows]
    step_times = [float(r.get("step_time", float("nan"))) for r in rows]
    before_eval, after_eval = dict(res.before or {}), dict(res.after)
    pass_keys = [k for k in after_eval if k.startswith("pass@") and k != "pass@1"]
    before = before_eval.get("reward")
    after = float(after_eval["reward"])
    return {
        "seed": seed,
        "metric": metric if metric and metric in after_eval else None,
        "metric_before": before_eval.get(metric) if metric else None,
        "metric_after": after_eval.get(metric) if metric else None,
        "pass1_after": after_eval.get("pass@1"),
        "passk_after": after_eval.get(pass_keys[0]) if pass_keys else None,
        "pass_k": int(pass_keys[0][5:]) if pass_keys else None,
        "before": before,
        "after": after,
        "final_train_reward": _mean(rewards[-FINAL_WINDOW:]),
        "steps": len(rows),
        "wall_time_s": sum(step_times),
        "time_per_step_s": _mean(step_times),
        "median_step_time_s": statistics.median(step_times),
        "total_time_s": total,
        "eval_before": before_eval,
        "eval_after": after_eval,
        "run_dir": str(res.run_dir),
        "curve": {"step": [int(r["step"]) for r in rows], "reward": rewards, "reward_ma": moving_average(rewards)},
        "reward_components_final": {
            k: _mean([float(r[k]) for r in rows[-FINAL_WINDOW:] if k in r]) for k in rows[-1] if k.startswith("reward/")
        },
    }


_AVERAGED = ("metric_before", "metric_after", "pass1_after", "passk_after", "before", "after",
             "final_train_reward", "wall_time_s", "time_per_step_s", "median_step_time_s", "total_time_s")


def _over_seeds(name: str, runs: list[dict[str, Any]], overrides: list[str]) -> dict[str, Any]:
    """A variant's row: each figure's mean over its seeds' runs (and sample sd with several)."""
    out: dict[str, Any] = {"variant": name, "overrides": overrides, "seeds": [r["seed"] for r in runs],
                           "metric": runs[0]["metric"], "pass_k": runs[0]["pass_k"], "steps": runs[0]["steps"], "runs": runs}
    sd: dict[str, float] = {}
    for key in _AVERAGED:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = _mean(values) if values else None
        if len(values) > 1:
            sd[key] = statistics.stdev(values)
    out["sd"] = sd
    out["delta"] = out["after"] - out["before"] if out["before"] is not None else None
    rewards = [sum(r["curve"]["reward"][i] for r in runs) / len(runs) for i in range(out["steps"])]
    out["curve"] = {"step": runs[0]["curve"]["step"], "reward": rewards, "reward_ma": moving_average(rewards)}
    # single-seed compatibility: the run's own directory and held-out dicts
    if len(runs) == 1:
        out.update(run_dir=runs[0]["run_dir"], eval_before=runs[0]["eval_before"], eval_after=runs[0]["eval_after"],
                   reward_components_final=runs[0]["reward_components_final"])
    return out


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
    """Fill in the threshold columns, print the table, write <report_name>.json / .md / .png."""
    from rich.console import Console

    console = console or Console()
    out_dir = Path(out_dir)
    extra = list(extra_overrides)
    notes = list(notes)
    befores = [r["before"] for r in results if r["before"] is not None]
    if threshold is None:
        start = _mean(befores) if befores else min(r["curve"]["reward"][0] for r in results)
        best = max(r["after"] for r in results)
        threshold = start + 0.5 * (best - start)
        threshold_source = "before + 0.5 x (best after - before)"
    else:
        threshold_source = "given"
    for r in results:
        r["threshold"] = threshold
        r["steps_to_threshold"] = steps_to_threshold(r["curve"]["step"], r["curve"]["reward_ma"], threshold)

    seed_text = f"seed {seed}" if isinstance(seed, int) else f"seeds {', '.join(map(str, seed))} (mean ± sd)"
    title = f"{config}: {steps} steps, {seed_text}"
    summary = {
        "config": str(config), "steps": steps, "seed": seed, "extra_overrides": extra,
        "base_overrides": list(base_overrides), "threshold": threshold, "threshold_source": threshold_source,
        "ma_window": MA_WINDOW, "final_window": FINAL_WINDOW, "notes": notes, "variants": results,
    }
    (out_dir / f"{report_name}.json").write_text(json.dumps(summary, indent=2, default=_json_default))
    md = (f"`{config}`, {steps} steps, {seed_text}"
          + (f", overrides `{' '.join(extra)}`" if extra else "")
          + f"; threshold {threshold:.3f} ({threshold_source}) on the {MA_WINDOW}-step moving average"
          + " of the train reward\n\n" + markdown_table(results)
          + "".join(f"\n- {n}" for n in notes) + ("\n" if notes else ""))
    (out_dir / f"{report_name}.md").write_text(md)
    _plot(results, threshold, out_dir / f"{report_name}.png", title)
    console.print(_rich_table(results, threshold, title))
    for n in notes:
        console.print(f"note: {n}", highlight=False)
    console.print(f"wrote {out_dir / (report_name + '.json')}, {out_dir / (report_name + '.md')}, "
                  f"{out_dir / (report_name + '.png')}")


def _notes(results: Sequence[dict[str, Any]], base_cfg: Any) -> list[str]:
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
