"""Data selection and guidance wired through the trainer and the VLM policy (random tiny model)."""

from __future__ import annotations

import torch

from conftest import tiny_run_config, tiny_trainer
from mmrl.core.batch.selection import group_has_variance
from mmrl.core.trainer import Trainer
from mmrl.vlm.policy import VLMPolicy


def _cfg(path, out, steps, *extra):
    return tiny_run_config(path, out, steps, *extra, micro_batch_size=6)


_trainer = tiny_trainer


def test_dynamic_sampling_keeps_only_groups_with_variance(random_tiny_dir, tmp_path):
    """Random-model rewards are all 0, so every group is flat: all rounds are spent, every group
    dropped and counted, and the step falls back to the first round's batch."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "algo.selection=dynamic_sampling", "algo.max_num_gen_batches=2"))
    batch, m = t.rollout_step(1)
    assert m["selection/gen_batches"] == 2
    assert m["selection/dropped_groups"] + m["selection/kept_groups"] >= 3
    if m["selection/fallback"]:
        assert len(batch) == 6 and torch.equal(batch.advantages, torch.zeros(6))
    else:
        assert all(group_has_variance(batch.rewards, batch.group_ids).values())
    t.update(batch, 1)  # trains on whatever was kept


def test_dynamic_sampling_with_rewards_that_vary(random_tiny_dir, tmp_path):
    """With the overlong penalty on a 2-token budget every sample scores -0.5 (flat); a
    4-token budget with buffer 4 gives length-dependent penalties, so groups vary and are kept."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "algo.selection=dynamic_sampling", "algo.max_num_gen_batches=3",
                      "rollout.max_completion_length=4", "algo.soft_overlong_buffer=4", "rollout.num_generations=4"))
    batch, m = t.rollout_step(1)
    kept = int(m["selection/kept_groups"])
    assert kept == batch.num_groups or m["selection/fallback"] == 1
    if not m["selection/fallback"]:
        assert all(group_has_variance(batch.rewards, batch.group_ids).values())
        assert len(batch) == 4 * kept


def test_scaffold_and_augmentation_keep_the_batch_shape(random_tiny_dir, tmp_path):
    """All random-model groups fail: Scaf-GRPO re-rolls them with the counting task's hints (3
    tiers) and difficulty augmentation makes them easier (hint); sizes are unchanged."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 2, "algo.scaffold=true", "algo.difficulty_augmentation=true"))
    batch, m = t.rollout_step(1)
    unsolved = sum(not bool((batch.rewards[batch.group_ids == g] >= 1.5 - 1e-6).any()) for g in range(3))
    assert m["scaffold/failing_groups"] - m["scaffold/rescued_groups"] == unsolved
    assert len(batch) == 6 and sorted(batch.group_ids.tolist()) == [0, 0, 1, 1, 2, 2]
    assert "augment/easier" in m and "augment/harder" in m
    # A threshold every sample meets makes all groups "solved": augmentation then goes "harder"
    # (noisy images) and Scaf-GRPO has nothing to do.
    t = _trainer(_cfg(random_tiny_dir, tmp_path / "b", 2, "algo.scaffold=true", "algo.difficulty_augmentation=true",
                      "algo.scaffold_kwargs.solved_reward=-1", "algo.difficulty_augmentation_kwargs.solved_reward=-1"))
    batch, m = t.rollout_step(1)
    assert m["scaffold/failing_groups"] == 0 and m["augment/harder"] == 3 and m["augment/easier"] == 0
    assert len(batch) == 6


def test_scaffold_exemption_period(random_tiny_dir, tmp_path):
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 4, "algo.scaffold=true", "algo.scaffold_kwargs.exempt_frac=0.5"))
    _, m1 = t.rollout_step(1)
    _, m3 = t.rollout_step(3)
    assert "scaffold/failing_groups" not in m1 and "scaffold/failing_groups" in m3


def test_off_policy_guidance_injects_reference_completions(random_tiny_dir, tmp_path):
    """One reference completion (the task's target) per group of 3: it scores the maximum
    (format 0.5 + accuracy 1.0), is flagged off-policy, and trains through the shaped loss."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "algo.off_policy_guidance=1", "rollout.num_generations=3",
                      "rollout.max_completion_length=40"))
    batch, m = t.rollout_step(1)
    assert len(batch) == 9 and int(batch.off_policy.sum()) == 3
    for g in range(3):
        rows = (batch.group_ids == g).nonzero().flatten().tolist()
        refs = [i for i in rows if batch.off_policy[i]]
        assert len(rows) == 3 and len(refs) == 1
        assert batch.completions[refs[0]] == t.task.target(batch.examples[refs[0]])
        assert float(batch.rewards[refs[0]]) == 1.5
        assert float(batch.advantages[refs[0]]) > 0  # the best sample of its group
    assert m["reward/off_policy"] == 1.5  # reported apart; "reward" is the policy's own samples
    on = ~batch.off_policy
    assert abs(m["reward"] - float(batch.rewards[on].mean())) < 1e-6
    out = t.update(batch, 1)
    assert out["off_policy_frac"] > 0


def test_variance_sampler_and_spo_kl_survive_resume(random_tiny_dir, tmp_path):
    """Sampler scores and SPO's last policy KL go into checkpoints: 4 steps == 2 + resume 2."""
    extra = ("data.sampler=variance", "algo.advantage=spo", "rollout.max_completion_length=4",
             "algo.soft_overlong_buffer=4")
    a = Trainer(c := _cfg(random_tiny_dir, tmp_path / "a", 4, *extra), VLMPolicy(c))
    a.train()
    Trainer(c := _cfg(random_tiny_dir, tmp_path / "b", 2, *extra), VLMPolicy(c)).train()
    b = Trainer(c := _cfg(random_tiny_dir, tmp_path / "b", 4, *extra, "resume=true"), VLMPolicy(c))
    b.train()
    assert a.batches.sampler.state_dict() == b.batches.sampler.state_dict() and a.batches.sampler.state_dict()["scores"]
    assert a.batches.policy_kl is not None and a.batches.policy_kl == b.batches.policy_kl and a.batches.policy_kl >= 0
    assert a.batches.adv_state.state_dict() == b.batches.adv_state.state_dict()
    for (n, p), (_, q) in zip(a.policy.model.named_parameters(), b.policy.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), n


def test_dump_and_stratified_on_a_task_mixture(random_tiny_dir, tmp_path):
    """A counting + grounding mixture: DUMP logs a source distribution, and stratified_grpo
    normalises within each task (real task ids from the examples' ``source``)."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "task.name=mixture",
                      "task.options.tasks={counting: {}, grounding: {}}", "data.sampler=dump",
                      "algo.advantage=stratified_grpo", "rollout.max_completion_length=4",
                      "algo.soft_overlong_buffer=4", "train.prompts_per_step=4", "rollout.num_generations=3"))
    batch, m = t.rollout_step(1)
    assert set(ex["source"] for ex in batch.examples) <= {"counting", "grounding"}
    assert abs(m["sampler/p/counting"] + m["sampler/p/grounding"] - 1) < 1e-9
    for source in {ex["source"] for ex in batch.examples}:
        rows = [i for i, ex in enumerate(batch.examples) if ex["source"] == source]
        a = batch.advantages[rows]
        if len(rows) > 1 and a.abs().sum() > 0:
            assert abs(float(a.mean())) < 1e-4  # zero mean within each stratum


def test_perturbations_reach_the_rollouts(random_tiny_dir, tmp_path):
    """data.perturbation=distractor with probability 1 on grounding: every training image is
    twice as wide, its box shifted or not, and the policy's frame follows the new size."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "task.name=grounding", "data.perturbation=distractor",
                      "data.perturbation_prob=1.0"))
    batch, _ = t.rollout_step(1)
    for ex in batch.examples:
        assert ex["image_size"] == ex["image"].size == (224, 112)
        assert ex["frame"].width == 224
        plain = t.batches.train_examples[ex["_index"]]["box"]
        assert tuple(ex["box"]) in (tuple(plain), (plain[0] + 112, plain[1], plain[2] + 112, plain[3]))
