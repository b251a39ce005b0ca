"""The demo's "Launch" tab: start a training run from a shipped recipe, follow it, stop it.

A run is ``python -m mmrl train <modality> <recipe> ...`` in its own process (its own session and
process group), so a crash or an out-of-memory kill of the run never takes the app down, and a stop
ends the run with everything it started. Its terminal output goes to ``<runs_dir>/<name>/launch.log``
and its progress is read from the run directory like any other run (:mod:`.runs_index`).

Overrides come from a text box on a web page: each must be a plain ``key=value`` (no options, no
shell), and the tab itself decides where the run writes (``log.output_dir``, ``log.run_name``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional, Union

from ..config import builtin_config_names
from .runs_index import check_run_name, progress

__all__ = ["Launcher", "builtin_recipes", "modality_of", "parse_overrides"]

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
# The tab sets these (the run must land in the runs directory under the name it shows).
RESERVED_KEYS = ("log.output_dir", "log.run_name")
# A new run's name also passes through the config's YAML override parser and names a directory:
# letters, digits, '.', '_' and '-' keep both unsurprising.
_LAUNCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
LOG_TAIL_LINES = 30
STOP_GRACE_S = 10.0


def builtin_recipes() -> list[str]:
    """The shipped recipes (``vlm/counting_tiny``, ...; not ``accelerate/``), tiny ones first:
    those run on a laptop CPU, the others need a downloaded model."""
    names = builtin_config_names()  # already leaves out configs/accelerate/
    return sorted(names, key=lambda n: ("tiny" not in n, n))


def modality_of(recipe: str) -> str:
    """The ``mmrl train`` modality of a recipe: its folder, except that GUI recipes train the VLM
    policy (``mmrl train vlm configs/gui/...``); see ``MODALITIES`` in :mod:`mmrl.cli`."""
    folder = recipe.split("/", 1)[0]
    return {"diffusion": "diffusion", "video": "video"}.get(folder, "vlm")


def parse_overrides(text: Optional[str]) -> list[str]:
    """The ``key=value`` overrides in ``text`` (shell-quoted as on a command line).

    Only dotted config keys are accepted: the text becomes arguments of a subprocess, so an
    option (``--foo``) or anything else that is not an override is refused with the token named.
    """
    try:
        tokens = shlex.split(text or "")
    except ValueError as exc:  # an unclosed quote
        raise ValueError(f"cannot read the overrides ({exc}); write key=value pairs, e.g. train.steps=20") from None
    for token in tokens:
        key, eq, _ = token.partition("=")
        if not eq or not _KEY.match(key):
            raise ValueError(f"override {token!r} is not of the form key=value with a dotted config key "
                             "(e.g. train.steps=20 algo.beta=0.0)")
        if key in RESERVED_KEYS:
            raise ValueError(f"override {token!r}: {key} is set by the launch tab (the runs directory and the run name)")
    return tokens


def _yaml_quoted(text: str) -> str:
    """``text`` as a YAML single-quoted string: override values are parsed as YAML, where a name
    like ``007`` would become the number 7 (and the run would write to ``runs/7``)."""
    return "'" + str(text).replace("'", "''") + "'"


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

    Thread-safe: Gradio calls the tab's handlers from worker threads.
    """

    def __init__(self, runs_dir: Union[str, Path], python: str = sys.executable):
        self.runs_dir = Path(runs_dir).resolve()
        self.python = python
        self._procs: dict[str, subprocess.Popen] = {}
        self._stopped: set[str] = set()
        self._lock = threading.RLock()

    def command(self, recipe: str, overrides: list[str], name: str) -> list[str]:
        """The command line of a run (the log settings last, so they win over the recipe's)."""
        return [self.python, "-m", "mmrl", "train", modality_of(recipe), recipe, *overrides,
                f"log.output_dir={_yaml_quoted(str(self.runs_dir))}", f"log.run_name={_yaml_quoted(name)}",
                "log.progress=false"]

    def start(self, recipe: str, overrides_text: str, run_name: str) -> str:
        """Start training ``recipe`` as run ``run_name``; returns the name. ValueError for an unknown
        recipe, a bad override or name, or a name already taken (a new run never writes into an old one)."""
        if recipe not in builtin_recipes():
            raise ValueError(f"unknown recipe {recipe!r}; shipped recipes: {', '.join(builtin_recipes())}")
        overrides = parse_overrides(overrides_text)
        name = check_run_name(run_name)
        if not _LAUNCH_NAME.match(name):
            raise ValueError(f"run name {name!r}: use letters, digits, '.', '_' and '-' (at most 100 characters)")
        with self._lock:
            if name in self.running():
                raise ValueError(f"run {name!r} is already running")
            run_dir = self.runs_dir / name
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            try:
                run_dir.mkdir()
            except FileExistsError:
                raise ValueError(f"a run named {name!r} already exists in {self.runs_dir}; choose another name") from None
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # launch.log follows the run as it goes
            try:
                with open(run_dir / "launch.log", "wb") as log:
                    proc = subprocess.Popen(self.command(recipe, overrides, name), stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            except BaseException:
                shutil.rmtree(run_dir, ignore_errors=True)  # nothing ran: leave the name free
                raise
            self._procs[name] = proc
            self._stopped.discard(name)
        return name

    def _state(self, name: str) -> tuple[str, Optional[int]]:
        proc = self._procs.get(name)
        if proc is None:
            return "unknown", None  # not started by this app (or before a restart)
        rc = proc.poll()
        if rc is None:
            return "running", None
        if name in self._stopped:
            return "stopped", rc
        return ("finished" if rc == 0 else "failed"), rc

    def status(self, name: str) -> dict[str, Any]:
        """{"state", "returncode", "step", "steps", "log_tail"} of a run; "unknown" for a run this
        launcher did not start (its progress is still read from its directory when there is one)."""
        check_run_name(name)
        with self._lock:
            state, rc = self._state(name)
        run_dir = self.runs_dir / name
        info = progress(run_dir)
        return {"state": state, "returncode": rc, "step": info["step"], "steps": info["steps"],
                "log_tail": _tail(run_dir / "launch.log")}

    def running(self) -> list[str]:
        """Names of the runs still going."""
        with self._lock:
            return [name for name, proc in self._procs.items() if proc.poll() is None]

    def stop(self, name: str) -> str:
        """End run ``name`` and everything it started: SIGTERM to its process group, SIGKILL after
        ``STOP_GRACE_S`` seconds. Returns the run's state ("stopped", or what it already was)."""
        with self._lock:
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                return self._state(name)[0]
            self._stopped.add(name)
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        # The leader is gone; a child that ignored SIGTERM would still hold the group.
        if _group_alive(proc.pid):
            _signal_group(proc.pid, signal.SIGKILL)
        return "stopped"

    def close(self) -> None:
        """Stop every run still going (the app calls this when it exits)."""
        for name in self.running():
            self.stop(name)


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
