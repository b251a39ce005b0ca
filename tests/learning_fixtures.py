"""The learning runs of a pytest session, each made once (``learning_runs.run_cases``: its own
process, one torch thread, two at a time). A learning test names its case with the
``learning_case`` mark; only the cases of the tests selected in this session run.

The runs start in the background as soon as the session's tests are collected, at the lowest CPU
priority (nice 19): while the other tests run (at one torch thread from then on) they take only
the processor time those leave idle, and the learning tests, moved to the end of the session, wait
for them (``learning_results``; the wait is the setup time of the first of them in ``--durations``).
A run's numbers do not depend on when it runs: one thread, every step seeded."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from learning_cases import CASES, SHARED_START
from learning_runs import Job, LearningRun, run_cases, stop_runs


def learning_case(name: str):
    """The mark naming the case of ``learning_cases.CASES`` a test reads."""
    return pytest.mark.learning_case(name)


class _Pool:
    """The session's learning runs, made in a background thread."""

    def __init__(self, names: list[str]):
        self.shared = [n for n in names if n in SHARED_START]
        # the SHARED_START cases train from one warm start scored on the same scenes: the first of
        # them evaluates it, the others leave that evaluation out and take its numbers
        self.jobs = [Job(n, before=n not in self.shared[1:]) for n in names]
        self.out = Path(tempfile.mkdtemp(prefix="mmrl-learning-"))
        self.lines: list[str] = []
        self.results: dict[Job, LearningRun] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name="learning-runs", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            self.results = run_cases(self.jobs, self.out, report=self.lines.append, nice=19)
        except BaseException as exc:  # handed to the tests that read the runs
            self.error = exc

    def runs(self) -> dict[str, LearningRun]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        runs = {job.case: run for job, run in self.results.items()}
        for name in self.shared[1:]:
            runs[name].before = dict(runs[self.shared[0]].before)
        return runs


_POOLS: dict[int, _Pool] = {}  # per pytest config (one per session)


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items):
    """The learning tests to the end of the session, their runs started now."""
    learning = [item for item in items if item.get_closest_marker("learning_case")]
    if not learning or config.option.collectonly:
        return
    rest = [item for item in items if not item.get_closest_marker("learning_case")]
    items[:] = rest + learning
    names = list(dict.fromkeys(item.get_closest_marker("learning_case").args[0] for item in learning))
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise pytest.UsageError(f"learning_case names not in learning_cases.CASES: {unknown}")
    _POOLS[id(config)] = _Pool(names)
    # From now on the runs keep both cores busy (at nice 19): a second torch thread of this process
    # would wait at every parallel region for a core a run holds. Measured on the 2-core machine
    # (2026-11-27), this process 68x the weight of the rest as nice 0 is of nice 19: five tiny-model
    # test files beside a low-priority process took 82 s at two threads, 34 s at one; seven files
    # with the detection and GRPO runs 274 s (365 s of CPU) at two, 166 s (228 s) at one.
    torch.set_num_threads(1)


def pytest_runtest_setup(item):
    """Once the session's learning runs are done, this process takes both cores again (one thread
    was only to leave the other core to the runs)."""
    pool = _POOLS.get(id(item.config))
    if pool is not None and not pool.thread.is_alive() and torch.get_num_threads() < 2:
        torch.set_num_threads(2)


def pytest_sessionfinish(session):
    """Runs still going when the session ends (interrupted, -x) are killed; the run directories go."""
    pool = _POOLS.pop(id(session.config), None)
    if pool is None:
        return
    stop_runs()
    pool.thread.join(timeout=30)
    shutil.rmtree(pool.out, ignore_errors=True)


@pytest.fixture(scope="session")
def learning_results(request) -> dict[str, LearningRun]:
    """Each selected learning test's case, run at the tests' seed (0), waited for."""
    pool = _POOLS[id(request.config)]
    runs = pool.runs()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for line in pool.lines:
        (reporter.write_line if reporter else print)(line)
    return runs


def learned(name: str, results: dict[str, LearningRun]) -> LearningRun:
    """Case ``name``'s run, asserting it finished and raised its metric by the case's gain."""
    run, case = results[name], CASES[name]
    assert not run.error, run.error
    print(f"{name}: held-out", {k: (round(run.before.get(k, float("nan")), 3), round(v, 3)) for k, v in run.after.items()})
    assert run.after[case.metric] - run.before[case.metric] >= case.gain, (case.metric, run.before, run.after)
    return run
