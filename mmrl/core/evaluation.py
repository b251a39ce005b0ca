"""Held-out evaluation: the eval split rolled out with the eval settings, scored, and shown.

With several processes each rank rolls out and scores a contiguous share of the examples; the
completions, examples and rewards are gathered, so every rank computes the metrics of the whole
split (those of one process, for deterministic decoding) and rank 0 draws the gallery."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..measures.pass_at_k import mean_pass_at_k
from ..data.sequence import split_stats, usable_item
from ..task import Task
from . import distributed as dist
from .episodes import episode_rows, is_episodic, rollout_task


@dataclass
class Evaluation:
    """One evaluation: ``metrics`` (what :func:`evaluate` returns), their confidence ``intervals``
    (``{metric: (low, high)}``, :mod:`mmrl.measures.intervals`; empty unless asked for), and the
    scored ``completions`` with their ``examples`` (one per sample, in example order), which a
    benchmark protocol (:mod:`mmrl.eval_protocols`) breaks down, and ``num_scored``: how many examples
    were scored (over all processes), what a table says it shows."""

    metrics: dict[str, float]
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    completions: list = field(default_factory=list)
    examples: list = field(default_factory=list)
    num_scored: int = 0


def evaluate(policy, task: Task, rewards, cfg, num_examples: int | None = None,
             gallery_dir: Path | None = None, grid_path: Path | None = None) -> dict[str, float]:
    """:func:`run_evaluation`'s metrics."""
    return run_evaluation(policy, task, rewards, cfg, num_examples, gallery_dir, grid_path).metrics


def run_evaluation(policy, task: Task, rewards, cfg, num_examples: int | None = None,
                   gallery_dir: Path | None = None, grid_path: Path | None = None,
                   intervals: bool = False) -> Evaluation:
    """The task's metrics on the eval split (its :attr:`~mmrl.task.Task.success_metric` first, then
    pass@1 / pass@k with ``eval.pass_k``), the mean reward and each reward component, and
    ``skipped``: the examples that proved unusable as they were read (each usable example is scored
    once: :func:`usable_share`);
    with ``gallery_dir``, also an HTML + PNG gallery of the first predictions, marked right or
    wrong by :meth:`~mmrl.task.Task.success` as pass@k judges them (an environment task's: of its
    first episodes, linked to the episode viewer);
    with ``grid_path``, a PNG contact sheet of the samples (generated images or clips, or the
    task's pictures of text answers); for an environment task also an episode viewer
    (:mod:`mmrl.runs.episode_viewer`);
    with ``intervals``, each metric's 95% bootstrap interval over the examples
    (:func:`metric_intervals`)."""
    examples, positions, skipped = usable_share(task.examples("eval"), num_examples or cfg.eval.num_examples)
    num_scored = len(examples) if dist.world_size() == 1 else sum(dist.gather(len(examples)))
    if dist.world_size() > 1:  # seeds keyed by example index: those of one process, not of the share
        examples = [{"_index": i, **ex} if isinstance(ex, dict) else ex for i, ex in zip(positions, examples)]
    if not is_episodic(task):  # an environment task's step examples are prepared as they happen
        examples = policy.prepare_examples(examples)
    batch = rollout_task(policy, task, examples, cfg.eval.num_generations, "eval")
    total, comps, reward_stats = rewards(batch.completions, batch.examples, group_ids=batch.group_ids)
    completions, scored = batch.completions, batch.examples
    if dist.world_size() > 1:
        parts = dist.gather((completions, scored, total, comps))
        completions = [c for p in parts for c in p[0]]
        scored = [e for p in parts for e in p[1]]
        total = torch.cat([p[2] for p in parts])
        comps = {k: torch.cat([p[3][k] for p in parts]) for k in comps}
        # the shares of later rounds (usable_share) come after each rank's first: back to one order
        order = sorted(range(len(scored)), key=lambda k: scored[k].get("_index", 0) if isinstance(scored[k], dict) else 0)
        completions, scored = [completions[k] for k in order], [scored[k] for k in order]
        total, comps = total[order], {k: v[order] for k, v in comps.items()}
    out = _task_metrics_first(task, task.metrics(completions, scored))
    passed, solved = _pass_at_k(policy, task, examples, cfg.eval.pass_k, seed=cfg.train.seed)
    out.update(passed)
    out["reward"] = float(total.mean())
    out.update({f"reward/{k}": float(v.mean()) for k, v in comps.items()})
    # a served reward's failed and late scores (this process's), so a dead service shows in eval too
    out.update({k: v for k, v in reward_stats.items() if k.endswith(("/failed_frac", "/late_frac"))})
    out["skipped"] = float(skipped)
    result = Evaluation(out, completions=completions, examples=scored, num_scored=num_scored)
    if intervals:
        per_row = {"reward": total.tolist(), **{f"reward/{k}": v.tolist() for k, v in comps.items()}}
        group_of = [ex["_index"] for ex in scored] if dist.world_size() > 1 else batch.group_ids.tolist()
        result.intervals = metric_intervals(task, completions, scored, group_of, out, per_row, solved, cfg.eval.pass_k,
                                            episodic=is_episodic(task))
    if not dist.is_main():
        return result
    if gallery_dir is not None or grid_path is not None:
        from ..runs.gallery import save_samples_grid, write_gallery

        viewer, episodes = None, episode_rows(scored) if is_episodic(task) else []
        if episodes:  # episodes_before/, episodes_after/ in a run; <gallery>/episodes/ for mmrl eval
            from ..runs.episode_viewer import write_episode_viewer

            where = gallery_dir / "episodes" if gallery_dir is not None else \
                grid_path.parent / grid_path.stem.replace("samples", "episodes")
            viewer = write_episode_viewer(where, task, completions, scored, episodes)
        best = sum(w for w in rewards.weights.values() if w > 0)
        if gallery_dir is not None:
            write_gallery(gallery_dir, task, completions, scored, total.tolist(), comps, best,
                          viewer="episodes/index.html" if viewer is not None else None, episodes=episodes)
        if grid_path is not None:
            save_samples_grid(grid_path, task, completions, scored, total.tolist(), best)
    return result


def metric_intervals(task: Task, completions, examples, group_of: list, metrics: dict[str, float], per_row: dict[str, list],
                     solved: list[list[bool]], k: int, episodic: bool = False) -> dict[str, tuple[float, float]]:
    """The 95% bootstrap interval of each metric, the example the unit resampled (its samples
    together). Rewards and pass@k are means over examples: their per-example values are
    bootstrapped. A task metric is too when the mean of its value on each example alone equals its
    value on all of them; otherwise (average precision, a mean over parsed answers only) it is
    computed again on each resample. ``episodic``: an example's rows are the steps (turns) of its
    episodes, unequal in number, so every metric but pass@k is computed again on each resample
    (:func:`_episode_resample`)."""
    from ..measures.intervals import per_example_means, resampled_intervals

    rows: dict[object, list[int]] = {}
    for i, g in enumerate(group_of):  # the samples of one example (``group_of[i]``) together
        rows.setdefault(g, []).append(i)
    groups = list(rows.values())
    per_example = {} if episodic else {name: [sum(v[i] for i in g) / len(g) for g in groups]
                                       for name, v in per_row.items()}
    if solved:
        from ..measures.pass_at_k import pass_at_k

        per_example["pass@1"] = [pass_at_k(len(s), sum(s), 1) for s in solved]
        per_example[f"pass@{k}"] = [pass_at_k(len(s), sum(s), k) for s in solved]
    if episodic:
        keys = [m for m in metrics if m not in per_example and m != "skipped"]
        out = per_example_means(per_example)
        out.update(resampled_intervals(lambda picked: _episode_resample(task, completions, examples, groups, per_row,
                                                                        picked), len(groups), keys))
        return {m: out[m] for m in metrics if m in out}
    task_keys = [m for m in metrics if m not in per_example and m != "skipped"]
    singles = [task.metrics([completions[i] for i in g], [examples[i] for i in g]) for g in groups]
    recomputed = []
    for m in task_keys:
        values = [float(s.get(m, float("nan"))) for s in singles]
        mean = sum(values) / max(1, len(values))
        if values and all(v == v for v in values) and abs(mean - float(metrics[m])) <= 1e-9 * max(1.0, abs(mean)):
            per_example[m] = values
        else:
            recomputed.append(m)
    out = per_example_means(per_example)
    if recomputed:
        def on(picked):
            idx = [i for g in picked for i in groups[g]]
            return task.metrics([completions[i] for i in idx], [examples[i] for i in idx])

        out.update(resampled_intervals(on, len(groups), recomputed))
    return {m: out[m] for m in metrics if m in out}


def _episode_resample(task: Task, completions, examples, groups: list[list[int]], per_row: dict[str, list],
                      picked) -> dict[str, float]:
    """An episodic task's metrics (its own, and each reward's mean over rows) on the examples at
    ``picked`` (with repeats), their rows together. A task counts an episode once by its key
    (:func:`~mmrl.core.episodes.episode_key`), so an example drawn twice has its episodes relabelled
    by the draw: it counts twice, as a bootstrap resample means."""
    idx = [(d, i) for d, g in enumerate(picked) for i in groups[g]]
    rows = [{**examples[i], "episode_id": (d, examples[i]["episode_id"])} if "episode_id" in examples[i]
            else examples[i] for d, i in idx]
    out = dict(task.metrics([completions[i] for _, i in idx], rows))
    out.update({name: sum(v[i] for _, i in idx) / len(idx) for name, v in per_row.items()})
    return out


def usable_share(examples, n: int) -> tuple[list, list[int], int]:
    """This process's share of the first ``n`` usable examples of ``examples``, each once, their
    positions among those ``n``, and how many examples were skipped on the way (all processes').

    An example that proves unusable only as it is read (an image that does not open, a box off its
    image: :class:`~mmrl.data.sequence.SkippingSequence`) is skipped, and the next index is read
    in its place; training's indexing would return that next example for it, which evaluation
    would then score twice. Indices are read in rounds: the next ``n - found`` of them, split over
    the processes, then the count found by all; so the examples scored are the first ``n`` usable
    ones, whatever the number of processes, and the count skipped is logged (``eval/skipped``)."""
    picked: list = []
    positions: list[int] = []
    found = skipped = start = 0
    while found < n and start < len(examples):
        take = min(n - found, len(examples) - start)
        lo, hi = dist.shard_bounds(take)
        mine = [ex for ex in (usable_item(examples, i) for i in range(start + lo, start + hi)) if ex is not None]
        counts = dist.gather(len(mine))
        first = found + sum(counts[:dist.rank()])
        picked += mine
        positions += range(first, first + len(mine))
        found, skipped, start = found + sum(counts), skipped + take - sum(counts), start + take
    if n and not found:
        raise ValueError(f"the eval split has no usable example: the {skipped} read were skipped "
                         f"({split_stats(examples)}; the warnings name each)")
    return picked, positions, skipped


def _task_metrics_first(task: Task, metrics: dict[str, float]) -> dict[str, float]:
    """The task's metrics with its success metric leading (reports and tables keep this order)."""
    lead = task.success_metric
    out = {lead: float(metrics[lead])} if lead in metrics else {}
    out.update({k: float(v) for k, v in metrics.items() if k != lead})
    return out


def _pass_at_k(policy, task: Task, examples, k: int, seed: int = 0) -> tuple[dict[str, float], list[list[bool]]]:
    """pass@1 and pass@k (and each example's judged samples) from ``k`` samples of each example drawn with the training rollout's
    sampling (``mode="sample"``: its temperature for a VLM; the eval sampler, with k initial noises,
    for a generator), judged by :meth:`~mmrl.task.Task.success`. Empty for ``k=0`` or a task with
    no per-example success.

    The samples are drawn from a fixed seed inside a forked random state: every evaluation uses
    the same random numbers, so before/after (or two checkpoints) differ by the model rather than
    by the draw, and turning pass@k on does not change the training's random stream."""
    if k < 0:
        raise ValueError(f"eval.pass_k={k} must be >= 0 (0 turns pass@k off)")
    if k == 0 or task.success_metric is None:
        return {}, []
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed + dist.rank_salt())
        batch = rollout_task(policy, task, examples, k, "sample")
    if is_episodic(task):  # one judgement per episode: its first step's row
        batch = batch.select([i for i, ex in enumerate(batch.examples) if ex["step_index"] == 0])
    solved = [task.success(c, ex) for c, ex in zip(batch.completions, batch.examples)]
    if any(s is None for s in solved):
        return {}, []
    groups: list[list[bool]] = [[] for _ in examples]
    for ok, g in zip(solved, batch.group_ids.tolist()):
        groups[g].append(ok)
    if dist.world_size() > 1:
        groups = [g for part in dist.gather(groups) for g in part]
    return {"pass@1": mean_pass_at_k(groups, 1), f"pass@{k}": mean_pass_at_k(groups, k)}, groups
