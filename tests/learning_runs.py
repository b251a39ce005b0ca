"""Shortened recipe runs for the learning tests, through the public ``mmrl.train``.

The learning cases (``learning_cases.CASES``) run in their own processes, one torch thread each,
two at a time (:func:`run_cases`): a 1M-parameter model gains almost nothing from a second thread,
so two one-thread runs side by side take about half the wall time of running them in turn at two
threads, and one thread makes a run's numbers independent of how many cores the machine has. The
tests (``learning_fixtures.py``) and the seed-spread campaign (``tests/campaigns/seed_spread.py``)
share this runner, so the thresholds are measured on exactly the runs the tests make.

Each of the two runs at a time is forked from a server process (``--serve``, one per place in the
pool) that has imported torch, transformers and mmrl and run nothing: the child starts from the
state a new process has after those imports (one thread, every step seeded), so its numbers are a
new process's (checked: the detection and darkness cases gave the same metrics to the last digit),
and the ~6 s of processor time a new process spends importing is spent once per server, not once
per run (13 runs a session).

    python tests/learning_runs.py CASE SEED OUT_DIR [--no-before] [--tag=NAME] [KEY=VALUE ...]   # one run, as a child makes it
"""

from __future__ import annotations

import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

QUIET = ["log.progress=false", "log.save_every=0", "log.save_rollouts_every=0"]


def train_quietly(recipe: str, tmp_path, name: str, *overrides: str):
    """``recipe`` with ``overrides`` (which win over the quiet logging defaults), run in ``tmp_path``;
    prints the held-out metrics before -> after."""
    import mmrl

    result = mmrl.train(recipe, [*QUIET, *overrides, f"log.output_dir={tmp_path}", f"log.run_name={name}"])
    print(f"{name}: held-out", {k: (round(result.before.get(k, float("nan")), 3), round(v, 3)) for k, v in result.after.items()})
    return result


@dataclass(frozen=True)
class Job:
    """One learning case at one seed; ``before=False`` leaves out the held-out evaluation before
    training (a run trains identically with or without it: every step reseeds from seed and step)."""

    case: str
    seed: int = 0
    before: bool = True
    extra: tuple[str, ...] = ()  # overrides after the case's own (the campaign compares settings)
    tag: str = ""  # names the setting ``extra`` makes, in the run's name

    @property
    def run_name(self) -> str:
        return f"{self.case}-seed{self.seed}" + (f"-{self.tag}" if self.tag else "")


@dataclass
class LearningRun:
    """What a finished run left: its held-out metrics before and after, its run directory, its
    wall time; ``error`` holds the tail of its output when it failed."""

    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    run_dir: Path | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the run's processor time after the server's imports: its wall time on an idle core
    error: str = ""


# What a run imports, imported once by each server before it forks its runs (a module left out
# costs its import time in every run, nothing else).
PRELOAD = ("torch", "transformers", "scipy.stats", "peft", "mmrl.api", "mmrl.core.trainer", "mmrl.vlm.policy",
           "mmrl.measures.math_equivalence", "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
           "torch.utils.tensorboard", "learning_cases")

_SERVERS: set[subprocess.Popen] = set()  # the servers in use, for stop_runs
_STOPPED = threading.Event()


def stop_runs() -> None:
    """Kill the servers and the runs in progress and start no more (a pytest session that ends
    before its learning tests read the runs: an interrupt, -x)."""
    _STOPPED.set()
    for proc in list(_SERVERS):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the server and the run it forked: its own session
        except ProcessLookupError:
            pass


class _Server:
    """``learning_runs.py --serve`` at one torch thread and CPU priority ``nice`` (19 yields the
    cores to anything else that runs), in its own session: :meth:`run` has it fork one run."""

    def __init__(self, nice: int = 0):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
                                     preexec_fn=(lambda: os.nice(nice)) if nice else None)
        _SERVERS.add(self.proc)

    def run(self, argv: list[str], log: Path) -> int:
        """The exit code of the run of ``argv`` (``_main``'s), its output in ``log``; -9 when the
        server was killed."""
        try:
            self.proc.stdin.write(json.dumps([argv, str(log)]) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return -9
        reply = self.proc.stdout.readline()
        return int(reply) if reply.strip() else -9

    def close(self) -> None:
        _SERVERS.discard(self.proc)
        self.proc.stdin.close()  # the server ends its loop
        self.proc.wait()


def _one_run(job: Job, out: Path, server: _Server) -> LearningRun:
    """``job`` in a child forked by ``server``; its result read from the JSON it writes."""
    if _STOPPED.is_set():
        return LearningRun(error="not run: the runs were stopped")
    flags = [*([] if job.before else ["--no-before"]), *([f"--tag={job.tag}"] if job.tag else [])]
    log = out / f"{job.run_name}.log"
    t0 = time.time()
    code = server.run([job.case, str(job.seed), str(out), *flags, *job.extra], log)
    wall = round(time.time() - t0, 1)
    result_file = out / f"{job.run_name}.json"
    if code != 0 or not result_file.exists():
        output = log.read_text(errors="replace") if log.exists() else ""
        return LearningRun(wall_s=wall, error=f"exit {code}:\n{output[-4000:]}")
    data = json.loads(result_file.read_text())
    return LearningRun(data["before"], data["after"], Path(data["run_dir"]), wall, data["cpu_s"])


def run_cases(jobs: list[Job], out: Path, workers: int = 2, report=print, on_done=None,
              nice: int = 0) -> dict[Job, LearningRun]:
    """Run ``jobs`` ``workers`` at a time, longest first (each case's ``seconds``), under ``out``,
    each at CPU priority ``nice``; ``on_done(job, run)`` is called as each is collected."""
    from learning_cases import CASES

    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(jobs, key=lambda j: -CASES[j.case].seconds)
    servers: queue.Queue[_Server] = queue.Queue()
    for _ in range(min(workers, len(ordered))):
        servers.put(_Server(nice))

    def one(job: Job) -> LearningRun:
        server = servers.get()
        try:
            return _one_run(job, out, server)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {job: pool.submit(one, job) for job in ordered}
            results = {}
            for job in ordered:
                results[job] = run = futures[job].result()
                report(f"learning run {job.run_name}: {run.wall_s:.0f} s ({run.cpu_s:.0f} s of processor time)"
                       + (" FAILED" if run.error else ""))
                if on_done:
                    on_done(job, run)
    finally:
        while not servers.empty():
            servers.get().close()
    return results


def _serve() -> None:
    """The server :class:`_Server` starts: import :data:`PRELOAD`, then for each line ``[argv, log]``
    on stdin fork a child that runs ``_main(argv)`` with its output in ``log``, wait for it and
    answer its exit code. One child at a time, forked from a process that has only imported."""
    import importlib
    import traceback

    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        argv, log = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the run
            code = 1
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                _main(argv)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


def _main(argv: list[str]) -> None:
    """One run of a learning case (what :func:`_one_run` starts): one torch thread, the case's
    overrides, ``train.seed``; writes ``OUT_DIR/<case>-seed<seed>.json``."""
    import torch

    from learning_cases import CASES

    torch.set_num_threads(1)
    name, seed, out, *rest = argv
    flags = [a for a in rest if a.startswith("--")]
    tag = next((a.split("=", 1)[1] for a in flags if a.startswith("--tag=")), "")
    job = Job(name, int(seed), before="--no-before" not in flags, extra=tuple(a for a in rest if a not in flags), tag=tag)
    out = Path(out)
    case = CASES[name]
    result = train_quietly(case.recipe, out, job.run_name, *case.overrides, f"train.seed={seed}", *job.extra,
                           *([] if job.before else ["eval.before=false"]))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    (out / f"{job.run_name}.json").write_text(json.dumps(
        {"before": result.before, "after": result.after, "run_dir": str(result.run_dir),
         "cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _serve() if sys.argv[1:] == ["--serve"] else _main(sys.argv[1:])
