"""The learning runs of a pytest session, each made once, two at a time, before the first learning
test reads them (``learning_runs.run_cases``). A learning test names its case with the
``learning_case`` mark; only the cases of the tests selected in this session run."""

from __future__ import annotations

import pytest
from learning_cases import CASES, SHARED_START
from learning_runs import Job, LearningRun, run_cases


def learning_case(name: str):
    """The mark naming the case of ``learning_cases.CASES`` a test reads."""
    return pytest.mark.learning_case(name)


@pytest.fixture(scope="session")
def learning_results(request, tmp_path_factory) -> dict[str, LearningRun]:
    """Each selected learning test's case, run at the tests' seed (0). The SHARED_START cases train
    from one warm start scored on the same scenes: the first of them evaluates it, the others leave
    that evaluation out and take its numbers."""
    names = []
    for item in request.session.items:
        mark = item.get_closest_marker("learning_case")
        if mark and mark.args[0] not in names:
            names.append(mark.args[0])
    shared = [n for n in names if n in SHARED_START]
    jobs = [Job(n, before=n not in shared[1:]) for n in names]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    report = (lambda line: reporter.write_line(line)) if reporter else print
    runs = {job.case: run for job, run in run_cases(jobs, tmp_path_factory.mktemp("learning"), report=report).items()}
    for name in shared[1:]:
        runs[name].before = dict(runs[shared[0]].before)
    return runs


def learned(name: str, results: dict[str, LearningRun]) -> LearningRun:
    """Case ``name``'s run, asserting it finished and raised its metric by the case's gain."""
    run, case = results[name], CASES[name]
    assert not run.error, run.error
    print(f"{name}: held-out", {k: (round(run.before.get(k, float("nan")), 3), round(v, 3)) for k, v in run.after.items()})
    assert run.after[case.metric] - run.before[case.metric] >= case.gain, (case.metric, run.before, run.after)
    return run
