"""A process that has imported torch, transformers and mmrl once and forks the suite's child
processes from there: the learning runs (``learning_runs.py``) and the ranks of the multi-process
tests (``test_distributed.launch``). A new Python process spends ~8-12 s of processor time on those
imports before its first line of work; a forked child starts from the server's state after them
(nothing run, one torch thread), so its numbers are a new process's (checked on the learning runs:
the same metrics to the last digit) and the imports are paid once per server, not once per child.

Each request is a group of children, each a script run as ``__main__`` with its own arguments,
environment additions and output file; the server answers their pids at once, then each exit code.
A child that fails ends its group's others (what torchrun's agent does to a failed rank's peers).
The tests of the launcher itself (a rank's error message, a stalled collective) keep torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

# What a child imports, imported once by the server before it forks (a module left out costs its
# import time in every child, nothing else).
PRELOAD = ("torch", "transformers", "scipy.stats", "peft", "accelerate", "safetensors.torch", "mmrl.api",
           "mmrl.core.trainer", "mmrl.vlm.policy", "mmrl.measures.math_equivalence",
           "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "torch.utils.tensorboard",
           "torch.distributed.elastic.multiprocessing.errors")



@dataclass
class Child:
    """``python SCRIPT ARGV...`` (``python -m MODULE ARGV...`` when ``module`` is set) with ``env``
    added to the server's environment, in directory ``cwd`` (default: the server's), its stdout and
    stderr in ``log`` (both in one file) or ``log`` and ``err``."""

    script: str
    argv: list[str]
    log: str
    err: str = ""
    env: dict[str, str] = field(default_factory=dict)
    group: int = 0  # a failed child ends the others of its group (the ranks of one launch)
    module: str = ""
    cwd: str = ""


def rank_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """The environment torchrun gives rank ``rank`` of ``nproc`` on one node (none for one process)."""
    if nproc == 1:
        return {}
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"}


class ForkServer:
    """``fork_server.py --serve`` at CPU priority ``nice`` (19 yields the cores to anything else),
    in a process group of its own, with one torch / OpenMP thread unless ``env`` says otherwise, having
    imported :data:`PRELOAD` and ``preload``."""

    def __init__(self, nice: int = 0, env: dict[str, str] | None = None, preload: tuple[str, ...] = ()):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               **(env or {})}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", *preload], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     preexec_fn=lambda: _own_group(nice))
        self.lock = threading.Lock()  # one request at a time

    def run(self, children: list[Child], timeout: float | None = None) -> list[int]:
        """The exit codes of ``children``, forked together (-9 for each when the server was killed).
        Past ``timeout`` seconds the children are killed and :class:`subprocess.TimeoutExpired` raised."""
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps([c.__dict__ for c in children]) + "\n")
                self.proc.stdin.flush()
                pids = json.loads(self.proc.stdout.readline() or "null")
            except (BrokenPipeError, ValueError):
                pids = None
            if pids is None:
                return [-9] * len(children)
            expired: list[bool] = []
            timer = threading.Timer(timeout, lambda: (expired.append(True), _kill(pids))) if timeout else None
            if timer is not None:
                timer.start()
            reply = self.proc.stdout.readline()
            if timer is not None:
                timer.cancel()
            if expired:
                raise subprocess.TimeoutExpired([c.script for c in children], timeout)
            return json.loads(reply) if reply.strip() else [-9] * len(children)

    def close(self) -> None:
        self.proc.stdin.close()  # the server ends its loop
        self.proc.wait()

    def kill(self) -> None:
        """The server and the children it forked (its process group), at once."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its group: the server and its children
        except ProcessLookupError:
            pass


def _own_group(nice: int) -> None:
    """The server's process group (so that :meth:`ForkServer.kill` ends it and its children) in the
    session of the tests: a new session would be a scheduling group of its own where the kernel's
    autogroup is on (Linux's default), weighing as much as the whole test session whatever its nice
    value; seen 2026-12-07: two nice-19 learning runs took 170% of the 2 cores, the tests 35%."""
    os.setpgid(0, 0)
    if nice:
        os.nice(nice)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _child(spec: dict) -> None:
    """In the forked child: the environment, the output files, then the script as ``__main__``."""
    import runpy
    import traceback

    code = 1
    try:
        os.environ.update(spec["env"])
        out = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(spec["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if spec["err"] else out
        os.dup2(out, 1)
        os.dup2(err, 2)
        if spec["cwd"]:
            os.chdir(spec["cwd"])
        sys.argv = [spec["script"], *spec["argv"]]
        try:
            if spec["module"]:
                runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, str(Path(spec["script"]).resolve().parent))
                runpy.run_path(spec["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve(extra: list[str]) -> None:
    """Import :data:`PRELOAD` and ``extra``; then for each line (a JSON list of :class:`Child` fields) fork the
    children, answer their pids, wait for them (a failed one ends the others) and answer their
    exit codes. The server itself runs nothing but imports."""
    import importlib

    for name in (*PRELOAD, *extra):
        importlib.import_module(name)
    for line in sys.stdin:
        specs = json.loads(line)
        pids = []
        for spec in specs:
            pid = os.fork()
            if pid == 0:
                _child(spec)
            pids.append(pid)
        print(json.dumps(pids), flush=True)
        codes: dict[int, int] = {}
        while len(codes) < len(pids):
            pid, status = os.wait()
            if pid not in pids:
                continue
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0:  # torchrun's agent: a failed rank's peers are stopped
                group = specs[pids.index(pid)]["group"]
                _kill([p for p, spec in zip(pids, specs) if p not in codes and spec["group"] == group])
        print(json.dumps([codes[p] for p in pids]), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    _serve(sys.argv[2:])
