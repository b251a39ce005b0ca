"""Held-out evaluation: the eval split rolled out with the eval settings, scored, and shown."""

from __future__ import annotations

from pathlib import Path

from ..task import Task


def evaluate(policy, task: Task, rewards, cfg, num_examples: int | None = None,
             gallery_dir: Path | None = None, grid_path: Path | None = None) -> dict[str, float]:
    """Held-out mean reward, each reward component and the task's metrics on the eval split;
    with ``gallery_dir``, also an HTML + PNG gallery of the first predictions (right/wrong);
    with ``grid_path``, a PNG contact sheet of the samples (generated images or clips, or the
    task's pictures of text answers)."""
    examples_all = task.examples("eval")
    n = min(num_examples or cfg.eval.num_examples, len(examples_all))
    examples = policy.prepare_examples([examples_all[i] for i in range(n)])
    prompts = [task.prompt(ex) for ex in examples]
    batch = policy.rollout(examples, prompts, cfg.eval.num_generations, "eval",
                           need_old_logps=False, need_ref_logps=False)
    total, comps, _ = rewards(batch.completions, batch.examples, group_ids=batch.group_ids)
    out = {"reward": float(total.mean())}
    out.update({f"reward/{k}": float(v.mean()) for k, v in comps.items()})
    out.update({k: float(v) for k, v in task.metrics(batch.completions, batch.examples).items()})
    if gallery_dir is not None or grid_path is not None:
        from ..runs.gallery import save_samples_grid, write_gallery

        if gallery_dir is not None:
            best = sum(w for w in rewards.weights.values() if w > 0)
            write_gallery(gallery_dir, task, batch.completions, batch.examples, total.tolist(), comps, best)
        if grid_path is not None:
            save_samples_grid(grid_path, task, batch.completions, batch.examples, total.tolist())
    return out
