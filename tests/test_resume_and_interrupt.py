"""A run is the user's: ``--resume`` finds the run it names (or says there is none), takes the run's
own config, treats overrides as changes, leaves a finished run alone; Ctrl-C finishes the step and
saves, a second Ctrl-C stops at once, and both say what was kept and how to resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CLI_RUN, mmrl_in_process
from mmrl.core.interrupt import StopOnInterrupt
from mmrl.runs.resume import NothingToResume, find_run, finished_steps


def _fake_run(root: Path, name: str, steps: int = 2, checkpoint: int | None = 2, summary: bool = True) -> Path:
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("train:\n  steps: %d\n" % steps)
    if checkpoint is not None:
        (run / "checkpoints" / f"step_{checkpoint:08d}").mkdir()
    if summary:
        (run / "summary.json").write_text(json.dumps({"before": {}, "after": {}, "steps": steps}))
    return run


def test_find_run_names_the_runs_that_exist(tmp_path):
    _fake_run(tmp_path, "exp1")
    _fake_run(tmp_path, "exp2")
    assert find_run(str(tmp_path / "exp1"), tmp_path) == tmp_path / "exp1"
    assert find_run("exp2", tmp_path) == tmp_path / "exp2"
    with pytest.raises(NothingToResume, match=r"nothing to resume: name the run.*exp1, exp2"):
        find_run(None, tmp_path)
    with pytest.raises(NothingToResume, match=r"no run 'epx1' to resume; did you mean .*exp1\?.*exp1, exp2"):
        find_run("epx1", tmp_path)
    with pytest.raises(NothingToResume, match="there are no runs in"):
        find_run("exp1", tmp_path / "elsewhere")


def test_a_run_is_finished_when_its_last_checkpoint_and_summary_are_in(tmp_path):
    assert finished_steps(_fake_run(tmp_path, "done"), 2) == 2
    assert finished_steps(tmp_path / "done", 3) is None  # train.steps raised: more to do
    assert finished_steps(_fake_run(tmp_path, "mid", checkpoint=1, summary=False), 2) is None
    assert finished_steps(_fake_run(tmp_path, "in-final-eval", summary=False), 2) is None  # killed in the eval


def test_first_interrupt_asks_and_second_raises():
    said, outer = [], signal.getsignal(signal.SIGINT)
    with StopOnInterrupt(lambda: said.append("asked")) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs between bytecodes of the main thread
        assert stop.requested and said == ["asked"]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is outer  # restored


COMMON = CLI_RUN  # conftest: the settings of finished_cli_run, the session's 2-step `mmrl train` run


def _train_rows(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if "reward" in json.loads(line)]


@pytest.fixture()
def finished_run(finished_cli_run):
    """A 2-step run made by `mmrl train` (conftest's, trained once a session); the resume tests each
    work on a copy."""
    return finished_cli_run


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(run, tmp_path / "runs" / run.name)
    return tmp_path / "runs" / run.name


@pytest.mark.slow
def test_resume_without_a_run_or_with_a_misspelt_one_starts_nothing(finished_run, tmp_path):
    _copy(finished_run, tmp_path)
    nameless, misspelt, misspelt_path = (mmrl_in_process(*args, cwd=tmp_path) for args in (
        ("train", "vlm", "--resume"), ("train", "vlm", "log.run_name=epx", "--resume"), ("train", "--resume", "runs/exq")))
    r = nameless
    assert r.returncode == 2 and "nothing to resume" in r.stderr and "runs in runs/: exp" in r.stderr
    r = misspelt
    assert r.returncode == 2 and "no run 'epx' to resume; did you mean runs/exp?" in r.stderr
    r = misspelt_path
    assert r.returncode == 2 and "did you mean runs/exp?" in r.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["exp"]  # no new run


@pytest.mark.slow
def test_resuming_a_finished_run_says_so_and_changes_nothing(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    before = (run / "metrics.jsonl").read_text()
    r = mmrl_in_process("train", "--resume", "runs/exp", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    said = " ".join(r.stderr.split())
    assert "runs/exp has trained all 2 steps" in said and "train.steps=4 --allow-config-change" in said
    assert (run / "metrics.jsonl").read_text() == before  # no re-save, no second eval row
    assert not (run / "config_history" / "001-resume-step-2.yaml").exists()


@pytest.mark.slow
def test_resume_takes_the_runs_config_and_overrides_are_changes(finished_run, tmp_path):
    """Nothing of the first command is re-typed (model path, batch sizes): the run's config.yaml is
    used; an override is shown as a diff and refused unless allowed."""
    run = _copy(finished_run, tmp_path)
    r = mmrl_in_process("train", "--resume", "runs/exp", "train.steps=3", cwd=tmp_path)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "train.steps: 2 -> 3" in said and "--allow-config-change" in said
    assert "mmrl train --resume runs/exp" in said and "drop the overrides" not in said
    r = mmrl_in_process("train", "--resume", "runs/exp", "train.steps=3", "--allow-config-change", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _train_rows(run) == [1, 2, 3]
    history = sorted(p.name for p in (run / "config_history").iterdir())
    assert history == ["000-start.yaml", "001-resume-step-2.yaml"]


@pytest.mark.slow
def test_a_resume_after_the_last_checkpoint_says_where_and_logs_the_final_eval_once(finished_run, tmp_path):
    """Killed in its final evaluation after logging it (summary.json not yet written) and after a
    save was killed half-way (a .tmp directory of a dead process): the resume says where it
    continues, removes the half-written checkpoint, evaluates again and logs that evaluation once."""
    run = _copy(finished_run, tmp_path)
    (run / "summary.json").unlink()
    eval_rows = [line for line in (run / "metrics.jsonl").read_text().splitlines()
                 if '"eval/accuracy"' in line and json.loads(line)["step"] == 2]
    assert len(eval_rows) == 1
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale = run / "checkpoints" / f".tmp-step_00000003-{proc.pid}"
    (stale / "policy").mkdir(parents=True)
    r = mmrl_in_process("train", "--resume", "runs/exp", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming runs/exp from step 2 of 2" in r.stdout
    assert not stale.exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "eval/accuracy" in row] == [0, 2]  # before, after: once each
    assert _train_rows(run) == [1, 2]


@pytest.mark.slow
def test_resuming_with_fewer_steps_than_the_checkpoint_is_one_line(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    before = (run / "metrics.jsonl").read_text()
    r = mmrl_in_process("train", "--resume", "runs/exp", "train.steps=1", "--allow-config-change", cwd=tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert ("error: runs/exp/checkpoints/step_00000002 is at step 2, past train.steps=1: to continue the run, "
            "resume with train.steps=2 or more; to train 1 steps, start a new run (another log.run_name)") in err
    assert (run / "metrics.jsonl").read_text() == before


def _start(random_tiny_dir, cwd: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmrl.cli", "train", "vlm", f"model.path={random_tiny_dir}",
                             *COMMON, "train.steps=500", "log.run_name=ctrlc", *extra],
                            cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def _wait_for_steps(run: Path, n: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        if (run / "metrics.jsonl").exists() and len(_train_rows(run)) >= n:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{run} did not reach step {n}")


@pytest.mark.slow
def test_ctrl_c_finishes_the_step_saves_and_says_how_to_resume(random_tiny_dir, tmp_path):
    proc = _start(random_tiny_dir, tmp_path, "log.save_every=0")
    run = tmp_path / "runs" / "ctrlc"
    _wait_for_steps(run, 2, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    said = " ".join(err.split())
    assert "Ctrl-C: finishing step" in said and "Press Ctrl-C again to stop at once" in said
    stopped = int(said.split("stopped after step ")[1].split(",")[0])
    assert "checkpoint saved; resume with: mmrl train --resume runs/ctrlc" in said
    assert (run / "checkpoints" / f"step_{stopped:08d}").is_dir() and max(_train_rows(run)) == stopped
    r = mmrl_in_process("train", "--resume", "runs/ctrlc", f"train.steps={stopped + 1}", "--allow-config-change", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _train_rows(run)[-2:] == [stopped, stopped + 1]


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_says_what_is_lost(random_tiny_dir, tmp_path):
    """Longer steps (32 samples of 64 tokens) so the second signal lands inside the step the first
    one asked to finish."""
    proc = _start(random_tiny_dir, tmp_path, "log.save_every=2", "train.prompts_per_step=4",
                  "rollout.num_generations=8", "rollout.max_completion_length=64")
    run = tmp_path / "runs" / "ctrlc"
    _wait_for_steps(run, 3, proc)
    proc.send_signal(signal.SIGINT)
    seen = ""
    while "Ctrl-C: finishing step" not in seen:
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    said = " ".join(err.split())
    done = max(_train_rows(run))
    last = max(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert last == done - done % 2 and "checkpoint saved" not in said
    assert f"interrupted after step {done}; the last checkpoint is step {last}, so {done - last} completed " \
           "step(s) after it and the step under way are lost; resume with: mmrl train --resume runs/ctrlc" in said
