"""Held-out evaluation: the eval split rolled out with the eval settings, scored, and shown.

With several processes each rank rolls out and scores a contiguous share of the examples; the
completions, examples and rewards are gathered, so every rank computes the metrics of the whole
split (those of one process, for deterministic decoding) and rank 0 draws the gallery."""

from __future__ import annotations

from pathlib import Path

import torch

from ..task import Task
from . import distributed as dist


def evaluate(policy, task: Task, rewards, cfg, num_examples: int | None = None,
             gallery_dir: Path | None = None, grid_path: Path | None = None) -> dict[str, float]:
    """Held-out mean reward, each reward component and the task's metrics on the eval split;
    with ``gallery_dir``, also an HTML + PNG gallery of the first predictions (right/wrong);
    with ``grid_path``, a PNG contact sheet of the samples (generated images or clips, or the
    task's pictures of text answers)."""
    examples_all = task.examples("eval")
    n = min(num_examples or cfg.eval.num_examples, len(examples_all))
    shard = range(*dist.shard_bounds(n))
    examples = [examples_all[i] for i in shard]
    if dist.world_size() > 1:  # seeds keyed by example index: those of one process, not of the share
        examples = [{"_index": i, **ex} if isinstance(ex, dict) else ex for i, ex in zip(shard, examples)]
    examples = policy.prepare_examples(examples)
    prompts = [task.prompt(ex) for ex in examples]
    batch = policy.rollout(examples, prompts, cfg.eval.num_generations, "eval",
                           need_old_logps=False, need_ref_logps=False)
    total, comps, _ = rewards(batch.completions, batch.examples, group_ids=batch.group_ids)
    completions, scored = batch.completions, batch.examples
    if dist.world_size() > 1:
        parts = dist.gather((completions, scored, total, comps))
        completions = [c for p in parts for c in p[0]]
        scored = [e for p in parts for e in p[1]]
        total = torch.cat([p[2] for p in parts])
        comps = {k: torch.cat([p[3][k] for p in parts]) for k in comps}
    out = {"reward": float(total.mean())}
    out.update({f"reward/{k}": float(v.mean()) for k, v in comps.items()})
    out.update({k: float(v) for k, v in task.metrics(completions, scored).items()})
    if not dist.is_main():
        return out
    if gallery_dir is not None or grid_path is not None:
        from ..runs.gallery import save_samples_grid, write_gallery

        if gallery_dir is not None:
            best = sum(w for w in rewards.weights.values() if w > 0)
            write_gallery(gallery_dir, task, completions, scored, total.tolist(), comps, best)
        if grid_path is not None:
            save_samples_grid(grid_path, task, completions, scored, total.tolist())
    return out
