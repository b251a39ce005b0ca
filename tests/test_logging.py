"""mmrl.runs.logging: run-directory outputs; mmrl.runs.terminal: the progress and the before/after table
(on a terminal, and on stdout that is a file or a pipe, as a cluster job's log is)."""

from __future__ import annotations

import io
import json

import numpy as np
import torch
from PIL import Image
from rich.console import Console

from mmrl.runs.logging import RunLogger
from mmrl.runs.terminal import TrainingProgress, print_before_after


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_jsonl_and_truncate(tmp_path):
    log = RunLogger(tmp_path, tensorboard=False)
    for s in range(1, 6):
        log.log(s, {"reward": torch.tensor(0.1 * s), "kl": np.float32(0.5), "n": 3, "note": "x"})
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert isinstance(rows[0]["reward"], float) and rows[0]["reward"] == pytest_approx(0.1)
    assert rows[0]["kl"] == 0.5 and rows[0]["note"] == "x" and "time" in rows[0]
    # A run killed mid-line, then resumed from the step-3 checkpoint.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')
    log.truncate_after(3)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    log.log(4, {"reward": 1.0})
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    log.close()


def test_a_resume_drops_the_final_evaluation_only_when_it_evaluates_again(tmp_path):
    """Steps 1-2 trained, then step 2's final evaluation logged on its own line. Resumed from the
    step-2 checkpoint with train.steps=2 (final=True) the run only evaluates again: that line goes.
    Resumed to train further (train.steps raised), step 2's evaluation stays: it is not re-run."""
    for final, kept in ((True, [(1, "reward"), (2, "reward")]),
                        (False, [(1, "reward"), (2, "reward"), (2, "eval/reward")])):
        run = tmp_path / str(final)
        log = RunLogger(run, tensorboard=False)
        log.log(1, {"reward": 0.5})
        log.log(2, {"reward": 0.75, "eval/reward": 0.25})  # an eval.every evaluation: part of the step's line
        log.log(2, {"eval/reward": 0.5, "data/eval/bad_images": 0.0})  # the final evaluation
        log.truncate_after(2, final=final)
        rows = read_jsonl(run / "metrics.jsonl")
        assert [(r["step"], "reward" if "reward" in r else "eval/reward") for r in rows] == kept
        log.close()


def pytest_approx(x):
    import pytest

    return pytest.approx(x, rel=1e-5)


def test_tensorboard_event_file(tmp_path):
    with RunLogger(tmp_path) as log:
        log.log(1, {"reward": 0.5, "text": "skipped", "vec": [1, 2]})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_save_rollouts(tmp_path):
    log = RunLogger(tmp_path, tensorboard=False)
    img = Image.new("RGB", (8, 8), "red")
    records = [
        {"image": img, "visualization": img, "prompt": "how many?", "completion": "<answer>3</answer>",
         "rewards": {"accuracy": torch.tensor(1.0), "format": np.float64(0.5)}, "answer": 3},
        {"prompt": "text only", "completion": "", "rewards": {"accuracy": 0.0}},
    ]
    out = log.save_rollouts(7, records)
    assert out == tmp_path / "rollouts" / "step_000007"
    assert (out / "0.png").exists() and (out / "0_vis.png").exists() and not (out / "1.png").exists()
    rows = read_jsonl(out / "rollouts.jsonl")
    assert rows[0]["image"] == "0.png" and rows[0]["visualization"] == "0_vis.png"
    assert rows[0]["rewards"] == {"accuracy": 1.0, "format": 0.5} and rows[0]["answer"] == 3
    assert rows[1]["prompt"] == "text only" and "image" not in rows[1]


def test_progress_disabled_and_enabled_under_capture(capsys):
    with TrainingProgress(5, enabled=False) as p:
        for s in range(1, 6):
            p.update(s, reward=0.5, step_time=0.1)
    assert capsys.readouterr() == ("", "")  # disabled: not a character
    with TrainingProgress(5, start_step=2) as p:  # pytest's capture: not a terminal
        for s in range(3, 6):
            p.update(s, reward=torch.tensor(0.25), step_time=0.01, kl=np.float32(0.1))
    out, err = capsys.readouterr()
    # Not a terminal: no live bar but a plain line per due step (every step of a 5-step run: 5% of
    # it is under one step); tensor and NumPy values formatted like floats.
    lines = out.splitlines()
    assert err == "" and [line.split(" | ")[0] for line in lines] == [
        "train step 3/5 (60%)", "train step 4/5 (80%)", "train step 5/5 (100%)"]
    assert "reward 0.250" in lines[-1] and "step time 0.01s" in lines[-1] and lines[-1].endswith("kl 0.100")


def test_a_file_gets_plain_progress_lines_as_the_run_goes(tmp_path):
    """stdout a file (a cluster job's log): a line after the first step, then every 5% of the run
    (2 of 40 steps), and after the last, each in the file when its step ends (read back before the
    run is over), with the elapsed and remaining time from the steps done; a slow run gets a line
    at least every minute however few steps that is."""
    clock = [0.0]
    path = tmp_path / "job.log"
    with open(path, "w") as f:
        p = TrainingProgress(40, console=Console(file=f), description="mmrl counting")
        p._clock = lambda: clock[0]
        with p:
            for step in range(1, 41):
                clock[0] += 3.0  # 3 s a step
                p.update(step, reward=0.5, step_time=3.0)
                if step == 10:
                    seen = path.read_text().splitlines()
    assert [line.split(" | ")[0] for line in seen] == [
        "mmrl counting step 1/40 (2%)", "mmrl counting step 2/40 (5%)", "mmrl counting step 4/40 (10%)",
        "mmrl counting step 6/40 (15%)", "mmrl counting step 8/40 (20%)", "mmrl counting step 10/40 (25%)"]
    assert seen[-1] == ("mmrl counting step 10/40 (25%) | reward 0.500 | step time 3.00s | elapsed 0:00:30 | "
                        "remaining 0:01:30")  # 30 s for 10 steps: 3 s each for the 30 left
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 20 and lines[-1].startswith("mmrl counting step 40/40 (100%)")
    assert "remaining 0:00:00" in lines[-1]
    # 1000 steps of 70 s: 5% is 50 steps, but a minute never passes without a line
    buf = io.StringIO()
    p = TrainingProgress(1000, start_step=500, console=Console(file=buf), description="rl", metric="loss")
    p._clock = lambda: clock[0]
    with p:
        for step in range(501, 504):
            clock[0] += 70.0
            p.update(step, loss=0.25, step_time=70.0)
    assert [line.split(" | ")[0] for line in buf.getvalue().splitlines()] == [
        "rl step 501/1000 (50%)", "rl step 502/1000 (50%)", "rl step 503/1000 (50%)"]
    assert "loss 0.250" in buf.getvalue() and "remaining 9:39:50" in buf.getvalue()  # 497 steps of 70 s


def test_progress_columns_and_resume_start():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200, color_system=None)
    p = TrainingProgress(10, start_step=4, console=console, description="rl")
    assert p._progress.tasks[0].completed == 4
    with p:
        p.update(5, reward=0.4567, step_time=1.234)
    text = buf.getvalue()
    assert "rl" in text and "step 5/10" in text and "reward 0.457" in text and "step time 1.23s" in text
    # mmrl sft's bar shows its loss in that column, not an empty reward
    buf = io.StringIO()
    with TrainingProgress(10, console=Console(file=buf, force_terminal=True, width=200, color_system=None),
                          description="mmrl sft counting", metric="loss") as p:
        p.update(3, loss=0.305, step_time=0.28)
    text = buf.getvalue()
    assert "loss 0.305" in text and "reward" not in text


def test_before_after_table(capsys):
    text = print_before_after({"reward": 0.25, "accuracy": 0.1}, {"reward": 0.75, "accuracy": 0.3}, title="eval")
    for s in ("eval", "reward", "accuracy", "0.2500", "0.7500", "+0.5000", "+0.2000", "before", "after", "change"):
        assert s in text
    assert "0.7500" in capsys.readouterr().out


def test_a_table_on_a_file_or_pipe_is_printed_at_its_full_width(capsys, monkeypatch):
    """stdout not a terminal (pytest's capture, as a job log): rich would cut and wrap the table at
    80 columns; it comes out at its own width, each row on one line, every name and interval whole."""
    monkeypatch.delenv("COLUMNS", raising=False)
    name = "reward/a_reward_component_with_a_long_name"
    before, after = {"accuracy": 0.1, name: 0.25}, {"accuracy": 0.3, name: 0.75}
    intervals = {"before": {name: (0.125, 0.375)}, "after": {name: (0.625, 0.875)}}
    print_before_after(before, after, title="held-out eval (counting, 200 examples; 95% bootstrap intervals)",
                       intervals=intervals)
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if name in line)
    assert "0.2500 [0.125, 0.375]" in row and "0.7500 [0.625, 0.875]" in row and "+0.5000" in row
    assert len(lines) == 7 and len(row) > 80  # title, top, header, rule, 2 rows, bottom: nothing wrapped
    assert len({len(line) for line in lines[1:]}) == 1


def strict_json(text):
    """json.loads refusing NaN / Infinity, which Python writes by default and JSON does not have."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_nan_metric_is_written_as_null(tmp_path):
    """``mae`` is NaN when no answer parses (nothing to average): metrics.jsonl, summary.json and
    ``mmrl eval`` write it as null, so every line is JSON any reader takes."""
    from mmrl.runs.logging import write_summary

    with RunLogger(tmp_path, tensorboard=False) as log:
        log.log(3, {"eval/mae": float("nan"), "eval/accuracy": torch.tensor(0.0), "x": np.float32("inf")})
    (row,) = [strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["eval/mae"] is None and row["x"] is None and row["eval/accuracy"] == 0.0
    write_summary(tmp_path, before={"mae": float("nan")}, after={"mae": 1.5}, steps=3, data={"train": {"bad_images": 2}})
    summary = strict_json((tmp_path / "summary.json").read_text())
    assert summary == {"before": {"mae": None}, "after": {"mae": 1.5}, "steps": 3, "data": {"train": {"bad_images": 2}}}


def test_mmrl_eval_prints_a_nan_metric_as_null(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import mmrl.api
    import mmrl.core.evaluation
    from mmrl.cli import app

    monkeypatch.setattr(mmrl.api, "make_policy", lambda cfg, task: object())  # no model needed here
    nan = float("nan")
    monkeypatch.setattr(mmrl.core.evaluation, "run_evaluation", lambda *args, **kwargs: mmrl.core.evaluation.Evaluation(
        {"accuracy": 0.0, "mae": nan, "skipped": 0.0}, {"accuracy": (0.0, 0.0), "mae": (nan, nan)}))
    result = CliRunner().invoke(app, ["eval", "vlm/counting_tiny", "--gallery", str(tmp_path / "gallery")])
    assert result.exit_code == 0, result.output
    out = strict_json(result.stdout[result.stdout.index("{"):result.stdout.rindex("}") + 1])
    assert out["mae"] is None and out["accuracy"] == 0.0 and out["task"] == "counting"
    assert out["intervals"]["mae"] == [None, None] and out["intervals"]["accuracy"] == [0.0, 0.0]
