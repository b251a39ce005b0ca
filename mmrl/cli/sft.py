"""``mmrl sft``'s command body (registered on the app by :mod:`mmrl.cli`): set up the run of
:mod:`mmrl.vlm.sft_run`, train, print the held-out loss before -> after, where the model is and the
RL command that starts from it, or after a Ctrl-C the command that continues the run."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

import typer

from mmrl.cli.errors import console, user_errors
from mmrl.core.interrupt import TrainingInterrupted
from mmrl.config.recipes import split_args
from mmrl.runs.disk import check_writable
from mmrl.config.threads import configure_threads


def command(args: Sequence[str]) -> None:
    """The body of ``mmrl sft [RECIPE] [key=value ...]``."""
    from mmrl.vlm.sft_run import SFTRun, sft_config

    args = list(args)

    def again(run_dir: Path) -> str:  # the command that continues the run
        return shlex.join(["mmrl", "sft", *[a for a in args if not a.startswith(("resume=", "log.run_name="))],
                           "resume=true", f"log.run_name={run_dir.name}"])

    with user_errors():
        recipe, overrides = split_args(args)
        cfg = sft_config(recipe, overrides)
        configure_threads(cfg, echo=lambda line: console.print(line, highlight=False))
        check_writable(Path(cfg.log.output_dir) / (cfg.log.run_name or ""))  # before the model loads
        run = SFTRun(cfg)
    if run.main:
        console.print(f"run directory: [bold]{run.run_dir}[/]")
    try:
        with user_errors(setup=False, resume=again(run.run_dir)):
            result = run.run()
    except TrainingInterrupted as exc:
        state = "checkpoint saved" if exc.saved else f"last checkpoint: step {exc.checkpoint_step or 'none'}"
        console.print(f"[yellow]stopped after step {exc.step} ({state}); continue with: {again(exc.run_dir)}[/]",
                      highlight=False)
        raise typer.Exit(130)
    if run.main:
        before = "-" if result.before is None else f"{result.before:.4f}"
        print(f"held-out loss ({run.task.name}, {run.num_held_out} examples): {before} -> {result.after:.4f}")
        print(f"model: {result.model_dir}")
        print(" ".join(["RL from it: mmrl train", run.task.modality, *([recipe] if recipe else []),
                        f"model.path={result.model_dir}"]))
