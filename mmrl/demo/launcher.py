"""The demo's "Launch" tab: start a training run from a shipped recipe, follow it, stop it.

A run is ``python -m mmrl train <modality> <recipe> ...`` in its own process (its own session and
process group), so a crash or an out-of-memory kill of the run never takes the app down, and a stop
ends the run with everything it started. Its terminal output goes to ``<runs_dir>/<name>/launch.log``
and its progress is read from the run directory like any other run (:mod:`.runs_index`).

What a page may ask for is narrow on purpose (:mod:`.overrides`): a shipped recipe, overrides of
allow-listed keys whose values are checked by kind, paths only inside the directories the demo
serves, never ``plugins``; the tab itself decides where the run writes. All of it is checked
before a process starts. The process starts in its own (new, empty) run directory, so nothing
beside the recipe and the checked overrides can reach ``sys.path`` or a relative path.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Union

from ..config import builtin_config_names
from .overrides import check_config, check_overrides, refuse_interpolation, yaml_quoted
from .paths import AllowedRoots
from .run_dirs import check_run_name, run_directory
from .runs_index import progress
from .status import run_state

__all__ = ["DEFAULT_MAX_RUNS", "Launcher", "builtin_recipes", "modality_of", "recipe_path"]

# A new run's name also passes through the config's YAML override parser and names a directory:
# letters, digits, '.', '_' and '-' keep both unsurprising.
_LAUNCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
LOG = "launch.log"
LOG_TAIL_LINES = 30
STOP_GRACE_S = 10.0
# Runs started from the page that may train at once: each may be as large as the allow-list permits.
DEFAULT_MAX_RUNS = 1


def builtin_recipes() -> list[str]:
    """The shipped recipes (``vlm/counting_tiny``, ...; not ``accelerate/``), tiny ones first:
    those run on a laptop CPU, the others need a downloaded model."""
    names = builtin_config_names()  # already leaves out configs/accelerate/
    return sorted(names, key=lambda n: ("tiny" not in n, n))


def recipe_path(recipe: str) -> Path:
    """The shipped file of ``recipe`` (a name from :func:`builtin_recipes`), never a file of the
    same name relative to the working directory; ValueError for any other name."""
    from ..configs import CONFIGS_DIR

    if recipe in builtin_recipes():
        for suffix in (".yaml", ".yml"):
            if (CONFIGS_DIR / f"{recipe}{suffix}").is_file():
                return CONFIGS_DIR / f"{recipe}{suffix}"
    raise ValueError(f"unknown recipe {recipe!r}; shipped recipes: {', '.join(builtin_recipes())}")


def modality_of(recipe: str) -> str:
    """The ``mmrl train`` modality of a recipe: its folder, except that GUI recipes train the VLM
    policy (``mmrl train vlm configs/gui/...``); see ``MODALITIES`` in :mod:`mmrl.cli`."""
    folder = recipe.split("/", 1)[0]
    return {"diffusion": "diffusion", "video": "video"}.get(folder, "vlm")


def _tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a log that may be long and still growing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


class Launcher:
    """Training runs started from the app, one subprocess each, by run name.

    ``roots`` are the directories the demo serves: a path an override names must lie inside them.
    At most ``max_runs`` of its runs train at once (runs started elsewhere do not count).
    Thread-safe: Gradio calls the tab's handlers from worker threads.
    """

    def __init__(self, runs_dir: Union[str, Path], roots: AllowedRoots, python: str = sys.executable,
                 max_runs: int = DEFAULT_MAX_RUNS):
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1 (got {max_runs})")
        self.runs_dir = Path(runs_dir).resolve()
        self.roots = roots
        self.python = python
        self.max_runs = max_runs
        self._procs: dict[str, subprocess.Popen] = {}
        self._stopped: set[str] = set()
        self._lock = threading.RLock()

    def command(self, recipe: str, overrides: list[str], name: str) -> list[str]:
        """The command line of a run: the shipped recipe's file, the checked overrides, then the
        log settings (last, so they win over the recipe's)."""
        return [self.python, "-m", "mmrl", "train", modality_of(recipe), str(recipe_path(recipe)), *overrides,
                f"log.output_dir={yaml_quoted(str(self.runs_dir))}", f"log.run_name={yaml_quoted(name)}",
                "log.progress=false"]

    def check(self, recipe: str, overrides_text: str) -> list[str]:
        """The canonical overrides of a request, after every check that needs no process: no
        value carries an interpolation, the recipe is shipped, each override allow-listed and of
        its kind, the config loads and reads no path outside the roots. ValueError /
        PermissionError saying what was refused."""
        refuse_interpolation("the recipe", recipe)
        path, modality = recipe_path(recipe), modality_of(recipe)
        overrides = check_overrides(overrides_text, self.roots, modality)
        check_config(path, overrides, self.roots, modality)
        return overrides

    def start(self, recipe: str, overrides_text: str, run_name: str) -> str:
        """Start training ``recipe`` as run ``run_name``; returns the name. ValueError for an unknown
        recipe, a refused override or name, or a name already taken (a new run never writes into an
        old one; the directory of a start that failed before training, holding only its launch.log,
        is reused)."""
        refuse_interpolation("the run name", run_name)
        name = check_run_name(run_name)
        if not _LAUNCH_NAME.match(name):
            raise ValueError(f"run name {name!r}: use letters, digits, '.', '_' and '-' (at most 100 characters)")
        overrides = self.check(recipe, overrides_text)
        with self._lock:
            running = self.running()
            if name in running:
                raise ValueError(f"run {name!r} is already running")
            if len(running) >= self.max_runs:
                raise ValueError(f"{len(running)} run(s) started here are training ({', '.join(running)}) and this "
                                 f"demo trains at most {self.max_runs} at once (mmrl demo --max-runs): stop one, or "
                                 "wait until it ends")
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            run_dir = run_directory(self.runs_dir, name)
            if _failed_start(run_dir):
                shutil.rmtree(run_dir)
            try:
                run_dir.mkdir()
            except FileExistsError:
                raise ValueError(f"a run named {name!r} already exists in {self.runs_dir}; choose another name") from None
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # launch.log follows the run as it goes
            try:
                with open(run_dir / LOG, "wb") as log:
                    proc = subprocess.Popen(self.command(recipe, overrides, name), cwd=run_dir,
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)
            except BaseException:
                shutil.rmtree(run_dir, ignore_errors=True)  # nothing ran: leave the name free
                raise
            self._procs[name] = proc
            self._stopped.discard(name)
        return name

    def _state(self, name: str) -> tuple[Optional[str], Optional[int]]:
        """This launcher's knowledge of run ``name``'s process: (state, return code), or
        (None, None) for a run it did not start (or started before a restart of the app)."""
        proc = self._procs.get(name)
        if proc is None:
            return None, None
        rc = proc.poll()
        if rc is None:
            return "running", None
        if name in self._stopped:
            return "stopped", rc
        return ("finished" if rc == 0 else "failed"), rc

    def status(self, name: str) -> dict[str, Any]:
        """{"state", "returncode", "step", "steps", "reward", "log_tail"} of a run. The state is the
        process's when this launcher started it, else read from the run's files
        (:func:`~mmrl.demo.status.run_state`: "not started", "running", "finished", "stopped")."""
        run_dir = run_directory(self.runs_dir, name)
        with self._lock:
            state, rc = self._state(name)
        info = progress(run_dir)
        return {"state": state or run_state(run_dir), "returncode": rc, **info, "log_tail": _tail(run_dir / LOG)}

    def running(self) -> list[str]:
        """Names of the runs still going."""
        with self._lock:
            return [name for name, proc in self._procs.items() if proc.poll() is None]

    def stop(self, name: str) -> str:
        """End run ``name`` and everything it started: SIGTERM to its process group, SIGKILL after
        ``STOP_GRACE_S`` seconds. Returns the run's state ("stopped", or what it already was)."""
        if not self._end([name]):
            return self.status(name)["state"]
        return "stopped"

    def close(self) -> None:
        """Stop every run still going, all at once (the app calls this when it exits: Ctrl-C,
        SIGTERM, SIGHUP)."""
        self._end(self.running())

    def _end(self, names: list[str]) -> list[str]:
        """SIGTERM to the process group of each run of ``names`` still going, then wait for them
        together, SIGKILL to what is left after ``STOP_GRACE_S``; the names it stopped."""
        with self._lock:
            procs = {n: self._procs[n] for n in names if n in self._procs and self._procs[n].poll() is None}
            self._stopped.update(procs)
        for proc in procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            # The leader is gone; a child that ignored SIGTERM would still hold the group.
            if _group_alive(proc.pid):
                _signal_group(proc.pid, signal.SIGKILL)
        return list(procs)


def _failed_start(run_dir: Path) -> bool:
    """A run directory holding nothing but the launch.log of a start that ended before training
    (a config or model error): its name is free again."""
    try:
        return [p.name for p in run_dir.iterdir()] == [LOG]
    except OSError:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
