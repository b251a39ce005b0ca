"""The demo's run reading (mmrl.demo.run_dirs, mmrl.demo.runs_index) and launching (mmrl.demo.launcher),

Run directories are built by hand in the trainer's format (RunLogger's metrics.jsonl and
rollouts/, the trainer's summary.json and sample sheets); two launcher tests start real tiny runs.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from PIL import Image

from mmrl.demo import launcher as L
from mmrl.demo import overrides as O
from mmrl.demo import run_dirs as D
from mmrl.demo import runs_index as R
from mmrl.demo import status as S
from mmrl.demo.paths import AllowedRoots, PathRefused

# Overrides that keep a real tiny run short and on one CPU thread.
QUICK = "train.prompts_per_step=2 rollout.num_generations=2 eval.num_examples=4 eval.pass_k=0 train.threads=1"


def _line(step, **metrics):
    return json.dumps({"step": step, "time": 1795523208.0 + step, **metrics}) + "\n"


def _train(step, reward, **extra):
    return _line(step, reward=reward, reward_std=0.5, **{"reward/format": 1.0, "reward/accuracy": reward - 0.5,
                                                         "reward/format/unparsable_frac": 0.0,
                                                         "reward/accuracy/unparsable_frac": 0.25},
                 completion_length=18.0, rollout_time=0.09, clip_frac_low=0.0, clip_frac_high=0.01, pg_loss=0.0,
                 kl=0.001 * step, loss=0.0, grad_norm=0.27, lr=0.0, step_time=0.15, **extra)


def _picture(path, colour):
    Image.new("RGB", (16, 16), colour).save(path)


def make_run(root, name="r1", steps=3):
    """A run as the trainer leaves it mid-way: resumed once (step 2 logged twice), the last line torn."""
    run = root / name
    (run / "checkpoints" / "step_00000002" / "policy").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_00000002\n")
    (run / "config.yaml").write_text(f"train:\n  steps: {steps}\n  seed: 0\nlog:\n  run_name: {name}\n")
    (run / "metrics.jsonl").write_text(
        _line(0, **{"eval/accuracy": 0.25, "eval/reward": 1.0, "eval/pass@1": 0.3, "eval/reward/format": 1.0})
        + _train(1, 0.75)
        + _train(2, 0.5)                      # the run was killed after step 2 ...
        + _train(2, 0.9, entropy=1.5)         # ... and resumed from step 1's checkpoint: this line wins
        + _train(3, 1.0, entropy=float("nan"))
        + _line(3, **{"eval/accuracy": 0.5, "eval/reward": 1.25})
        + "not json\n"
        + '{"step": 4, "time": 1795523212.0, "rew'  # a line being written
    )
    (run / "summary.json").write_text(json.dumps({"before": {"accuracy": 0.25}, "after": {"accuracy": 0.5},
                                                  "steps": steps}))
    _picture(run / "samples_before.png", "red")
    _picture(run / "samples_after.png", "green")
    for step in (2, 10):
        folder = run / "rollouts" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        rows = []
        for i in range(2):
            _picture(folder / f"{i}.png", "blue")
            _picture(folder / f"{i}_vis.png", "yellow")
            rows.append({"index": i, "image": f"{i}.png", "visualization": f"{i}_vis.png",
                         "prompt": "How many red circles are there?", "answer": "3",
                         "completion": f"<think>I see {i} circles</think><answer>{i}</answer>" + " x" * 200,
                         "rewards": {"format": 1.0, "accuracy": 0.0}, "reward": 1.0, "advantage": -0.5})
        (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


# -- runs_index --------------------------------------------------------------------------------------

def test_list_runs_newest_first_and_missing_dir(tmp_path):
    assert D.list_runs(tmp_path / "nope") == []
    old, _ = make_run(tmp_path, "old"), make_run(tmp_path, "new")
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    os.utime(old / "metrics.jsonl", (1_000_000, 1_000_000))
    os.utime(old / "config.yaml", (1_000_000, 1_000_000))
    assert D.list_runs(tmp_path) == ["new", "old"]
    assert D.run_path(tmp_path, "old") == tmp_path / "old"


@pytest.mark.parametrize("name", ["../x", "/etc", "a/b", "..", ".", "", "a\\b", "x\x00y", "  "])
def test_run_path_refuses_unsafe_names(tmp_path, name):
    make_run(tmp_path, "r1")
    with pytest.raises(ValueError):
        D.run_path(tmp_path, name)


def test_run_path_refuses_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no run named"):
        D.run_path(tmp_path, "empty")
    with pytest.raises(ValueError, match="no run named"):
        D.run_path(tmp_path, "missing")


def test_read_metrics_dedups_resumed_steps_and_skips_torn_lines(tmp_path):
    run = make_run(tmp_path)
    train = R.read_metrics(run)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert train[1]["reward"] == 0.9 and train[1]["entropy"] == 1.5  # the resumed run's line
    assert R.read_metrics(tmp_path / "nothing") == []


def test_curve_frames_panels(tmp_path):
    frames = R.curve_frames(make_run(tmp_path))
    assert list(frames) == ["reward", "KL", "entropy", "clip fraction", "step time", "eval"]
    for frame in frames.values():
        assert list(frame.columns) == ["step", "value", "metric"]
        assert str(frame["step"].dtype) == "int64" and str(frame["value"].dtype) == "float64"
    reward = frames["reward"]
    assert set(reward["metric"]) == {"reward", "reward/format", "reward/accuracy"}
    assert reward[reward.metric == "reward"]["value"].tolist() == [0.75, 0.9, 1.0]
    assert set(frames["KL"]["metric"]) == {"kl"}
    assert frames["entropy"]["step"].tolist() == [2]  # the NaN at step 3 is dropped
    assert set(frames["clip fraction"]["metric"]) == {"clip_frac_low", "clip_frac_high"}
    assert set(frames["step time"]["metric"]) == {"step_time", "rollout_time"}
    ev = frames["eval"]
    assert set(ev["metric"]) == {"eval/accuracy", "eval/reward", "eval/reward/format"}  # no pass@
    assert ev[ev.metric == "eval/accuracy"][["step", "value"]].values.tolist() == [[0, 0.25], [3, 0.5]]
    assert not any("unparsable" in m for f in frames.values() for m in f["metric"])


def test_curve_panels_patterns():
    reward = R.CURVE_PANELS["reward"]
    assert reward("reward") and reward("reward/iou") and reward("reward/by_source/counting")
    assert not reward("reward_std") and not reward("reward/format/unparsable_frac") and not reward("reward/x/errors")
    assert R.CURVE_PANELS["entropy"]("entropy") and not R.CURVE_PANELS["entropy"]("reward/ttrv_low_entropy")
    assert R.CURVE_PANELS["clip fraction"]("clip_frac_dual") and not R.CURVE_PANELS["KL"]("kl_coef")


def test_curve_frames_of_an_empty_run(tmp_path):
    (tmp_path / "r").mkdir()
    assert R.curve_frames(tmp_path / "r") == {}


def test_rollout_gallery(tmp_path):
    run = make_run(tmp_path)
    assert R.rollout_steps(run) == [2, 10]
    latest = R.rollout_gallery(run)
    assert [p for p, _ in latest] == [str(run / "rollouts" / "step_000010" / f"{i}_vis.png") for i in range(2)]
    caption = latest[1][1]
    assert caption.startswith("reward 1.00 (format 1.00, accuracy 0.00) | answer: 3 | completion: <think>I see 1")
    assert len(caption) <= R.CAPTION_CHARS
    assert R.rollout_gallery(run, step=2)[0][0].endswith("step_000002/0_vis.png")
    assert R.rollout_gallery(run, step=7) == []
    assert R.rollout_steps(tmp_path / "nothing") == [] and R.rollout_gallery(tmp_path / "nothing") == []


def test_rollout_gallery_without_jsonl_lists_the_pictures(tmp_path):
    run = make_run(tmp_path)
    (run / "rollouts" / "step_000010" / "rollouts.jsonl").unlink()
    assert [c for _, c in R.rollout_gallery(run)] == ["0_vis.png", "1_vis.png"]


def test_generated_picture_is_shown_with_its_prompt(tmp_path):
    folder = tmp_path / "r" / "rollouts" / "step_000001"
    folder.mkdir(parents=True)
    _picture(folder / "0_completion.png", "red")
    (folder / "rollouts.jsonl").write_text(json.dumps(
        {"index": 0, "completion": "0_completion.png", "visualization": None, "prompt": "a red square",
         "rewards": {"color": 1.0}, "reward": 1.0}) + "\n")
    assert R.rollout_gallery(tmp_path / "r") == [(str(folder / "0_completion.png"),
                                                  "reward 1.00 (color 1.00) | prompt: a red square")]


def test_eval_pictures(tmp_path):
    run = make_run(tmp_path)
    (run / "eval_gallery").mkdir()
    _picture(run / "eval_gallery" / "gallery.png", "white")
    (run / "episodes_after").mkdir()
    for n in range(10):
        _picture(run / "episodes_after" / f"episode{n:03d}_step00.png", "black")
    pictures = R.eval_pictures(run)
    assert pictures[0] == (str(run / "samples_before.png"), "held-out samples before training")
    assert [p for p, _ in pictures[1:3]] == [str(run / "samples_after.png"), str(run / "eval_gallery" / "gallery.png")]
    assert len(pictures) == 3 + 8 and pictures[-1][0].endswith("episode007_step00.png")
    assert R.eval_pictures(tmp_path / "nothing") == []


def test_config_summary_checkpoint_progress(tmp_path):
    run = make_run(tmp_path, steps=3)
    assert "steps: 3" in R.read_config_text(run)
    assert R.read_summary(run)["after"] == {"accuracy": 0.5}
    assert R.latest_checkpoint(run) == run / "checkpoints" / "step_00000002"
    assert R.progress(run) == {"step": 3, "steps": 3, "reward": 1.0}
    (run / "summary.json").write_text('{"before": {"accura')  # corrupt
    assert R.read_summary(run) == {}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert R.read_config_text(empty) == "" and R.read_summary(empty) == {} and R.latest_checkpoint(empty) is None
    assert R.progress(empty) == {"step": 0, "steps": None, "reward": None}


def test_links_out_of_a_run_read_as_absent_and_links_inside_as_they_are(tmp_path):
    """Every file a run shows is read only where it resolves inside the run's directory; a run
    directory only where it resolves inside the runs directory (issue 51, item 3)."""
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    theirs = make_run(outside, "theirs")
    ours = make_run(runs, "ours")
    for name in ("config.yaml", "summary.json", "metrics.jsonl", "samples_before.png", "checkpoints", "rollouts"):
        path = ours / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        path.symlink_to(theirs / name, target_is_directory=(theirs / name).is_dir())
    assert R.read_config_text(ours) == "" and R.read_summary(ours) == {} and R.read_metrics(ours) == []
    assert R.latest_checkpoint(ours) is None and R.rollout_steps(ours) == [] and R.rollout_gallery(ours) == []
    assert [c for _, c in R.eval_pictures(ours)] == ["held-out samples after training"]
    assert R.progress(ours) == {"step": 0, "steps": None, "reward": None}
    assert D.list_runs(runs) == []  # a run only through links is not one
    (runs / "away").symlink_to(theirs, target_is_directory=True)
    (runs / "alias").symlink_to(runs / "kept", target_is_directory=True)
    kept = make_run(runs, "kept")
    assert sorted(D.list_runs(runs)) == ["alias", "kept"]
    assert R.read_summary(D.run_path(runs, "alias"))["after"] == {"accuracy": 0.5}  # inside: read as it is
    with pytest.raises(ValueError, match=f"run 'away' is a link to {theirs}, outside {runs}"):
        D.run_path(runs, "away")
    with pytest.raises(ValueError, match="outside"):
        L.Launcher(runs, AllowedRoots([runs])).status("away")
    assert R.latest_checkpoint(kept) == kept / "checkpoints" / "step_00000002"


def test_interpolations_are_refused_in_every_spelling_and_only_there(tmp_path):
    roots = _roots(tmp_path)
    served = tmp_path / "served"
    for text in (f"model.path={served}/${{oc.env:HOME}}", f"task.options.eval_path={served}/$\\{{x}}",
                 f"task.options.image_root={served}/'$'{{x}}", "train.steps=${train.seed}"):
        with pytest.raises(ValueError, match="OmegaConf interpolation"):
            O.check_overrides(text, roots, "vlm")
    (served / "${oc.env:HOME}").mkdir()
    (served / "link").symlink_to(served / "${oc.env:HOME}")
    with pytest.raises(ValueError, match="the path it resolves to.*OmegaConf interpolation"):
        O.check_overrides(f"model.path={served}/link", roots, "vlm")
    # `$` and `{` apart are no interpolation: such a path is served like any other
    assert O.check_overrides(f"task.options.eval_path={served}/a$b{{c}}", roots, "vlm") == [
        f"task.options.eval_path='{served}/a$b{{c}}'"]
    launcher = L.Launcher(tmp_path, roots)
    for recipe, name in (("${oc.env:HOME}", "x"), ("vlm/counting_tiny", "${x}")):
        with pytest.raises(ValueError, match="OmegaConf interpolation"):
            launcher.start(recipe, "train.steps=1", name)


def test_the_launcher_starts_at_most_max_runs(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    with pytest.raises(ValueError, match="at least 1"):
        L.Launcher(tmp_path / "runs", AllowedRoots([tmp_path]), max_runs=0)
    launcher = L.Launcher(tmp_path / "runs", AllowedRoots([tmp_path]), python=str(fake), max_runs=2)
    try:
        launcher.start("vlm/counting_tiny", "train.steps=1", "a")
        launcher.start("vlm/counting_tiny", "train.steps=1", "b")
        with pytest.raises(ValueError, match=r"2 run\(s\) started here are training \(a, b\).*at most 2 at once"):
            launcher.start("vlm/counting_tiny", "train.steps=1", "c")
        assert not (tmp_path / "runs" / "c").exists()
        launcher.stop("a")
        launcher.start("vlm/counting_tiny", "train.steps=1", "c")
        assert sorted(launcher.running()) == ["b", "c"]
        started = time.monotonic()
        launcher.close()  # both stopped at once: one grace period at most, not one per run
        assert launcher.running() == [] and time.monotonic() - started < L.STOP_GRACE_S
        assert {launcher.status(n)["state"] for n in "abc"} == {"stopped"}
    finally:
        launcher.close()


# -- launcher ----------------------------------------------------------------------------------------

def test_builtin_recipes_and_modalities():
    recipes = L.builtin_recipes()
    assert "vlm/counting_tiny" in recipes and "gui/synthetic_gui_tiny" in recipes
    assert not any(r.startswith("accelerate/") for r in recipes)
    tiny = [("tiny" in r) for r in recipes]
    assert tiny == sorted(tiny, reverse=True)  # every tiny recipe before the others
    assert [L.modality_of(r) for r in ("vlm/counting_tiny", "gui/synthetic_gui_tiny", "diffusion/composition_tiny",
                                       "video/video_qa_tiny")] == ["vlm", "vlm", "diffusion", "video"]
    from mmrl.cli import MODALITIES

    assert {L.modality_of(r) for r in recipes} <= set(MODALITIES)


def test_parse_overrides():
    assert O.parse_overrides("train.steps=2 algo.beta=0.0") == [("train.steps", "2"), ("algo.beta", "0.0")]
    assert O.parse_overrides("  ") == [] and O.parse_overrides(None) == []
    assert O.parse_overrides("task.options.query='a b'") == [("task.options.query", "a b")]
    for bad, said in (("--foo", "--foo"), ("rm -rf", "rm"), ("train.steps=2 -x=1", "-x=1"), ("a='b", "overrides")):
        with pytest.raises(ValueError, match=said):
            O.parse_overrides(bad)


def _roots(tmp_path):
    (tmp_path / "served").mkdir(exist_ok=True)
    return AllowedRoots([tmp_path / "served"])


def test_allowed_overrides_come_back_canonical_and_quoted(tmp_path):
    roots = _roots(tmp_path)
    data = tmp_path / "served" / "data.json"
    text = (f"train.steps=+20 train.learning_rate=1e-5 algo.beta=0 algo.epsilon_high=null eval.before=True "
            f"algo.advantage=rloo algo.loss_agg_mode=seq_mean_token_mean model.path=tiny "
            f"task.options.eval_path={tmp_path}/served/./data.json task.options.image_root=null")
    assert O.check_overrides(text, roots, "vlm") == [
        "train.steps=20", "train.learning_rate=1e-05", "algo.beta=0.0", "algo.epsilon_high=null",
        "eval.before=true", "algo.advantage='rloo'", "algo.loss_agg_mode='seq_mean_token_mean'",
        "model.path='tiny'", f"task.options.eval_path='{data}'", "task.options.image_root=null"]
    assert O.check_overrides("model.path=tiny-t2v", roots, "diffusion") == ["model.path='tiny-t2v'"]
    # issue 37's keys: a registered optimizer, a KV cache by name
    assert O.check_overrides("train.optim=adamw_kahan rollout.cache_implementation=static", roots, "vlm") == [
        "train.optim='adamw_kahan'", "rollout.cache_implementation='static'"]


@pytest.mark.parametrize("text, said", [
    ("plugins=[/tmp/p.py]", "plugins is never accepted"),
    ("log.output_dir=/tmp", "set by the launch tab"),
    ("log.run_name=x", "set by the launch tab"),
    ("resume=true", "not a key the launch tab accepts"),
    ("'task.options={train_path: /etc/passwd}'", "not a key the launch tab accepts"),
    ("task.reward_kwargs.clip_score.pretrained=/x.pt", "not a key the launch tab accepts"),
    ("train.steps=0", "an integer from 1"),
    ("train.steps=1e3", "an integer"),
    ("train.steps='1\nplugins: [/tmp/p.py]'", "an integer"),   # YAML in a value never reaches the config
    ("algo.beta=nan", "a number"),
    ("algo.beta=inf", "a number"),
    ("eval.before=yes", "true or false"),
    ("algo.advantage='grpo\nplugins: [x]'", "advantage estimator"),
    ("algo.advantage=[grpo]", "advantage estimator"),
    ("algo.kl_estimator=k4", "one of k1 | k2 | k3"),
    ("train.optim=sgd", "optimizer"),
    ("rollout.cache_implementation=offloaded", "one of dynamic | static"),
    ("model.path=tiny-t2v", "shipped tiny model"),            # a generator's name, for a VLM recipe
])
def test_refused_overrides_name_the_key_and_what_it_takes(tmp_path, text, said):
    with pytest.raises((ValueError, PermissionError), match=said):
        O.check_overrides(text, _roots(tmp_path), "vlm")


def test_paths_must_resolve_inside_the_roots(tmp_path):
    roots = _roots(tmp_path)
    (tmp_path / "secret.json").write_text("{}")
    (tmp_path / "served" / "link").symlink_to(tmp_path / "secret.json")
    for value in ("/etc/passwd", f"{tmp_path}/secret.json", f"{tmp_path}/served/../secret.json",
                  f"{tmp_path}/served/link", "~/x", "relative/outside"):
        for key in ("task.options.eval_path", "task.options.train_path", "task.options.image_root", "model.path"):
            with pytest.raises(PathRefused, match=f"{key}=.*outside the directories this demo serves"):
                O.check_overrides(f"{key}={value}", roots, "vlm")


def test_the_config_a_recipe_names_is_checked_too(tmp_path):
    roots = _roots(tmp_path)
    recipe = L.recipe_path("vlm/qwen2_5_vl_3b_counting")
    with pytest.raises(PermissionError, match="model.path=/models/Qwen2.5-VL-3B-Instruct .*--models"):
        O.check_config(recipe, [], roots, "vlm")
    O.check_config(recipe, [f"model.path='{tmp_path / 'served'}'"], roots, "vlm")  # served: accepted
    with pytest.raises(ValueError, match="plugins"):
        O.check_config(recipe, ["plugins=[x]"], roots, "vlm")  # a recipe with plugins is never started
    with pytest.raises(ValueError, match="algo.epsilon"):
        O.check_config(L.recipe_path("vlm/counting_tiny"), ["algo.epsilon=null"], roots, "vlm")


def test_start_refuses_bad_requests(tmp_path):
    launcher = L.Launcher(tmp_path, AllowedRoots([tmp_path]))
    with pytest.raises(ValueError, match="unknown recipe"):
        launcher.start("vlm/nope", "", "x")
    with pytest.raises(ValueError, match="key=value"):
        launcher.start("vlm/counting_tiny", "--foo", "x")
    for name in ("../x", "a/b", "..", ""):
        with pytest.raises(ValueError):
            launcher.start("vlm/counting_tiny", "", name)
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        launcher.start("vlm/counting_tiny", "", "taken")
    assert launcher.running() == [] and sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert launcher.status("never")["state"] == "not started"
    assert S.describe("never", launcher.status("never")) == ""  # the Launch tab shows nothing for it


def test_command_quotes_the_log_settings(tmp_path):
    cmd = L.Launcher(tmp_path, AllowedRoots([tmp_path]), python="py").command("gui/synthetic_gui_tiny",
                                                                             ["train.steps=2"], "007")
    assert cmd[:6] == ["py", "-m", "mmrl", "train", "vlm", str(L.recipe_path("gui/synthetic_gui_tiny"))]
    assert L.recipe_path("gui/synthetic_gui_tiny").is_file() and L.recipe_path("gui/synthetic_gui_tiny").is_absolute()
    assert cmd[6:] == ["train.steps=2", f"log.output_dir='{tmp_path.resolve()}'", "log.run_name='007'",
                       "log.progress=false"]


def _wait(launcher, name, until, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = launcher.status(name)
        if until(status):
            return status
        time.sleep(0.5)
    raise AssertionError(f"timed out; last status {launcher.status(name)}")


@pytest.mark.slow
def test_launch_a_real_tiny_run(tmp_path):
    launcher = L.Launcher(tmp_path, AllowedRoots([tmp_path]))
    try:
        assert launcher.start("vlm/counting_tiny", f"train.steps=2 {QUICK}", "t1") == "t1"
        with pytest.raises(ValueError, match="already running"):
            launcher.start("vlm/counting_tiny", "", "t1")
        status = _wait(launcher, "t1", lambda s: s["state"] != "running", timeout=120)
    finally:
        launcher.close()
    assert status["state"] == "finished", status["log_tail"]
    assert status["returncode"] == 0 and status["step"] == 2 and status["steps"] == 2
    assert (tmp_path / "t1" / "metrics.jsonl").is_file() and (tmp_path / "t1" / "launch.log").is_file()
    assert D.list_runs(tmp_path) == ["t1"] and R.read_summary(D.run_path(tmp_path, "t1"))["steps"] == 2
    assert launcher.stop("t1") == "finished"  # nothing to stop


@pytest.mark.slow
def test_stop_ends_a_running_run(tmp_path):
    launcher = L.Launcher(tmp_path, AllowedRoots([tmp_path]))
    try:
        launcher.start("vlm/counting_tiny", f"train.steps=500 {QUICK}", "long")
        pid = launcher._procs["long"].pid
        # Past the model loading: the first step is logged, so the run is really training.
        _wait(launcher, "long", lambda s: s["state"] != "running" or s["step"] >= 1, timeout=120)
        assert launcher.status("long")["state"] == "running" and launcher.running() == ["long"]
        assert launcher.stop("long") == "stopped"
    finally:
        launcher.close()
    status = launcher.status("long")
    assert status["state"] == "stopped" and status["returncode"] is not None
    assert launcher.running() == []
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone


@pytest.mark.slow
def test_a_start_that_fails_before_training_leaves_its_name_free(tmp_path):
    """A process that ends before training (a config or model error) leaves only its launch.log:
    the name can be used again. It ran in its own run directory."""
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\npwd\necho 'error: the model is missing'\nexit 2\n")
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    launcher = L.Launcher(runs, AllowedRoots([runs]), python=str(fake))
    launcher.start("vlm/counting_tiny", "train.steps=2", "x")
    status = _wait(launcher, "x", lambda s: s["state"] != "running", timeout=30)
    assert status["state"] == "failed" and status["returncode"] == 2
    assert status["log_tail"].splitlines() == [str((runs / "x").resolve()), "error: the model is missing"]
    assert S.describe("x", status) == "**x**: failed at step 0 (exit code 2; see the log)"
    assert launcher.start("vlm/counting_tiny", "train.steps=3", "x") == "x"  # not "already exists"
    _wait(launcher, "x", lambda s: s["state"] != "running", timeout=30)
    (runs / "trained").mkdir()
    (runs / "trained" / "launch.log").write_text("")
    (runs / "trained" / "config.yaml").write_text("train:\n  steps: 2\n")
    with pytest.raises(ValueError, match="already exists"):  # a run that started training keeps its name
        launcher.start("vlm/counting_tiny", "", "trained")


def test_run_state_and_the_status_line(tmp_path):
    run = make_run(tmp_path, "r1", steps=8)
    launcher = L.Launcher(tmp_path, AllowedRoots([tmp_path]))
    assert S.run_state(run) == "finished" and S.run_state(tmp_path / "nope") == "not started"
    (run / "summary.json").unlink()
    assert S.run_state(run) == "running"  # written a moment ago
    assert S.run_state(run, now=time.time() + S.STALE_S + 60) == "stopped"
    old = time.time() - S.STALE_S - 60
    for name in ("metrics.jsonl", "config.yaml", "checkpoints"):
        os.utime(run / name, (old, old))
    status = launcher.status("r1")
    assert status["state"] == "stopped" and (status["step"], status["steps"]) == (3, 8)
    assert S.describe("r1", status) == "**r1**: stopped at step 3 of 8, reward 1.0"
    assert S.describe("r1", {**status, "state": "running", "reward": 0.1234567}) == \
        "**r1**: running, step 3 of 8, reward 0.123"


def test_metrics_are_rounded_for_reading():
    assert S.rounded(1.1100000143051147) == 1.11 and S.rounded(0.000123456) == 0.0001235
    assert S.rounded(123456.7) == 123500.0 and S.rounded(2.0) == 2.0 and S.rounded(0.0) == 0.0
    assert S.rounded(3) == 3 and S.rounded(None) is None and S.rounded(True) is True and S.rounded("a") == "a"
    assert S.rounded(float("inf")) == float("inf")
