"""What the demo's policy tabs do, called without a browser (:class:`mmrl.demo.playground.Playground`):
uploads read by each task's own reader, episodes stepped, models from runs and ``--models``
directories, and bad requests answered with messages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mmrl.demo.paths import AllowedRoots, PathRefused
from mmrl.demo.playground import DemoError, Playground


@pytest.fixture()
def play(tmp_path):
    return Playground(tmp_path / "runs", tmp_path / "uploads", model_roots=[tmp_path / "models"])


def _upload(play: Playground, ex: dict, name: str = "input.png") -> Path:
    path = play.upload_dir / "u1" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    ex["image"].save(path)
    return path


@pytest.mark.parametrize("task_name", ["counting", "grounding", "detection", "ocr", "chart_qa", "classification",
                                       "screen_grounding"])
def test_an_uploaded_image_with_the_filled_record_reads_back_as_the_synthetic_example(play, task_name):
    """The record template is what the task's own reader reads: the synthetic example's image saved
    as an upload with its template gives back the example's question and answer."""
    label = "tiny-gui" if task_name == "screen_grounding" else "tiny"
    task = play.task(label, task_name)
    ex = play.synthetic_example(task, 5)
    template = play.record_template(label, task_name, 5)
    got = play.uploaded_example(task, _upload(play, ex), template)
    if task_name == "classification":  # the question is the task's, with the synthetic classes as options
        assert got["question"].endswith("Options: " + ", ".join(ex["classes"]) + ".")
    for key in ("question", "instruction", "answer"):
        if key in ex and task_name != "classification":
            assert got[key] == ex[key], key
    if "box" in got:  # the target box read back in the same pixels
        assert tuple(got["box"]) == tuple(ex["box"])
    assert got["image"].size == ex["image"].size


@pytest.mark.slow
def test_an_uploaded_clip_is_read_by_the_video_task(play):
    from test_video_reader import write_clip

    play.upload_dir.mkdir(parents=True)
    clip = write_clip(play.upload_dir / "clip.mp4", frames=8, fps=2)
    task = play.task("tiny-video", "video_qa")
    got = play.uploaded_example(task, clip, json.dumps({"question": "How many shapes appear after the start?",
                                                        "answer": "3", "problem_type": "numerical"}))
    assert got["answer"] == "3" and got["video"].frames.shape[0] >= 2


@pytest.mark.slow
def test_a_sample_on_an_upload_scores_against_the_record(play):
    task = play.task("tiny", "counting")
    ex = play.synthetic_example(task, 2)
    upload = _upload(play, ex)
    right = play.sample("tiny", "counting", 0, 2, 0.0, upload, json.dumps({"question": ex["question"],
                                                                          "answer": ex["answer"]}))
    parsed = right.rows[0][right.columns.index("parsed answer")]
    wrong_answer = str(int(parsed) + 1) if parsed.isdigit() else "7"
    wrong = play.sample("tiny", "counting", 0, 2, 0.0, upload, json.dumps({"question": ex["question"],
                                                                          "answer": wrong_answer}))
    accuracy = right.columns.index("accuracy")
    assert [r[accuracy] for r in wrong.rows] == [0.0, 0.0]  # greedy: the same answer, judged by the record
    assert parsed.isdigit() and (right.rows[0][accuracy] == 1.0) == (parsed == ex["answer"])
    assert len(right.pictures) == 2 and right.input_text == ex["question"]


@pytest.mark.parametrize("record, words", [("{not json", "not JSON"), ("[1, 2]", "JSON object"),
                                           ("{}", "could not be read")])
def test_a_bad_record_is_a_message(play, record, words):
    task = play.task("tiny", "counting")
    upload = _upload(play, play.synthetic_example(task, 0))
    with pytest.raises(DemoError, match=words):
        play.uploaded_example(task, upload, record)


def test_uploads_are_read_only_from_the_upload_directory(play, tmp_path):
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"x")
    with pytest.raises(PathRefused):
        play.uploaded_example(play.task("tiny", "counting"), outside, "{}")
    link = play.upload_dir / "link.png"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)  # a link inside pointing outside is outside
    with pytest.raises(PathRefused):
        play.uploaded_example(play.task("tiny", "counting"), link, "{}")
    roots = AllowedRoots([play.upload_dir])
    assert not roots.contains(f"{play.upload_dir}/../elsewhere.png") and roots.contains(play.upload_dir / "a.png")


@pytest.mark.slow
def test_an_environment_task_is_stepped_through_episode_by_episode(play):
    out = play.sample("tiny-gui", "gui_env", 3, 2, 1.0)
    labels = [r[0] for r in out.rows]
    assert "episode 0 step 0" in labels and "episode 1 step 0" in labels
    steps = {e: sorted(int(l.split()[-1]) for l in labels if l.startswith(f"episode {e} ")) for e in (0, 1)}
    assert all(s == list(range(len(s))) for s in steps.values())  # every step of each episode, in order
    assert len(out.pictures) == len(out.rows)  # each step's screenshot with its click
    assert "environment" in out.columns and "episode(s) of" in out.message
    with pytest.raises(DemoError, match="reads no data files"):
        play.uploaded_example(play.task("tiny-gui", "gui_env"), _upload(play, {"image": out.pictures[0][0]}), "{}")


@pytest.mark.slow
def test_a_run_is_tried_with_its_own_task_only(play, finished_cli_run, tmp_path):
    shutil.copytree(finished_cli_run, play.runs_dir / "r1")  # a `mmrl train vlm` run on counting (conftest)
    assert "run: r1" in play.model_choices("vlm") and "run: r1" not in play.model_choices("diffusion")
    assert play.default_task("run: r1", "vlm") == "counting"
    out = play.sample("run: r1", "counting", 0, 2, 1.0)
    assert len(out.rows) == 2
    with pytest.raises(DemoError, match="trained task 'counting'"):
        play.sample("run: r1", "grounding", 0, 1, 1.0)
    with pytest.raises(ValueError):
        play.sample("run: ../r1", "counting", 0, 1, 1.0)


@pytest.mark.slow
def test_a_models_directory_checkpoint_loads_natively_without_running_its_code(play, random_tiny_dir, tmp_path):
    """A checkpoint that ships its own modelling code (``auto_map``) is loaded with transformers'
    native class: the code, which would leave a marker file, never runs."""
    ckpt = play.model_roots[0] / "ckpt"
    shutil.copytree(random_tiny_dir, ckpt)
    marker = tmp_path / "remote_code_ran"
    (ckpt / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((ckpt / "config.json").read_text())
    config["auto_map"] = {"AutoModelForImageTextToText": "modeling_evil.Evil"}
    (ckpt / "config.json").write_text(json.dumps(config))
    label = f"dir: {ckpt}"
    assert label in play.model_choices("vlm")
    out = play.sample(label, "counting", 0, 1, 1.0)
    assert len(out.rows) == 1 and not marker.exists()
    with pytest.raises(DemoError, match="not a checkpoint directory under"):
        play.sample(f"dir: {random_tiny_dir}", "counting", 0, 1, 1.0)


def test_a_link_out_of_a_models_directory_is_not_offered_nor_loaded(play, tmp_path):
    outside, mine = tmp_path / "outside" / "ckpt", tmp_path / "models" / "mine"
    for d in (outside, mine):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    away = tmp_path / "models" / "away"
    away.symlink_to(outside, target_is_directory=True)
    assert play._model_dirs() == [mine]
    assert f"dir: {mine}" in play.model_choices("vlm") and f"dir: {away}" not in play.model_choices("vlm")
    with pytest.raises(DemoError, match="not a checkpoint directory under the demo's --models"):
        play.load(f"dir: {away}", "counting")


def test_a_model_or_task_label_with_an_interpolation_is_refused(play):
    for label, task in (("tiny", "${oc.env:HOME}"), ("dir: ${oc.env:HOME}", "counting")):
        with pytest.raises(ValueError, match="OmegaConf interpolation"):
            play.load(label, task)


@pytest.mark.slow
def test_the_tiny_editing_generator_edits_an_uploaded_image(play):
    """An uploaded image with an instruction in its record: the editing generator is given it (the
    picture shows source | result), the preservation reward scores the result against it; a free-text
    prompt without an image is refused with what to do."""
    task = play.task("tiny-edit", "image_edit")
    assert {"tiny-edit", "tiny-i2v"} <= set(play.model_choices("diffusion"))
    assert {"image_edit", "motion_i2v"} <= set(play.task_choices("diffusion"))
    ex = play.synthetic_example(task, 3)
    upload = _upload(play, {"image": ex["source"]})
    assert json.loads(play.record_template("tiny-edit", "image_edit", 3))["instruction"] == ex["instruction"]
    out = play.sample("tiny-edit", "image_edit", 0, 2, 0.0, upload, json.dumps({"instruction": ex["instruction"]}))
    assert out.input_text == ex["instruction"] and len(out.pictures) == 2
    strip = out.pictures[0][0]
    frame = ex["source"].width * 6  # the task's pictures draw a 16-px image at 96 px
    assert 2 * frame <= strip.width < 3 * frame  # source | result (an upload has no target)
    preservation = out.columns.index("edit_preservation")
    assert all(0.5 < row[preservation] <= 1.0 for row in out.rows)  # the result keeps most of the source
    with pytest.raises(DemoError, match="upload one, with the instruction"):
        play.sample("tiny-edit", "image_edit", 0, 1, 0.0, prompt="make the red circle blue")
