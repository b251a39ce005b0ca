"""``mmrl eval``: score a run, a checkpoint or a recipe's starting model on its task's eval split (the
metrics with 95% bootstrap intervals, a prediction gallery), or with ``--benchmark`` on a
benchmark's files by its official protocol (:mod:`mmrl.eval_protocols`); registered on the app by
:mod:`mmrl.cli`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mmrl.cli.errors import configure_threads, interruptions, user_errors
from mmrl.cli.help import examples

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
EXAMPLES = examples(
    "mmrl eval runs/exp1                                  # the run's latest checkpoint",
    "mmrl eval runs/exp1/checkpoints/step_00000050        # one checkpoint of it",
    "mmrl eval configs/vlm/counting_tiny.yaml eval.num_examples=500   # the starting model",
    "mmrl eval runs/exp1 --benchmark screenspot_v2 --data ScreenSpot-v2/ --image-root ScreenSpot-v2/screenspotv2_image",
    "mmrl eval runs/exp1 --benchmark refcoco --data refcoco_val.json,refcoco_testA.json --image-root coco/train2014",
    "mmrl eval runs/t2i --benchmark geneval --clip ViT-L-14=weights/vit_l_14_openai.pt   # colours by CLIP",
    "mmrl list | grep '^benchmarks:'                      # the protocols")


def eval_(
    target: str = typer.Argument(..., metavar="TARGET",
                                 help="a run directory, one checkpoint directory of a run, or a recipe"),
    args: Optional[List[str]] = typer.Argument(None, metavar="KEY=VALUE",
                                               help="dotted overrides such as eval.num_examples=500"),
    num_examples: Optional[int] = typer.Option(None, help="eval examples (default: eval.num_examples)"),
    gallery: Optional[Path] = typer.Option(None, help="where to write the prediction gallery "
                                           "(default: <run dir>/eval_gallery, else ./eval_gallery)"),
    benchmark: Optional[str] = typer.Option(None, help="score on a benchmark's files by its official protocol "
                                            "and print its paper's table (mmrl list benchmarks)"),
    data: Optional[str] = typer.Option(None, help="the benchmark's files: a file or folder (a per-file "
                                       "benchmark such as refcoco: files separated by commas)"),
    image_root: Optional[str] = typer.Option(None, help="where the benchmark files' image paths start"),
    clip: Optional[str] = typer.Option(None, metavar="ARCH=CHECKPOINT", help="geneval: decide colours by CLIP "
                                       "zero-shot classification as GenEval's evaluate_images.py does (an open_clip "
                                       "architecture and a local checkpoint file) instead of the pixel rule"),
):
    """Score a checkpoint on its task's eval split: the task metric, pass@k, the mean reward and each
    reward with 95% bootstrap intervals, and an HTML + PNG gallery of predictions marked by the
    task's own success measure. With --benchmark, score it on a benchmark's files instead, the way
    the benchmark's official script does, and print the paper's table with intervals."""
    import json

    from mmrl.config import load_config
    from mmrl.api import make_policy
    from mmrl.core.evaluation import run_evaluation
    from mmrl.core.reward_computer import make_reward_computer
    from mmrl.core.run_checks import check_eval_split
    from mmrl.core.trainer import build_task
    from mmrl.runs.checkpoint import CheckpointManager
    from mmrl.runs.logging import to_jsonable

    path = Path(target)
    ckpt = None
    with user_errors():
        if path.is_dir() and (path / "config.yaml").exists():  # a run directory
            cfg_path, ckpt = path / "config.yaml", CheckpointManager(path / "checkpoints").latest()
        elif path.is_dir() and (path / "policy").exists():  # one checkpoint of a run
            cfg_path, ckpt = path.parent.parent / "config.yaml", path
        else:
            cfg_path = _recipe_or_run(target)
        cfg = load_config(cfg_path, list(args or []) + ["resume=false"])
        configure_threads(cfg)
        settings = {"clip": clip} if clip is not None else {}
        if benchmark is not None:
            return _eval_benchmark(cfg, ckpt, benchmark, data, image_root, num_examples, gallery, path, settings)
        if settings:
            raise ValueError(f"{', '.join('--' + k for k in settings)} is a setting of a benchmark: "
                             "give it with --benchmark (e.g. --benchmark geneval)")
        task = build_task(cfg)
        check_eval_split(task)  # as mmrl train does: nothing usable to score stops here, before the model loads
        policy = make_policy(cfg, task)
        if ckpt is not None:
            policy.load(ckpt / "policy")
        rewards = make_reward_computer(task, cfg.task)
    if gallery is None:
        gallery = (path if path.is_dir() and (path / "config.yaml").exists() else Path(".")) / "eval_gallery"
    with user_errors(setup=False), interruptions():
        result = run_evaluation(policy, task, rewards, cfg, num_examples, gallery_dir=gallery,
                                grid_path=gallery / "samples.png", intervals=True)
    from mmrl.measures.intervals import describe

    report = {"checkpoint": str(ckpt) if ckpt else cfg.model.path, "task": cfg.task.name, **result.metrics,
              "intervals": {**result.intervals, **describe()}}
    print(json.dumps(to_jsonable(report), indent=2, allow_nan=False))  # a NaN metric (nothing parsed) is null
    typer.echo(f"gallery: {gallery / 'index.html'} and {gallery / 'gallery.png'}", err=True)


def _recipe_or_run(target: str) -> Path:
    """The recipe ``target`` names; when there is none and ``target`` names a folder of runs (its
    parent, or the default ``runs/`` for a bare name close to a run's), the error lists those runs
    first: a mistyped run directory is the likelier slip (the recipes are for ``mmrl list``)."""
    import difflib

    from mmrl.config import ConfigError, builtin_config_path
    from mmrl.config.schema import Config
    from mmrl.runs.resume import run_names

    try:
        return builtin_config_path(target)
    except ConfigError:
        where = Path(target).expanduser()
        base = where.parent if where.parent != Path(".") else Path(Config().log.output_dir)
        names = run_names(base)
        close = difflib.get_close_matches(where.name, names, n=1)
        if not names or (where.parent == Path(".") and not close):
            raise
        hint = f"; did you mean {base / close[0]}?" if close else ""
        shown = ", ".join(names[:20]) + (f" (and {len(names) - 20} more)" if len(names) > 20 else "")
        raise ConfigError(f"no run directory {target!r}{hint} (runs in {base}/: {shown}); "
                          "a recipe is also accepted (`mmrl list` shows them)") from None


def _eval_benchmark(cfg, ckpt, name, data, image_root, num_examples, gallery, path, settings) -> None:
    """``mmrl eval --benchmark``: the table printed, and written as benchmark_<name>.json beside the gallery."""
    import json

    from mmrl.api import make_policy
    from mmrl.eval_protocols import BENCHMARKS, configured, format_table
    from mmrl.eval_protocols.run import run_benchmark
    from mmrl.runs.logging import to_jsonable

    def load_policy(one, task):
        policy = make_policy(one, task)
        if ckpt is not None:
            policy.load(ckpt / "policy")
        return policy

    if gallery is None:
        gallery = (path if path.is_dir() and (path / "config.yaml").exists() else Path(".")) / "eval_gallery"
    with user_errors():
        bench = configured(BENCHMARKS.get(name, "--benchmark"), settings)  # a bad --clip fails before any rollout
    with user_errors(setup=False), interruptions():
        report = run_benchmark(name, cfg, data, image_root, load_policy, num_examples, gallery, settings)
    typer.echo(format_table(bench, report["rows"]))
    if report["skipped"]:
        typer.echo(f"{report['skipped']} entries skipped (unreadable; the warnings name each)", err=True)
    gallery.mkdir(parents=True, exist_ok=True)
    out = gallery / f"benchmark_{name}.json"
    out.write_text(json.dumps(to_jsonable({"checkpoint": str(ckpt) if ckpt else cfg.model.path, **report}), indent=2,
                              allow_nan=False), encoding="utf-8")
    typer.echo(f"table: {out}; galleries under {gallery}", err=True)
