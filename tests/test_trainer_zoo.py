"""The algorithm switches wired through the trainer and the VLM policy (random tiny model)."""

from __future__ import annotations

import pytest

import json

import torch

from conftest import capture_gradients, make_config, tiny_run_config, tiny_trainer
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.core.trainer import Trainer
from mmrl.registry import TASKS
from mmrl.vlm.policy import VLMPolicy

pytestmark = pytest.mark.slow  # every test here takes over half a second on the 2-core CPU


def _cfg(path, out, steps, *extra):
    return tiny_run_config(path, out, steps, *extra, micro_batch_size=3)


_trainer = tiny_trainer


def test_spo_state_survives_resume_exactly(random_tiny_dir, tmp_path):
    """SPO's per-prompt value tracker is saved in checkpoints: 4 steps straight == 2 + resume 2."""
    spo = ("algo.advantage=spo", "rollout.num_generations=1", "train.prompts_per_step=4")
    a = Trainer(c := _cfg(random_tiny_dir, tmp_path / "a", 4, *spo), VLMPolicy(c))
    a.train()
    Trainer(c := _cfg(random_tiny_dir, tmp_path / "b", 2, *spo), VLMPolicy(c)).train()
    b = Trainer(c := _cfg(random_tiny_dir, tmp_path / "b", 4, *spo, "resume=true", "allow_config_change=true"), VLMPolicy(c))
    b.train()
    assert a.batches.adv_state.state_dict() == b.batches.adv_state.state_dict()
    assert a.batches.adv_state.state_dict()  # the tracker saw prompts
    for (n, p), (_, q) in zip(a.policy.model.named_parameters(), b.policy.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), n


def test_single_sample_groups_get_signal_with_spo_not_grpo(random_tiny_dir, tmp_path):
    """One sample per prompt, rewards [1, 0, 1, 0, 1, 0] (set by hand: the random model scores all
    zeros). GRPO: every group of one carries nothing. SPO: a = r - v(x) with a fresh tracker's
    v = the batch mean 0.5 (no prior value), so a = +-0.5, batch-normalised to +-0.5 / std(a) =
    +-0.5 / sqrt(0.3) = +-0.9129: signal from single samples."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    spo = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "algo.advantage=spo", "rollout.num_generations=1",
                        "train.prompts_per_step=6"))
    batch, _ = spo.rollout_step(1)
    spo.batches.adv_state = type(spo.batches.adv_state)()  # a fresh tracker: rollout_step saw zeros
    batch.rewards = rewards
    a = spo.batches._advantages(batch)
    assert torch.allclose(a, (rewards - 0.5) / (rewards - 0.5).std(), atol=1e-4), a
    g = _trainer(_cfg(random_tiny_dir, tmp_path / "g", 1, "rollout.num_generations=1", "train.prompts_per_step=6"))
    batch, _ = g.rollout_step(1)
    batch.rewards = rewards
    assert torch.equal(g.batches._advantages(batch), torch.zeros(6))  # GRPO: a group of one carries nothing


def test_overlong_filter_and_soft_penalty(random_tiny_dir, tmp_path):
    """With a 2-token budget every completion is truncated: filtered out of the loss, and the soft
    penalty (buffer 2, penalty 0.5) at length 2 = max is -(2 - 0)/2 * 0.5 = -0.5."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "rollout.max_completion_length=2", "algo.overlong_filter=true",
                      "algo.soft_overlong_buffer=2", "algo.soft_overlong_penalty=0.5"))
    batch, metrics = t.rollout_step(1)
    assert batch.truncated.all()
    assert batch.action_mask.sum() == 0
    assert torch.allclose(batch.reward_components["overlong_penalty"], torch.full((6,), -0.5))
    assert metrics["reward/overlong_penalty"] == -0.5


def test_kl_schedule_changes_the_weight_per_step(random_tiny_dir, tmp_path):
    cfg = _cfg(random_tiny_dir, tmp_path, 3, "algo.beta=0.1", "algo.kl_schedule=linear_decay",
               "algo.kl_schedule_kwargs={beta_end: 0.0}", "log.save_every=0")
    Trainer(cfg, VLMPolicy(cfg)).train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    coefs = [r["kl_coef"] for r in rows if "kl_coef" in r]
    assert coefs == sorted(coefs, reverse=True) and abs(coefs[0] - 0.1) < 1e-9 and coefs[-1] < 0.1
    assert all("kl" in r for r in rows if "kl_coef" in r and r["kl_coef"] > 0)


def test_reference_reset_copies_the_policy(random_tiny_dir, tmp_path):
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 2, "algo.beta=0.05", "algo.ref_reset_every=1"))
    batch, _ = t.rollout_step(1)
    batch.advantages = torch.linspace(-1, 1, len(batch))  # a random model scores all zeros
    t.update(batch, 1)
    assert not all(torch.equal(p, q) for p, q in zip(t.policy.model.parameters(), t.policy.ref_module.parameters()))
    t.policy.reset_reference()
    assert all(torch.equal(p, q) for p, q in zip(t.policy.model.parameters(), t.policy.ref_module.parameters()))
    assert not t.policy.optimizer.state


def test_zscore_aggregation_changes_the_learning_signal_not_the_logged_reward(random_tiny_dir, tmp_path):
    """The same rollouts under weighted_sum and zscore: the logged reward is the same, the advantages
    are not. Components set by hand (the random model scores zeros): format [1, 1, 1, 0, 1, 1] and
    accuracy [1, 0, 0, 0, 0, 1] in two groups of three, weights 0.5 and 1. Weighted sum: [1.5, 0.5,
    0.5, 0, 0.5, 1.5]; zscore standardises each reward over the batch first (mean 5/6 and 1/3, std
    sqrt(1/6) and sqrt(4/15)) then weights them, which ranks the samples differently."""
    ws = _trainer(_cfg(random_tiny_dir, tmp_path / "w", 1))
    zs = _trainer(_cfg(random_tiny_dir, tmp_path / "z", 1, "algo.reward_aggregation=zscore"))
    a, ma = ws.rollout_step(1)
    b, mb = zs.rollout_step(1)
    assert a.completions == b.completions and ma["reward"] == mb["reward"]
    comps = {"format": torch.tensor([1.0, 1, 1, 0, 1, 1]), "accuracy": torch.tensor([1.0, 0, 0, 0, 0, 1])}
    for batch, t in ((a, ws), (b, zs)):
        batch.reward_components = dict(comps)
        batch.rewards = 0.5 * comps["format"] + comps["accuracy"]
        batch.group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    weighted, zscored = ws.batches._advantages(a), zs.batches._advantages(b)
    # weighted sum, GRPO: group 0 [1.5, 0.5, 0.5] -> mean 5/6, std sqrt(1/3): [2/3, -1/3, -1/3] / 0.57735
    assert torch.allclose(weighted[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (1 / 3) ** 0.5, atol=1e-4)
    fmt = (comps["format"] - 5 / 6) / (1 / 6) ** 0.5
    acc = (comps["accuracy"] - 1 / 3) / (4 / 15) ** 0.5
    signal = 0.5 * fmt + acc
    for g in (slice(0, 3), slice(3, 6)):
        centred = signal[g] - signal[g].mean()
        assert torch.allclose(zscored[g], centred / centred.std(), atol=1e-4)
    assert not torch.allclose(weighted, zscored, atol=1e-2)


def _update_with(path, micro, obj_cfg):
    policy = VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", f"train.micro_batch_size={micro}",
                                   "rollout.max_completion_length=8"))
    policy.configure_optimizer(policy.cfg.train, 10)
    t = TASKS.get("counting")()
    exs = [t.examples("train")[i] for i in range(2)]
    torch.manual_seed(5)
    batch = policy.rollout(exs, [t.prompt(e) for e in exs], 4, "train", need_old_logps=True,
                           need_ref_logps=False)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 1.0])
    torch.manual_seed(6)
    grads = capture_gradients(policy)
    m = policy.train_step(batch, Objective(obj_cfg), float(batch.action_mask.sum()), float(len(batch)))
    return grads, m


def test_entropy_selection_is_exact_under_gradient_accumulation(random_tiny_dir):
    """Top-entropy token selection is computed on the whole mini-batch, so micro-batches of 2
    give the same gradient as one micro-batch of 8."""
    cfg = ObjectiveConfig(top_entropy_quantile=0.5, entropy_coef=0.01)
    a, ma = _update_with(random_tiny_dir, 8, cfg)
    b, mb = _update_with(random_tiny_dir, 2, cfg)
    assert 0.3 < ma["entropy_keep_frac"] < 0.7 and ma["entropy"] > 0
    assert abs(ma["loss"] - mb["loss"]) < 1e-5
    assert a and a.keys() == b.keys()
    for n in a:
        assert torch.allclose(a[n], b[n], atol=1e-6, rtol=1e-4), n


def test_the_lr_schedule_counts_rl_steps_not_optimizer_steps(random_tiny_dir, tmp_path):
    """Linear decay over 3 RL steps of 4 optimizer steps each (2 mini-batches x 2 iterations): the
    logged lr is 1e-3 * (3 - (step - 1)) / 3 at RL step 1, 2, 3, not 0 from the second step on."""
    cfg = _cfg(random_tiny_dir, tmp_path, 3, "train.lr_scheduler_type=linear", "train.warmup_steps=0",
               "train.learning_rate=1e-3", "train.mini_batch_size=3", "algo.num_iterations=2",
               "train.prompts_per_step=3", "rollout.num_generations=2", "eval.before=false")
    Trainer(cfg, VLMPolicy(cfg)).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "lr" in r]
    assert lrs == pytest.approx([1e-3, 1e-3 * 2 / 3, 1e-3 / 3])
