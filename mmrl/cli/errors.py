"""How the command line reports what went wrong: one line and exit code 2 for what a user can fix
(every command alike), and after Ctrl-C where the run stopped and how to resume it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape  # error texts may hold brackets (`pip install mmrl[vllm]`)

console = Console(stderr=True, soft_wrap=True)  # a command in a message stays on one line


def fail(message: str, code: int = 2, prefix: str = "error") -> None:
    console.print(f"[red]{prefix}:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def user_errors(setup: bool = True, resume: Optional[str] = None):
    """What a user can fix is one line and exit code 2, for every command alike: config errors,
    a missing optional dependency (with its install line), a full disk or a directory that cannot
    be written (with ``resume``, the command that continues the run), and while setting up also a
    bad path, value or key. A traceback is left for what is a bug."""
    from mmrl.config import ConfigError
    from mmrl.extras import install_hint
    from mmrl.runs.disk import disk_message

    try:
        yield
    except ConfigError as exc:
        fail(str(exc), prefix="config error")
    except ImportError as exc:
        hint = install_hint(exc)
        if hint is None and not setup:
            raise
        fail(hint or str(exc))
    except OSError as exc:
        message = disk_message(exc, resume)
        if message is None and not (setup and isinstance(exc, (FileNotFoundError, FileExistsError))):
            raise
        fail(message or str(exc).strip("'\""))
    except (ValueError, KeyError) as exc:
        if not setup:
            raise
        fail(str(exc).strip("'\""))


@contextmanager
def interruptions():
    """Ctrl-C says what happened: where the run stopped, what was saved or lost, how to resume."""
    from mmrl.core.interrupt import TrainingInterrupted
    from mmrl.runs.resume import resume_command

    try:
        yield
    except TrainingInterrupted as exc:
        resume = f"resume with: {resume_command(exc.run_dir)}"
        if exc.saved:
            message = f"stopped after step {exc.step}, checkpoint saved; {resume}"
        elif exc.checkpoint_step:
            lost = exc.step - exc.checkpoint_step
            message = (f"interrupted after step {exc.step}; the last checkpoint is step {exc.checkpoint_step}, so "
                       f"{lost} completed step(s) after it and the step under way are lost; {resume}")
        else:
            message = (f"interrupted after step {exc.step}, before any checkpoint was written: nothing to resume; "
                       "run the same command again to start over")
        console.print(f"[yellow]{escape(message)}[/]", highlight=False)
        raise typer.Exit(130)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        raise typer.Exit(130)


def configure_threads(cfg) -> None:
    """Set torch's thread count for a command's run (``train.threads``), saying what it picked."""
    from mmrl.config.threads import configure_threads as configure

    with user_errors():
        configure(cfg, echo=lambda line: console.print(line, highlight=False))
