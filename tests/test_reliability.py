"""Faults a long run meets, injected on the random tiny model: non-finite gradients (skipped,
logged, K in a row stop the run with its last good weights), out of memory (the micro-batch
halves and the step completes with the same gradient), resumes that would change the config, and
data whose targets cannot be trained on (skipped and counted)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.registry import TASKS


def _policy(path, *extra):
    from mmrl.vlm.policy import VLMPolicy

    cfg = make_config(f"model.path={path}", "train.device=cpu", "task.name=counting", "rollout.max_completion_length=6",
                      "train.learning_rate=1e-3", "train.micro_batch_size=6", *extra)
    policy = VLMPolicy(cfg)
    policy.configure_optimizer(cfg.train, 10)
    policy.begin_step(1)
    return policy


def _batch(policy, n_prompts: int = 2, n: int = 3):
    task = TASKS.get("counting")()
    examples = policy.prepare_examples([task.examples("train")[i] for i in range(n_prompts)])
    torch.manual_seed(0)
    batch = policy.rollout(examples, [task.build_prompt(ex) for ex in examples], n, "train")
    batch.advantages = torch.tensor([1.0, -1.0, 0.5] * n_prompts)[: len(batch)]
    return batch


def _step(policy, batch):
    return policy.train_step(batch, Objective(ObjectiveConfig.from_algo(policy.cfg.algo)),
                             num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))


def _weights(policy):
    return [p.detach().clone() for p in policy.trainable_parameters()]


def test_a_non_finite_gradient_is_not_applied_and_names_its_layer(random_tiny_dir):
    policy = _policy(random_tiny_dir)
    batch = _batch(policy)
    name, param = next((n, p) for n, p in policy.module.named_parameters() if "layers.1.mlp" in n and p.requires_grad)
    hook = param.register_hook(lambda g: g * float("nan"))
    before = _weights(policy)
    metrics = _step(policy, batch)
    assert metrics["skipped_update"] == 1.0 and name in policy.last_skip_cause
    assert all(torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters()))
    assert all(p.grad is None for p in policy.trainable_parameters())  # nothing carried to the next step
    hook.remove()
    metrics = _step(policy, batch)
    assert metrics["skipped_update"] == 0.0 and policy.last_skip_cause is None
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters()))


@pytest.mark.slow
def test_a_non_finite_loss_is_named_as_such(random_tiny_dir, monkeypatch):
    policy = _policy(random_tiny_dir)
    terms = policy.loss_terms

    def nan_terms(*args, **kwargs):
        for loss, metrics in terms(*args, **kwargs):
            yield loss * float("inf"), {**metrics, "loss": float("inf")}

    monkeypatch.setattr(policy, "loss_terms", nan_terms)
    assert _step(policy, _batch(policy))["skipped_update"] == 1.0
    assert policy.last_skip_cause == "the loss is inf"


@pytest.mark.slow
def test_out_of_memory_halves_the_micro_batch_and_gives_the_same_step(random_tiny_dir, monkeypatch):
    """A forward of more than 2 samples "runs out of memory": the step completes at micro-batch 1
    (6 -> 3 -> 1), keeps that size, and updates the weights exactly as a run at micro-batch 1 does."""
    reference = _policy(random_tiny_dir, "train.micro_batch_size=1")
    batch = _batch(reference)
    _step(reference, batch)
    policy = _policy(random_tiny_dir)
    terms, sizes = policy.loss_terms, []

    def tight_memory(*args, **kwargs):
        for term in terms(*args, **kwargs):
            sizes.append(policy.micro_batch_size)
            if policy.micro_batch_size > 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            yield term

    monkeypatch.setattr(policy, "loss_terms", tight_memory)
    metrics = _step(policy, batch)
    assert sizes[:2] == [6, 3] and policy.micro_batch_size == 1 and metrics["skipped_update"] == 0.0
    for a, b in zip(reference.trainable_parameters(), policy.trainable_parameters()):
        assert torch.allclose(a, b, atol=1e-6), "the backed-off step differs from the micro-batch-1 step"


@pytest.mark.slow
def test_the_micro_batch_grows_back_after_oom_grow_back_steps_steps_that_fit(random_tiny_dir, monkeypatch):
    """One odd step runs out of memory above 2 samples per forward (6 -> 3 -> 1); with
    train.oom_grow_back_steps=2 the size doubles after every two steps that fit, back to 6."""
    policy = _policy(random_tiny_dir, "train.oom_grow_back_steps=2")
    batch, terms, tight = _batch(policy), policy.loss_terms, [True]

    def odd_step(*args, **kwargs):
        for term in terms(*args, **kwargs):
            if tight[0] and policy.micro_batch_size > 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            yield term

    monkeypatch.setattr(policy, "loss_terms", odd_step)
    sizes = []
    for _ in range(6):
        _step(policy, batch)
        tight[0] = False
        sizes.append(policy.micro_batch_size)
    assert sizes == [1, 2, 2, 4, 4, 6]


def test_out_of_memory_at_one_sample_stops_with_the_numbers(random_tiny_dir, monkeypatch):
    policy = _policy(random_tiny_dir)

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        yield  # a generator, like the real one

    monkeypatch.setattr(policy, "loss_terms", no_memory)
    with pytest.raises(RuntimeError, match="one sample per forward \\(6 samples"):
        _step(policy, _batch(policy))
    with pytest.raises(ValueError, match="not memory"):  # other errors pass through untouched
        monkeypatch.setattr(policy, "loss_terms", lambda *a, **k: (_ for _ in ()).throw(ValueError("not memory")))
        _step(policy, _batch(policy))


def _run_cfg(path, out, steps, *extra):
    return make_config(f"model.path={path}", "train.device=cpu", f"train.steps={steps}", "train.prompts_per_step=2",
                       "rollout.num_generations=2", "rollout.max_completion_length=6", "eval.num_examples=2",
                       "eval.pass_k=0", "eval.before=false", f"log.output_dir={out}", "log.run_name=run",
                       "log.save_every=1", "log.save_rollouts_every=1", "log.progress=false", *extra)


@pytest.mark.slow
def test_consecutive_skipped_steps_stop_the_run_with_the_last_good_weights(random_tiny_dir, tmp_path, monkeypatch):
    """NaN gradients at steps 2 and 3: both skipped and logged; with the limit at 2 the run
    stops at step 3 with a checkpoint whose weights are step 1's."""
    from mmrl.core.trainer import NonFiniteTrainingError, Trainer
    from mmrl.vlm.policy import VLMPolicy

    cfg = _run_cfg(random_tiny_dir, tmp_path, 5, "train.max_consecutive_skipped_steps=2", "log.save_total_limit=3")
    policy = VLMPolicy(cfg)
    trainer = Trainer(cfg, policy)
    step_of = trainer.rollout_step
    param = next(p for n, p in policy.module.named_parameters() if "lm_head" in n or "embed_tokens" in n)
    hooks = []

    def rollout_step(step):
        if step == 2:
            hooks.append(param.register_hook(lambda g: g * float("nan")))
        return step_of(step)

    monkeypatch.setattr(trainer, "rollout_step", rollout_step)
    with pytest.raises(NonFiniteTrainingError, match="2 steps in a row"):
        trainer.train()
    run = tmp_path / "run"
    skips = [json.loads(line) for line in (run / "skipped_steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in skips] == [2, 3] and "not finite" in skips[0]["causes"][0]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"reward"' in line]
    assert [r["skipped_update"] for r in rows] == [0.0, 1.0, 1.0]
    saved = torch.load(run / "checkpoints" / "step_00000003" / "trainer.pt", weights_only=False)
    assert saved["step"] == 3
    from safetensors.torch import load_file

    def weights(step):
        return load_file(str(run / "checkpoints" / f"step_{step:08d}" / "policy" / "model" / "model.safetensors"))

    w1, w3 = weights(1), weights(3)
    assert all(torch.equal(w1[k], w3[k]) for k in w1)  # the skipped steps changed nothing


@pytest.mark.slow
def test_a_resume_drops_later_rollouts_and_refuses_another_task(random_tiny_dir, tmp_path):
    from mmrl.core.trainer import Trainer
    from mmrl.runs.config_history import ConfigChangeError
    from mmrl.vlm.policy import VLMPolicy

    cfg = _run_cfg(random_tiny_dir, tmp_path, 2)
    Trainer(cfg, VLMPolicy(cfg)).train()
    run = tmp_path / "run"
    (run / "checkpoints" / "latest").write_text("step_00000001")  # as if killed after step 2's rollouts
    with pytest.raises(ConfigChangeError, match="another task.name"):
        bad = _run_cfg(random_tiny_dir, tmp_path, 2, "resume=true", "allow_config_change=true", "task.name=grounding")
        Trainer(bad, VLMPolicy(bad))
    again = _run_cfg(random_tiny_dir, tmp_path, 2, "resume=true", "log.save_rollouts_every=0")
    Trainer(again, VLMPolicy(again)).train()
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step_000001"]  # step 2's were re-run
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if '"reward"' in line]
    assert steps == [1, 2]


def test_boxes_that_cannot_be_targets_are_skipped_and_counted(tmp_path):
    from PIL import Image

    Image.new("RGB", (100, 80)).save(tmp_path / "a.png")
    records = [{"image": "a.png", "question": "q", "answer": box} for box in
               ([10, 10, 50, 40], [1e300, -1e300, 1e308, 5], [50, 50, 10, 10], [10, 10, 150, 40], [20, 20, 60, 70])]
    (tmp_path / "rec.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    examples = TASKS.get("grounding")(train_path=str(tmp_path / "rec.jsonl")).examples("train")
    got = [examples[i]["box"] for i in range(len(examples))]
    assert set(got) == {(10.0, 10.0, 50.0, 40.0), (20.0, 20.0, 60.0, 70.0)}
    reasons = list(examples.bad_targets.values())
    assert len(reasons) == 3 and examples.stats()["bad_targets"] == 3
    assert any("inverted" in r for r in reasons) and any("outside the 100x80 image" in r for r in reasons)
    # a split with no usable target stops the run at setup, before any training
    (tmp_path / "bad.jsonl").write_text(json.dumps(records[2]) + "\n")
    from mmrl.core.run_checks import check_eval_split

    task = TASKS.get("grounding")(train_path=str(tmp_path / "rec.jsonl"), eval_path=str(tmp_path / "bad.jsonl"))
    with pytest.raises(ValueError, match="eval split of task 'grounding' is unusable.*inverted"):
        check_eval_split(task)


def test_a_segment_outside_its_clip_is_skipped(tmp_path):
    from test_video_reader import write_clip
    from mmrl.tasks.temporal_grounding import check_segment_in_clip
    from mmrl.data.records import BadRecord

    assert check_segment_in_clip({"segment": (1.0, 3.2), "video_duration": 3.0})["segment"] == (1.0, 3.2)
    with pytest.raises(BadRecord, match="outside the 3 s clip"):
        check_segment_in_clip({"segment": (1.0, 9.0), "video_duration": 3.0})
    write_clip(tmp_path / "c.mp4", frames=30, fps=10)  # 3 s
    rows = [{"video": "c.mp4", "sentence": "s", "start": 0.5, "end": 2.0},
            {"video": "c.mp4", "sentence": "s", "start": 4.0, "end": 6.0}]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = TASKS.get("temporal_grounding")(train_path=str(tmp_path / "g.jsonl")).examples("train")
    assert {examples[i]["segment"] for i in range(2)} == {(0.5, 2.0)} and len(examples.bad_targets) == 1


def test_a_click_off_its_screenshot_is_skipped():
    from mmrl.data.gui_steps import StepExamples
    from mmrl.media.coords import box_problem, point_problem

    assert point_problem([5, 5], 10, 10) is None and "outside" in point_problem([50, 5], 10, 10)
    assert "finite" in point_problem([float("nan"), 1], 10, 10) and box_problem([1, 1, 5, 5], 10, 10) is None
    import tempfile
    from pathlib import Path

    from PIL import Image

    with tempfile.TemporaryDirectory() as d:
        Image.new("RGB", (40, 30)).save(Path(d) / "s.png")
        steps = [{"image": str(Path(d) / "s.png"), "action": {"action": "click", "point": p}, "source_episode": "e",
                  "step_index": k} for k, p in enumerate(([10, 10], [400, 10]))]
        examples = StepExamples(steps)
        assert [examples[i]["action"]["point"] for i in range(2)] == [[10, 10], [10, 10]]
        assert list(examples.bad_targets) == ["e step 1"] and examples.stats()["bad_targets"] == 1


@pytest.mark.slow
def test_evaluation_scores_each_usable_clip_once_and_counts_the_skipped(tmp_path):
    """The issue's case: 8 Charades-STA lines, 2 of whose clips are corrupt. Training's indexing
    still moves on to the next clip; evaluation scores the 6 usable clips once each (before, one
    of them stood in for a bad one and was scored twice) and reports the 2 skipped."""
    from test_video_reader import write_clip

    from mmrl.core.evaluation import usable_share

    write_clip(tmp_path / "GOOD.mp4", frames=30, fps=10)
    for name in ("BAD1", "BAD2"):
        (tmp_path / f"{name}.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 but no video after this")
    videos = ["GOOD", "GOOD", "BAD1", "GOOD", "GOOD", "BAD2", "GOOD", "GOOD"]
    lines = [f"{v} 0.5 1.{k} ##person does thing {k}." for k, v in enumerate(videos)]
    (tmp_path / "charades_sta_test.txt").write_text("\n".join(lines) + "\n")
    task = TASKS.get("temporal_grounding")(train_path=str(tmp_path / "charades_sta_test.txt"),
                                            eval_path=str(tmp_path / "charades_sta_test.txt"))
    examples = task.examples("eval")
    assert examples[2]["question"] == examples[3]["question"]  # training: the next clip stands in
    picked, positions, skipped = usable_share(examples, 8)
    sentences = [ex["question"] for ex in picked]
    assert sentences == [f"When does this happen: person does thing {k}?" for k in (0, 1, 3, 4, 6, 7)]
    assert positions == list(range(6)) and skipped == 2
    assert examples.stats() == {"examples": 8, "skipped_lines": 0, "bad_images": 2, "bad_targets": 0}
    # with enough clips, the first n usable are taken: n = 4 reads 5 lines, skipping one
    picked, positions, skipped = usable_share(examples, 4)
    assert [ex["question"][-2:] for ex in picked] == ["0?", "1?", "3?", "4?"] and skipped == 1


def test_skips_go_to_the_run_record_per_split(tmp_path):
    """SkipRecord: each split's counts as ``data/<split>/<count>`` metrics (non-numbers left
    out), and summary.json's ``data``, the train split's with the rollout time-outs of
    metrics.jsonl summed."""
    from mmrl.core.skip_record import SkipRecord
    from mmrl.data.sequence import LazySequence

    class Counted(LazySequence):
        def __init__(self, counts):
            self.counts = counts

        def __len__(self):
            return self.counts["examples"]

        def item(self, i):
            return {}

        def stats(self):
            return dict(self.counts)

    train = Counted({"examples": 5, "skipped_lines": 2, "bad_images": 0, "bad_targets": 1, "sources": {"a": {}}})
    skips = SkipRecord({"train": train, "eval": [{"image": None}] * 3})
    logged = []
    skips.with_counts(lambda step, metrics: logged.append((step, metrics)))(4, {"reward": 0.5})
    assert logged == [(4, {"reward": 0.5, "data/train/examples": 5.0, "data/train/skipped_lines": 2.0,
                           "data/train/bad_images": 0.0, "data/train/bad_targets": 1.0,
                           "data/eval/examples": 3.0})]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(row) + "\n" for row in
                               ({"step": 1, "rollout_timeouts": 2.0}, {"step": 2, "rollout_timeouts": 1.0},
                                {"step": 2, "eval/reward": 0.1})))
    assert skips.summary(metrics) == {
        "train": {"examples": 5, "skipped_lines": 2, "bad_images": 0, "bad_targets": 1, "sources": {"a": {}},
                  "rollout_timeouts": 3.0},
        "eval": {"examples": 3}}


def test_a_full_disk_is_an_oserror_naming_the_path_whichever_library_wrote(tmp_path, monkeypatch):
    """A full disk as each library reports it (the messages recorded on a full tmpfs, torch 2.14.1,
    safetensors 0.8.0, 2026-12-06): Python's OSError (whose write error names no file), safetensors'
    SafetensorError and torch's zip writer's RuntimeError each come out as OSError(ENOSPC) naming
    the path given; torch's, which names no cause, only when the disk has (nearly) no room left.
    The message says what to do and how to continue."""
    import errno

    from safetensors import SafetensorError

    import mmrl.runs.disk as disk
    from mmrl.runs.disk import disk_message, naming_disk_errors
    from mmrl.runs.logging import RunLogger

    path = str(tmp_path / "checkpoints" / "step_00000002")
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    for error in (OSError(errno.ENOSPC, "No space left on device"),
                  SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")):
        with pytest.raises(OSError) as info, naming_disk_errors(path):
            raise error
        assert info.value.errno == errno.ENOSPC and info.value.filename == path and info.value.__cause__ is error
    with pytest.raises(RuntimeError), naming_disk_errors(path):  # tmp_path's disk has room: not said to be full
        raise torch_error
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: type("Usage", (), {"free": 4096})())
    with pytest.raises(OSError) as info, naming_disk_errors(path):
        raise torch_error
    assert info.value.errno == errno.ENOSPC and info.value.filename == path
    assert disk_message(info.value, "mmrl train --resume runs/x") == (
        f"the disk is full: cannot write {path} (No space left on device); free space on it, or set "
        "log.output_dir to a disk with room (every checkpoint written is complete, nothing saved is lost); then "
        "continue with: mmrl train --resume runs/x")
    for other in (ValueError("not a disk"), OSError(errno.ENOENT, "No such file or directory", "elsewhere")):
        with pytest.raises(type(other)) as info, naming_disk_errors(path):  # anything else passes unchanged
            raise other
        assert info.value is other

    class FullFile:  # what open(..., "a") gives on a full disk: writes and flushes fail, naming no file
        def write(self, *text):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = write

    logger = RunLogger(tmp_path, tensorboard=False)
    logger._file = FullFile()
    for call in (lambda: logger.log(1, {"reward": 1.0}), logger.close):
        with pytest.raises(OSError) as info:  # the line, then the flush of what stayed in the buffer
            call()
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "metrics.jsonl")


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_and_the_run_resumes(random_tiny_dir, tmp_path, monkeypatch):
    """The disk fills while step 2's checkpoint is written (torch.save raises OSError(ENOSPC), as
    Python's writes do): one line naming the checkpoint, what to do and the resume command, exit
    code 2; step 1's checkpoint is intact, no half-written one is left, and the run resumes."""
    import errno

    from conftest import CLI_RUN, mmrl_in_process

    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if "step_00000002" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    common = ("train", "vlm", f"model.path={random_tiny_dir}", *CLI_RUN, "train.steps=3", "log.save_every=1",
              "eval.before=false", "log.run_name=full")
    r = mmrl_in_process(*common, cwd=tmp_path)
    monkeypatch.undo()
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert ("error: the disk is full: cannot write runs/full/checkpoints/step_00000002 (No space left on device); "
            "free space on it, or set log.output_dir to a disk with room (every checkpoint written is complete, "
            "nothing saved is lost); then continue with: mmrl train --resume runs/full") in err
    checkpoints = tmp_path / "runs" / "full" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_00000001"]
    r = mmrl_in_process("train", "--resume", "runs/full", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming runs/full from step 1 of 3" in r.stdout
    rows = [json.loads(line) for line in (tmp_path / "runs" / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "reward" in row] == [1, 2, 3]
