"""``mmrl report RUN_DIR``: (re)build a run's ``report.html`` (:mod:`mmrl.runs.report`), for a run that
finished, one still running, or one that was stopped; registered on the app by :mod:`mmrl.cli`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mmrl.cli.errors import user_errors
from mmrl.cli.help import examples

EXAMPLES = examples(
    "mmrl report runs/exp1                              # writes runs/exp1/report.html",
    "mmrl report runs/exp1 --recipe vlm/grounding_tiny  # the config's differences from this recipe",
    "mmrl report runs/exp1 && xdg-open runs/exp1/report.html")


def report(
    run_dir: Path = typer.Argument(..., help="a run directory (what `mmrl train` wrote), finished or not"),
    recipe: Optional[str] = typer.Option(None, help="the recipe to list the config's differences from (a YAML "
                                         "file or a built-in name; default: the one the run started from, else "
                                         "the closest shipped one)"),
):
    """Write a run's report.html: one offline page with the held-out before/after table and its
    intervals, the curves (each reward, held-out metrics, KL, entropy, clipping, completion length,
    step time), the galleries, and the config with its differences from the recipe."""
    from mmrl.runs.report import write_report

    with user_errors():
        path = write_report(run_dir, recipe=recipe)
    typer.echo(path)
