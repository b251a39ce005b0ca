"""The command line as a user meets it: its messages and exit codes, by the command line's own code
in this process (``mmrl_in_process``); ``python -m mmrl.cli`` itself in a subprocess once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import mmrl_in_process

# The quick commands below are independent (each in its own directory): each test reads its own
# command's result.
QUICK_COMMANDS = {
    "mistyped_override": ("train", "vlm", "algo.epslion=0.3"),
    "mistyped_yaml": ("train", "vlm", "bad.yaml"),
    "unknown_modality": ("train", "audio"),
    "other_modality": ("train", "vlm", "diffusion/composition_tiny"),
    "missing_generator": ("train", "diffusion", "model.path=/nonexistent/sd3"),
}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """``name -> (CompletedProcess, the directory it ran in)`` for every command of QUICK_COMMANDS."""
    done = {}
    for name, args in QUICK_COMMANDS.items():
        cwd = tmp_path_factory.mktemp(name)
        if name == "mistyped_yaml":
            (cwd / "bad.yaml").write_text("rollout:\n  num_generation: 4\n")
            args = ("train", "vlm", str(cwd / "bad.yaml"))
        done[name] = (mmrl_in_process(*args, cwd=cwd), cwd)
    return done


@pytest.mark.slow
def test_mistyped_override_exits_nonzero_naming_key_and_suggestion(quick):
    r, cwd = quick["mistyped_override"]
    assert r.returncode == 2
    err = " ".join(r.stderr.split())
    assert "algo.epslion" in err and "algo.epsilon" in err
    assert not (cwd / "runs").exists()  # failed before doing anything


@pytest.mark.slow
def test_mistyped_yaml_key_names_file_and_line(quick):
    r, _ = quick["mistyped_yaml"]
    assert r.returncode == 2
    err = " ".join(r.stderr.split())
    assert "rollout.num_generation" in err and "line 2" in err and "rollout.num_generations" in err


def test_unknown_modality_is_a_clear_error(quick):
    r, _ = quick["unknown_modality"]
    assert r.returncode == 2 and "not available" in r.stderr


def test_a_task_of_the_other_modality_is_a_clear_error(quick):
    r, _ = quick["other_modality"]
    assert r.returncode == 2 and "mmrl train diffusion" in " ".join(r.stderr.split())


def test_generator_recipe_with_a_missing_model_dir_is_a_clear_error(quick):
    r, _ = quick["missing_generator"]
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "/nonexistent/sd3" in err and "downloaded" in err


@pytest.mark.slow
def test_list_shows_builtin_plugins_through_python_m_mmrl_cli(tmp_path):
    """The one command run as a user runs it: ``python -m mmrl.cli`` in a fresh process."""
    r = subprocess.run([sys.executable, "-m", "mmrl.cli", "list"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "counting" in r.stdout and "grounding" in r.stdout and "iou" in r.stdout and "grpo" in r.stdout


@pytest.mark.slow
def test_train_resume_and_eval_from_the_command_line(random_tiny_dir, tmp_path):
    """Train 1 step, resume to 2 with --resume, then `mmrl eval` the run directory."""
    import json

    common = [f"model.path={random_tiny_dir}", "train.device=cpu", "train.prompts_per_step=2",
              "rollout.num_generations=2", "rollout.max_completion_length=6", "eval.num_examples=2",
              f"log.output_dir={tmp_path}", "log.run_name=cli", "log.progress=false"]
    r = mmrl_in_process("train", "vlm", *common, "train.steps=1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = mmrl_in_process("train", "vlm", *common, "train.steps=2", "--resume", cwd=tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "train.steps: 1 -> 2" in err and "--allow-config-change" in err
    r = mmrl_in_process("train", "vlm", *common, "train.steps=2", "--resume", "--allow-config-change", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()
             if "reward" in json.loads(line)]
    assert steps == [1, 2]
    # the before/after intervals, the "before" ones carried through the resume by the checkpoint
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    for when in ("before", "after"):
        low, high = summary["intervals"][when]["accuracy"]
        assert low <= summary[when]["accuracy"] <= high
    assert summary["intervals"]["confidence"] == 0.95
    r = mmrl_in_process("eval", str(tmp_path / "cli"), "--num-examples", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["checkpoint"].endswith("step_00000002") and 0.0 <= out["reward"] <= 1.5 and "accuracy" in out
    assert out["intervals"]["reward"][0] <= out["reward"] <= out["intervals"]["reward"][1]
    gallery = tmp_path / "cli" / "eval_gallery"
    assert (gallery / "gallery.png").exists() and len(list(gallery.glob("0*.png"))) == 3
    assert json.loads((gallery / "summary.json").read_text())["shown"] == 3
    assert "right</h3>" in (gallery / "index.html").read_text()


@pytest.mark.slow
def test_eval_with_no_usable_eval_example_is_one_line_before_the_model_loads(tmp_path):
    """`mmrl eval RECIPE` whose eval split has nothing usable (every image path wrong; GQA's
    layout without image_template) stops as `mmrl train` does on the same data: one line naming the
    file, exit code 2, before the model loads (model.path names no model: that error never comes)."""
    import json

    from PIL import Image

    from test_data_formats import gqa_questions

    Image.new("RGB", (100, 80)).save(tmp_path / "a.png")
    good = {"image": "a.png", "question": "q", "answer": [10, 10, 50, 40]}
    (tmp_path / "train.jsonl").write_text(json.dumps(good) + "\n")
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({**good, "image": f"nope{i}.png"}) + "\n"
                                                 for i in range(3)))
    gqa = gqa_questions(tmp_path)
    cases = {
        "missing images": ("vlm/grounding_tiny", f"task.options.train_path={tmp_path / 'train.jsonl'}",
                           f"task.options.eval_path={tmp_path / 'eval.jsonl'}", str(tmp_path / "nope0.png")),
        "gqa without image_template": ("vlm/counting_tiny", "task.name=vqa", f"task.options.train_path={gqa}",
                                       f"task.options.eval_path={gqa}", "task.options.fields={image: imageId}",
                                       f"task.options.image_root={tmp_path / 'images'}", "02930152"),
    }
    for name, (recipe, *overrides, named) in cases.items():
        r = mmrl_in_process("eval", recipe, *overrides, "model.path=/nonexistent/model", cwd=tmp_path)
        err = " ".join(r.stderr.split())
        assert r.returncode == 2, (name, r.stderr[-2000:])
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert "Traceback" not in r.stderr and len(errors) == 1, (name, r.stderr[-2000:])
        assert errors[0].startswith("error: the eval split of task"), (name, err)
        assert "no example could be used" in err and named in err and "/nonexistent/model" not in err, (name, err)
        assert not (tmp_path / "eval_gallery").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "sft"])
def test_an_output_directory_that_cannot_be_written_stops_before_the_model_loads(tmp_path, monkeypatch, command):
    """`log.output_dir` under a file, and one the system refuses to write (the tests run as root,
    which passes permission bits, so the refusal is the probe's own OSError(EACCES), as a chmod
    would give a user): one line naming the path, exit code 2, before the model loads (model.path
    names no model: that error never comes) and nothing created."""
    import errno
    import tempfile

    args = (command, "vlm") if command == "train" else (command, "vlm/counting_tiny")
    (tmp_path / "afile").write_text("")
    r = mmrl_in_process(*args, f"log.output_dir={tmp_path / 'afile' / 'runs'}", "model.path=/nonexistent/model",
                        cwd=tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"error: cannot write {tmp_path / 'afile' / 'runs'} ({tmp_path / 'afile'} is a file, not a directory): " \
           "set log.output_dir to a directory you can write" in err
    assert "/nonexistent/model" not in err and "Traceback" not in r.stderr

    def refused(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    r = mmrl_in_process(*args, f"log.output_dir={tmp_path / 'locked'}", "log.run_name=x",
                        "model.path=/nonexistent/model", cwd=tmp_path)
    monkeypatch.undo()
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"error: cannot write {tmp_path / 'locked' / 'x'} (Permission denied): set log.output_dir" in err
    assert "/nonexistent/model" not in err and not (tmp_path / "locked").exists()


@pytest.mark.slow
def test_stdout_to_a_file_gets_progress_lines_and_whole_tables(random_tiny_dir, tmp_path):
    """`mmrl train vlm > job.log`, as a cluster job runs: no live bar (it would print nothing
    until the end) but a plain progress line per due step, and the before/after table at its full
    width, each row on one line with both intervals (rich would wrap it at $COLUMNS, else 80 columns;
    the tiny run's table is 77 wide, so the job's COLUMNS is 60)."""
    from conftest import CLI_RUN

    args = [a for a in CLI_RUN if a != "log.progress=false"]
    with open(tmp_path / "job.log", "w") as log:
        done = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "vlm", f"model.path={random_tiny_dir}",
                               *args, "train.steps=3", "log.run_name=job"], cwd=tmp_path, stdout=log,
                              stderr=subprocess.PIPE, text=True, timeout=600, env={**__import__("os").environ,
                                                                                    "COLUMNS": "60"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "job.log").read_text().splitlines()
    progress = [line.split(" | ")[0] for line in lines if line.startswith("mmrl counting step")]
    assert progress == ["mmrl counting step 1/3 (33%)", "mmrl counting step 2/3 (67%)", "mmrl counting step 3/3 (100%)"]
    assert all("reward " in line and "remaining " in line for line in lines if line.startswith("mmrl counting"))
    row = next(line for line in lines if line.startswith("│ reward "))
    assert row.count("[") == 2 and row.endswith("│") and len(row) > 60, row  # both intervals, one line
