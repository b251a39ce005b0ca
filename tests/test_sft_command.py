"""`mmrl sft`: the loss on the assistant's tokens only (hand-built conversations, the NLL worked out
from the model's logits), what it reads as the reference completion, an exact resume, and the R1
recipe's two commands (SFT, then RL from its model)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import mmrl_here, mmrl_in_process
from test_distributed import launch_together
from mmrl.task import Task, image_prompt
from mmrl.vlm.sft import record_completion, sft_batch, sft_target


class Conversations(Task):
    """A task with hand-built conversations and no reference completions of its own: each
    example gives its answer as a chat (``messages``) or a ``solution``."""

    name = "conversations"

    def prompt(self, ex):
        return image_prompt(ex["image"], ex["question"])


def _images():
    from mmrl.registry import TASKS, load_plugins

    load_plugins()
    split = TASKS.get("counting")().examples("train")
    return split[0]["image"], split[1]["image"]


def _conversations():
    a, b = _images()
    return [
        {"image": a, "question": "How many shapes?",
         "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many shapes?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "<answer>3</answer>"}]}]},
        {"image": b, "question": "What colour is the circle?",
         "solution": "<think>I look at the circle.</think><answer>red</answer>"},
    ]


@pytest.fixture(scope="module")
def policy(random_tiny_dir):
    from mmrl.config import load_config
    from mmrl.vlm.policy import VLMPolicy

    return VLMPolicy(load_config(None, [f"model.path={random_tiny_dir}", "train.device=cpu",
                                        "train.micro_batch_size=1"]))


def test_the_reference_completion_is_the_tasks_target_else_the_records_own():
    from mmrl.registry import TASKS, load_plugins

    load_plugins()
    counting = TASKS.get("counting")()
    ex = {**counting.examples("train")[0], "solution": "<answer>99</answer>"}
    assert sft_target(counting, ex) == counting.target(ex)  # the task's layout wins
    a, b = _conversations()
    assert sft_target(Conversations(), a) == "<answer>3</answer>"  # the chat's last (assistant) turn
    assert sft_target(Conversations(), b) == "<think>I look at the circle.</think><answer>red</answer>"
    assert record_completion({"messages": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "4"}]}) == "4"
    # a chat that ends with the user's turn has no completion, nor has a record without one
    chat = [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    assert record_completion({"messages": chat}) is None
    with pytest.raises(ValueError, match="'messages'.*'solution'.*keys: image, question"):
        sft_target(Conversations(), {"image": None, "question": "q"})


def test_the_mask_covers_exactly_the_answer_tokens_and_eos(policy):
    """Two hand-built conversations of different lengths: each completion is the tokenized
    assistant text + EOS and the action mask is 1 on exactly those slots, 0 on the padding; the
    prompt (the chat up to the assistant's turn) is context, never an action."""
    examples = _conversations()
    batch = sft_batch(policy, [Conversations()], [(0, ex) for ex in examples])
    tok = policy.tokenizer
    texts = ["<answer>3</answer>", "<think>I look at the circle.</think><answer>red</answer>"]
    expected = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    lengths = [len(e) for e in expected]
    assert lengths[0] != lengths[1]  # so one row has padding
    assert batch.action_mask.shape == (2, max(lengths))
    for i, ids in enumerate(expected):
        assert batch.payload["completion_ids"][i].tolist() == ids
        assert batch.action_mask[i].tolist() == [1.0] * len(ids) + [0.0] * (max(lengths) - len(ids))
        prompt = tok.decode(batch.payload["prompt_ids"][i])
        assert prompt.endswith("<|im_start|>assistant\n")  # the prompt stops where the answer starts
        assert texts[i] not in prompt and examples[i]["question"] in prompt


def test_the_loss_is_the_mean_nll_of_the_answer_tokens(policy):
    """The loss ``policy.train_step`` minimises equals the mean NLL worked out from the model's
    logits on each conversation alone (no padding): at position P + t - 1 the log-softmax of the
    logits (the vision placeholders masked out of the vocabulary, as the policy samples) at
    completion token t, summed over both answers' tokens + EOS, divided by their count."""
    from mmrl.core.losses import Objective, ObjectiveConfig

    batch = sft_batch(policy, [Conversations()], [(0, ex) for ex in _conversations()])
    batch.advantages = torch.zeros(2)
    tokens = float(batch.action_mask.sum())
    objective = Objective(ObjectiveConfig.reference_likelihood())  # mmrl sft's objective
    with policy.autocast():  # micro_batch_size 1: two terms, which add up to the mini-batch loss
        terms = [loss for loss, _ in policy.loss_terms(batch, objective, num_tokens=tokens, num_seqs=2.0)]
    assert len(terms) == 2
    loss = float(sum(terms).detach())

    nll, count = 0.0, 0
    with torch.no_grad():
        for i in range(2):
            p, c = batch.payload["prompt_ids"][i], batch.payload["completion_ids"][i]
            ids = torch.cat([p, c])[None]
            logits = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  mm_token_type_ids=policy.processor.token_types(ids),  # image tokens' 3-D positions
                                  pixel_values=batch.payload["pixel_values"][i],
                                  image_grid_thw=batch.payload["image_grid_thw"][i]).logits[0].double()
            logits[:, policy.suppressed_ids] = float("-inf")
            logp = torch.log_softmax(logits, dim=-1)
            for t in range(len(c)):
                nll -= float(logp[len(p) + t - 1, c[t]])
                count += 1
    assert count == tokens  # the answer tokens + EOS of both rows
    assert abs(loss - nll / count) < 1e-5, (loss, nll / count)


def _sft_config(path, out, *extra):
    from mmrl.vlm.sft_run import sft_config

    return sft_config("vlm/counting_tiny", [
        f"model.path={path}", "train.device=cpu", "train.prompts_per_step=4", "train.micro_batch_size=4",
        "train.learning_rate=3e-3", "train.warmup_steps=0", "eval.num_examples=4", "eval.before=false",
        f"log.output_dir={out}", "log.run_name=warm", "log.progress=false", "log.tensorboard=false", *extra])


# The tiny models' warm-start shape: a mixture holding one task twice (two option sets), drawn by
# weight with replacement, a quarter of the references without their <think> block, a schedule
# whose horizon lies past the run.
WEIGHTED_MIXTURE = ("task.name=mixture",
                    'task.options={"tasks": {"color": {"task": "counting", "query": "color"}, '
                    '"shape": {"task": "counting", "query": "shape"}, "grounding": {}}}',
                    "data.sampler=weighted", 'data.sampler_kwargs={"weights": {"color": 3, "shape": 1, "grounding": 1}}',
                    "data.thought_dropout=0.25", "train.lr_scheduler_type=linear_horizon",
                    'train.lr_scheduler_kwargs={"decay_steps": 8, "min_lr_rate": 0.05}', "train.warmup_steps=2")


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [(), WEIGHTED_MIXTURE], ids=["uniform", "weighted-mixture"])
def test_a_resumed_sft_run_ends_with_the_weights_of_an_uninterrupted_one(random_tiny_dir, tmp_path, sampling):
    """4 steps in one go, and 4 steps whose last 2 are run again from the step-2 checkpoint (the
    data order, the weighted sampler's random state, the dropped thoughts, the seeds, the optimizer
    and the schedule are restored): the same weights."""
    from safetensors.torch import load_file

    from mmrl.vlm.sft_run import SFTRun

    SFTRun(_sft_config(random_tiny_dir, tmp_path / "a", "train.steps=4", "log.save_every=0", *sampling)).run()
    SFTRun(_sft_config(random_tiny_dir, tmp_path / "b", "train.steps=4", "log.save_every=2", *sampling)).run()
    import shutil

    run = tmp_path / "b" / "warm"
    shutil.rmtree(run / "checkpoints" / "step_00000004")
    (run / "checkpoints" / "latest").write_text("step_00000002\n")
    shutil.rmtree(run / "model")
    result = SFTRun(_sft_config(random_tiny_dir, tmp_path / "b", "train.steps=4", "log.save_every=2",
                                "resume=true", *sampling)).run()
    a = load_file(tmp_path / "a" / "warm" / "model" / "model.safetensors")
    b = load_file(result.model_dir / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 4]  # steps 3-4 logged once: the killed attempt's lines were dropped


@pytest.mark.slow
def test_a_checkpoint_of_mmrl_sft_is_not_resumed_by_mmrl_train(random_tiny_dir, tmp_path):
    """Both commands run the one lifecycle and each checkpoint says which wrote it: an SFT run
    resumed as RL stops at setup, naming the checkpoint and the command that continues it."""
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy
    from mmrl.vlm.sft_run import SFTRun

    SFTRun(_sft_config(random_tiny_dir, tmp_path, "train.steps=1", "eval.num_examples=1")).run()
    cfg = _sft_config(random_tiny_dir, tmp_path, "train.steps=2", "eval.num_examples=1", "resume=true",
                      "allow_config_change=true")
    with pytest.raises(ValueError, match=r"warm/checkpoints/step_00000001 is a checkpoint of mmrl sft, not of "
                                         r"mmrl train: resume it with mmrl sft"):
        Trainer(cfg, VLMPolicy(cfg))


@pytest.mark.slow
def test_a_checkpoint_written_before_the_shared_lifecycle_still_resumes(random_tiny_dir, tmp_path):
    """mmrl sft checkpoints written before RL and SFT shared one lifecycle store the held-out loss
    before training as a number and mark themselves "sft": True (no "kind"). Such a checkpoint
    resumes under mmrl sft, its before-loss kept, and mmrl train still refuses it."""
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy
    from mmrl.vlm.sft_run import SFTRun

    first = SFTRun(_sft_config(random_tiny_dir, tmp_path, "train.steps=1", "eval.num_examples=1",
                               "eval.before=true")).run()
    state_path = tmp_path / "warm" / "checkpoints" / "step_00000001" / "trainer.pt"
    state = torch.load(state_path, weights_only=False)
    state.pop("kind")
    state.pop("before_intervals", None)
    state.update(before=first.before, sft=True)  # the earlier layout
    torch.save(state, state_path)
    cfg = _sft_config(random_tiny_dir, tmp_path, "train.steps=2", "eval.num_examples=1", "eval.before=true",
                      "resume=true", "allow_config_change=true")
    with pytest.raises(ValueError, match="is a checkpoint of mmrl sft, not of mmrl train"):
        Trainer(cfg, VLMPolicy(cfg))
    resumed = SFTRun(cfg).run()
    assert first.before is not None and resumed.before == first.before
    assert torch.load(tmp_path / "warm" / "checkpoints" / "step_00000002" / "trainer.pt",
                      weights_only=False)["kind"] == "sft"


@pytest.mark.slow
def test_an_sft_resume_says_where_cleans_a_killed_save_and_refuses_fewer_steps(random_tiny_dir, tmp_path):
    """As RL's: killed after logging its final evaluation (no summary.json) and with a killed save's
    .tmp directory (its writer's process gone), `mmrl sft ... resume=true` says where it continues,
    removes the half-written checkpoint and logs the evaluation once; train.steps below the
    checkpoint's step is one line, exit code 2."""
    args = ["sft", "vlm/counting_tiny", f"model.path={random_tiny_dir}", "train.device=cpu", "train.steps=2",
            "train.prompts_per_step=4", "train.micro_batch_size=4", "eval.num_examples=4", "eval.before=false",
            "log.output_dir=runs", "log.run_name=warm", "log.progress=false", "log.tensorboard=false"]
    mmrl_here(*args, cwd=tmp_path)
    run = tmp_path / "runs" / "warm"
    (run / "summary.json").unlink()
    writer = subprocess.Popen([sys.executable, "-c", "pass"])
    writer.wait()
    stale = run / "checkpoints" / f".tmp-step_00000003-{writer.pid}"
    (stale / "policy").mkdir(parents=True)
    r = mmrl_here(*args, "resume=true", cwd=tmp_path)
    assert "resuming runs/warm from step 2 of 2" in r.stdout and not stale.exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "eval/loss" in row] == [2] and [row["step"] for row in rows] == [1, 2, 2]
    r = mmrl_in_process(*args, "train.steps=1", "resume=true", "allow_config_change=true", cwd=tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "error: runs/warm/checkpoints/step_00000002 is at step 2, past train.steps=1: to continue the run, " \
           "resume with train.steps=2 or more" in err


@pytest.mark.slow
def test_sft_lowers_held_out_loss_then_rl_starts_from_its_model(random_tiny_dir, tmp_path, monkeypatch):
    """The R1 recipe as two commands: `mmrl sft` on the counting task's reference answers lowers
    the held-out loss, and `mmrl train vlm model.path=<its model>` trains from what it wrote."""
    monkeypatch.chdir(tmp_path)
    r = mmrl_here("sft", "vlm/counting_tiny", f"model.path={random_tiny_dir}", "train.device=cpu", "train.steps=8",
                   "train.prompts_per_step=8", "train.micro_batch_size=8", "train.learning_rate=3e-3",
                   "train.warmup_steps=0", "eval.num_examples=8", "log.output_dir=runs", "log.run_name=warm",
                   "log.progress=false", "log.save_every=4")
    run = tmp_path / "runs" / "warm"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["after"]["loss"] < summary["before"]["loss"] - 0.5, summary
    assert f"model: {run.relative_to(tmp_path) / 'model'}" in r.stdout
    assert "held-out loss (counting, 8 examples)" in r.stdout
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == list(range(1, 9))
    assert (run / "checkpoints" / "step_00000008" / "policy").is_dir()

    mmrl_here("train", "vlm", f"model.path={run / 'model'}", "train.device=cpu", "train.steps=1",
               "train.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_completion_length=6",
               "eval.num_examples=2", "eval.pass_k=0", "log.output_dir=runs", "log.run_name=rl", "log.progress=false")
    config = (tmp_path / "runs" / "rl" / "config.yaml").read_text()
    assert str(run / "model") in config
    assert (tmp_path / "runs" / "rl" / "checkpoints" / "step_00000001").is_dir()


@pytest.mark.slow
def test_sft_on_two_processes_ends_with_the_weights_of_one(random_tiny_dir, tmp_path):
    """`mmrl sft` on 2 CPU processes (torchrun's environment, forked: test_distributed.launch_together;
    gloo, accelerate's DDP): each rank trains on its
    half of every batch, the loss normalised by the whole batch's tokens, so the model it writes
    is the one-process model's (to float rounding) and so is the held-out loss it prints."""
    from safetensors.torch import load_file

    common = ["sft", "vlm/counting_tiny", f"model.path={random_tiny_dir}", "train.device=cpu", "train.steps=3",
              "train.prompts_per_step=4", "train.micro_batch_size=1", "train.learning_rate=3e-3",
              "train.warmup_steps=0", "eval.num_examples=4", "log.progress=false", "log.tensorboard=false",
              "log.run_name=r", "train.threads=1"]
    one, two = launch_together((1, [*common, "log.output_dir=one"], None), (2, [*common, "log.output_dir=two"], None),
                               module="mmrl.cli", cwd=tmp_path)
    a = load_file(tmp_path / "one" / "r" / "model" / "model.safetensors")
    b = load_file(tmp_path / "two" / "r" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    losses = [json.loads((tmp_path / d / "r" / "summary.json").read_text())["after"]["loss"] for d in ("one", "two")]
    assert abs(losses[0] - losses[1]) < 1e-5
    assert two.stdout.count("held-out loss") == 1  # rank 0 alone prints
