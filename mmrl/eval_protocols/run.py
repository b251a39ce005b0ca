"""``mmrl eval --benchmark``: a policy rolled out on a benchmark's files and its table built."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Mapping, Optional

from . import BENCHMARKS, Benchmark, benchmark_table, configured


def benchmark_configs(cfg, bench: Benchmark, data: Optional[str], image_root: Optional[str]) -> list[tuple[Optional[str], object]]:
    """One config per evaluation the benchmark makes (per file for a per-file benchmark), each
    with the benchmark's task reading the files. A run trained on that task keeps its task
    options (answer format, coordinate frame ...) with the data options replaced; every sample
    is decoded once (``eval.num_generations=1``, pass@k off): the benchmarks score one answer."""
    if bench.needs_data and not data:
        raise ValueError(f"benchmark {bench.name!r} reads its files: give them with --data PATH")
    paths = [p for p in str(data).split(",") if p] if (data and bench.per_file) else [data]
    out = []
    for path in paths:
        if path is not None and not Path(path).expanduser().exists():
            raise FileNotFoundError(f"--data {path}: no such file or folder")
        one = copy.deepcopy(cfg)
        options = dict(one.task.options) if one.task.name == bench.task else {}
        options.update(bench.options(path, image_root))
        one.task.name, one.task.options = bench.task, options
        one.task.rewards, one.task.reward_kwargs = ({}, {}) if cfg.task.name != bench.task else (one.task.rewards, one.task.reward_kwargs)
        one.eval.num_generations, one.eval.pass_k = 1, 0
        out.append((Path(path).stem if (path and bench.per_file) else None, one))
    return out


def run_benchmark(name: str, cfg, data: Optional[str], image_root: Optional[str], load_policy: Callable,
                  num_examples: Optional[int] = None, gallery: Optional[Path] = None,
                  settings: Optional[Mapping[str, str]] = None) -> dict:
    """The table of benchmark ``name`` for the policy ``load_policy(cfg, task)`` returns (made
    once, for the first split): ``{"benchmark", "title", "rows", "skipped", "settings"}`` (skipped:
    the entries left out as the files were read, malformed or without their image, and the examples
    unusable when scored); each
    split's examples all scored unless ``num_examples`` caps them; ``settings`` are the
    benchmark's command-line settings (:func:`~mmrl.eval_protocols.configured`)."""
    from ..core.evaluation import run_evaluation
    from ..core.reward_computer import make_reward_computer
    from ..core.trainer import build_task
    from ..data.sequence import left_out_when_read
    from ..tools.task import one_per_trajectory

    bench = configured(BENCHMARKS.get(name, "--benchmark"), settings or {})
    rows, skipped, policy = [], 0, None
    for split, one in benchmark_configs(cfg, bench, data, image_root):
        task = build_task(one)
        if policy is None:
            policy = load_policy(one, task)
        n = num_examples or len(task.examples("eval"))
        skipped += left_out_when_read(task.examples("eval"))  # malformed, or their image absent
        where = None if gallery is None else gallery / (split or bench.name)
        ev = run_evaluation(policy, task, make_reward_computer(task, one.task), one, n, gallery_dir=where)
        skipped += int(ev.metrics.get("skipped", 0))
        # a tool task's evaluation is one row per turn: each trajectory is scored once, on its whole text
        completions, examples = one_per_trajectory(ev.completions, ev.examples)
        rows += benchmark_table(bench, task, completions, examples, split=split)
    return {"benchmark": bench.name, "title": bench.title, "rows": rows, "skipped": skipped,
            "settings": dict(settings or {})}
