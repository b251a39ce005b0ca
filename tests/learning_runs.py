"""Shortened recipe runs for the learning tests, through the public ``mmrl.train``.

The learning cases (``learning_cases.CASES``) run in their own processes, one torch thread each,
two at a time (:func:`run_cases`): a 1M-parameter model gains almost nothing from a second thread,
so two one-thread runs side by side take about half the wall time of running them in turn at two
threads, and one thread makes a run's numbers independent of how many cores the machine has. The
tests (``learning_fixtures.py``) and the seed-spread campaign (``tests/campaigns/seed_spread.py``)
share this runner, so the thresholds are measured on exactly the runs the tests make.

Each of the two runs at a time is forked from a server process (``fork_server.ForkServer``, one per
place in the pool) that has imported torch, transformers and mmrl and run nothing, so the imports
are paid once per server, not once per run (13 runs a session); a forked run's numbers are a new
process's (checked: the detection and darkness cases gave the same metrics to the last digit).

    python tests/learning_runs.py CASE SEED OUT_DIR [--no-before] [--tag=NAME] [KEY=VALUE ...]   # one run, as a child makes it
"""

from __future__ import annotations

import json
import queue
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fork_server import Child, ForkServer

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


_SERVERS: set = set()  # the fork servers in use, for stop_runs
_STOPPED = threading.Event()


def stop_runs() -> None:
    """Kill the servers and the runs in progress and start no more (a pytest session that ends
    before its learning tests read the runs: an interrupt, -x)."""
    _STOPPED.set()
    for server in list(_SERVERS):
        server.kill()


def _one_run(job: Job, out: Path, server: ForkServer) -> LearningRun:
    """``job`` in a child forked by ``server``; its result read from the JSON it writes."""
    if _STOPPED.is_set():
        return LearningRun(error="not run: the runs were stopped")
    flags = [*([] if job.before else ["--no-before"]), *([f"--tag={job.tag}"] if job.tag else [])]
    log = out / f"{job.run_name}.log"
    t0 = time.time()
    code = server.run([Child(__file__, [job.case, str(job.seed), str(out), *flags, *job.extra], str(log))])[0]
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
    servers: queue.Queue[ForkServer] = queue.Queue()
    for _ in range(min(workers, len(ordered))):
        server = ForkServer(nice, preload=("learning_cases",))
        _SERVERS.add(server)
        servers.put(server)

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
            server = servers.get()
            _SERVERS.discard(server)
            server.close()
    return results


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
    _main(sys.argv[1:])
