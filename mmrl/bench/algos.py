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
figure is the mean ± the sample standard deviation over seeds. Below it, the task metric's
interquartile mean and mean over seeds with 95% stratified-bootstrap intervals, and its performance
profiles, as 'Deep Reinforcement Learning at the Edge of the Statistical Precipice' (Agarwal et al.,
NeurIPS 2021) recommends, from its library rliable (:mod:`mmrl.bench.algo_stats`).
``run_algo_bench`` writes, under ``out_dir``: one run directory per variant (per variant and seed,
``<variant>-seed<s>``, with several), ``algos.json`` (everything in the tables, each seed's figures,
the train-reward curves, each variant's ``aggregates`` with their intervals, the profiles),
``algos.md`` (the tables), ``algos.png`` (train reward, moving average, vs step) and
``algos_profiles.png`` (the performance profiles).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from .algo_figures import MA_WINDOW, moving_average, over_seeds, read_train_metrics, run_figures, steps_to_threshold
from .algo_report import caveats, markdown_table, write_report
from .algo_variants import (
    BASE_OVERRIDES,
    DEFAULT_VARIANTS,
    DESCRIPTIONS,
    VARIANTS,
    UnknownVariantError,
    check_variants,
    variant_overrides,
)

__all__ = [  # the bench's API, from the modules of its concerns
    "BASE_OVERRIDES",
    "DESCRIPTIONS",
    "VARIANTS",
    "DEFAULT_VARIANTS",
    "MA_WINDOW",
    "UnknownVariantError",
    "check_variants",
    "variant_overrides",
    "moving_average",
    "steps_to_threshold",
    "read_train_metrics",
    "run_algo_bench",
    "markdown_table",
    "write_report",
]

def clear_run_dir(run_dir: Path) -> None:
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
        clear_run_dir(out_dir / run_name)
        t0 = time.perf_counter()
        res = mmrl.train(config, overrides)
        runs[name].append(run_figures(name, s, res, steps, time.perf_counter() - t0, metric))
    results = [over_seeds(name, runs[name], variant_overrides(name, base_cfg, table, base)) for name in names]

    write_report(results, out_dir, config=str(config), steps=steps, seed=seeds[0] if len(seeds) == 1 else seeds,
                 extra_overrides=extra, threshold=threshold, notes=caveats(results, base_cfg), console=console,
                 base_overrides=BASE_OVERRIDES if base is None else base, report_name=report_name)
    return results
