"""pass@k: the estimator on hand-worked numbers, and ``eval.pass_k`` through the held-out evaluation
(the report leads with the task metric; sampling for pass@k leaves a generator's training state alone)."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.core.evaluation import evaluate
from mmrl.core.reward_computer import make_reward_computer
from mmrl.core.rollouts import Rollouts
from mmrl.measures.pass_at_k import mean_pass_at_k, pass_at_k
from mmrl.registry import TASKS, load_plugins


def test_the_unbiased_estimator_on_hand_worked_counts():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the share of correct samples; no correct sample: 0; all correct: 1
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    # n=k: any correct sample solves the example
    assert pass_at_k(4, 1, 4) == 1.0
    # n - c < k: every draw of k holds a correct one
    assert pass_at_k(5, 4, 2) == 1.0
    # mean over examples: (0 + 1 + 1) / 3 at k=2 for counts 0, 1, 2 of 2
    assert mean_pass_at_k([[False, False], [True, False], [True, True]], 2) == pytest.approx(2 / 3)
    assert mean_pass_at_k([[False, False], [True, False], [True, True]], 1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


class ScriptedPolicy:
    """Answers held-out counting examples by script: greedy ("eval") always wrong; sampled
    ("sample") sample j of example i right iff j < i, so example i has min(i, k) right of k."""

    def __init__(self, task):
        self.task, self.modes = task, []

    def prepare_examples(self, examples):
        return list(examples)

    def rollout(self, examples, prompts, n, mode, need_old_logps=False, need_ref_logps=False):
        self.modes.append(mode)
        completions, rows = [], []
        for i, ex in enumerate(examples):
            for j in range(n):
                right = mode == "sample" and j < i
                completions.append(self.task.target(ex) if right else "<think>none</think><answer>-1</answer>")
                rows.append(ex)
        return Rollouts(group_ids=torch.arange(len(examples)).repeat_interleave(n),
                        action_mask=torch.ones(len(rows), 1), completions=completions, examples=rows)


def test_evaluate_reports_pass_at_k_and_leads_with_the_task_metric():
    load_plugins()
    cfg = make_config("eval.pass_k=4", "eval.num_examples=3")
    task = TASKS.get("counting")()
    policy = ScriptedPolicy(task)
    out = evaluate(policy, task, make_reward_computer(task, cfg.task), cfg)
    assert policy.modes == ["eval", "sample"]
    # right samples per example: 0, 1, 2 of 4
    assert out["pass@1"] == pytest.approx((0 + 1 / 4 + 2 / 4) / 3)
    assert out["pass@4"] == pytest.approx(2 / 3)
    assert out["accuracy"] == 0.0  # the greedy answers
    keys = list(out)
    assert keys[0] == "accuracy" and keys.index("pass@4") < keys.index("reward")

    off = evaluate(ScriptedPolicy(task), task, make_reward_computer(task, cfg.task), make_config("eval.num_examples=3"))
    assert not any(k.startswith("pass@") for k in off)
    with pytest.raises(ValueError, match="eval.pass_k=-1"):
        evaluate(ScriptedPolicy(task), task, make_reward_computer(task, cfg.task),
                 make_config("eval.pass_k=-1", "eval.num_examples=3"))


def test_success_follows_each_tasks_metric():
    load_plugins()
    counting, grounding = TASKS.get("counting")(), TASKS.get("grounding")()
    ex = counting.examples("eval")[0]
    assert counting.success(counting.target(ex), ex) is True
    assert counting.success("<answer>-1</answer>", ex) is False
    gex = grounding.examples("eval")[0]
    assert grounding.success(grounding.target(gex), gex) is True  # IoU 1 >= 0.5
    mixture = TASKS.get("mixture")(tasks={"counting": {}, "grounding": {}})
    mex = mixture.examples("eval")[1]
    assert mixture.success(mixture.target(mex), mex) is True


def test_sampling_for_pass_at_k_leaves_a_generators_training_draws_alone(tmp_path):
    """A generator samples k images per prompt from k initial noises with the eval sampler; its
    training call counter (which seeds the next training rollout) does not move."""
    from mmrl.diffusion.policy import DiffusionPolicy
    from mmrl.diffusion.tiny import new_tiny_models, save_tiny

    load_plugins()
    path = save_tiny(tmp_path / "gen", *new_tiny_models(seed=0, width=32, layers=1))
    cfg = make_config(f"model.path={path}", "train.device=cpu", "task.name=composition", "diffusion.num_steps=3",
                      "diffusion.eval_num_steps=2", "eval.pass_k=3", "eval.num_examples=2", "eval.before=false")
    policy = DiffusionPolicy(cfg)
    policy.begin_step(1)
    task = TASKS.get("composition")()
    calls = policy._calls
    out = evaluate(policy, task, make_reward_computer(task, cfg.task), cfg)
    assert policy._calls == calls
    assert 0.0 <= out["pass@1"] <= out["pass@3"] <= 1.0 and list(out)[0] == "geneval_accuracy"
    batch = policy.rollout(task.examples("eval")[:1], [task.prompt(task.examples("eval")[0])], 3, "sample")
    images = [torch.tensor(list(im.getdata()), dtype=torch.float32) for im in batch.completions]
    assert not torch.equal(images[0], images[1])  # k different initial noises


class CoinPolicy(ScriptedPolicy):
    """Sampled answers right by a coin flip from torch's global generator (as HF sampling draws)."""

    def rollout(self, examples, prompts, n, mode, need_old_logps=False, need_ref_logps=False):
        batch = super().rollout(examples, prompts, n, mode)
        if mode == "sample":
            flips = torch.rand(len(batch.completions)) < 0.5
            batch.completions = [self.task.target(ex) if f else c
                                 for c, ex, f in zip(batch.completions, batch.examples, flips.tolist())]
        return batch


def test_pass_at_k_draws_the_same_random_numbers_every_evaluation():
    """Common random numbers: two evaluations of one policy give the same pass@k whatever ran
    between them, and the caller's random stream is left where it was."""
    load_plugins()
    cfg = make_config("eval.pass_k=8", "eval.num_examples=20")
    task = TASKS.get("counting")()
    rewards = make_reward_computer(task, cfg.task)
    first = evaluate(CoinPolicy(task), task, rewards, cfg)
    torch.rand(1000)  # training would draw in between
    state = torch.get_rng_state()
    second = evaluate(CoinPolicy(task), task, rewards, cfg)
    assert second["pass@1"] == first["pass@1"] and 0.0 < first["pass@1"] < 1.0
    assert torch.equal(torch.get_rng_state(), state)
    reseeded = evaluate(CoinPolicy(task), task, rewards, make_config("eval.pass_k=8", "eval.num_examples=20",
                                                                     "train.seed=1"))
    assert reseeded["pass@1"] != first["pass@1"]
