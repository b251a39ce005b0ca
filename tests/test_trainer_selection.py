"""Data selection and guidance wired through the trainer and the VLM policy (random tiny model)."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_run_config, tiny_trainer
from mmrl import register_reward
from mmrl.core.trainer import Trainer
from mmrl.vlm.policy import VLMPolicy

pytestmark = pytest.mark.slow  # every test here takes over half a second on the 2-core CPU


def _cfg(path, out, steps, *extra):
    return tiny_run_config(path, out, steps, *extra, micro_batch_size=6)


_trainer = tiny_trainer


@register_reward("test_flat")
def flat_reward(completions, examples, **ctx):
    """The same score for every sample: every group is flat (zero variance)."""
    return [0.5] * len(completions)


@register_reward("test_even_spread")
def even_spread(completions, examples, group_ids=None, **ctx):
    """A sample's position in its group (0, 1, ...) when its example index is even, else 0: groups
    of even examples vary, groups of odd examples are flat."""
    ids = group_ids.tolist() if group_ids is not None else [0] * len(completions)
    seen: dict[int, int] = {}
    out = []
    for ex, g in zip(examples, ids):  # never raises (rewards are called on arbitrary input elsewhere)
        j = seen[g] = seen.get(g, -1) + 1
        even = isinstance(ex, dict) and isinstance(ex.get("_index"), int) and ex["_index"] % 2 == 0
        out.append(float(j) if even else 0.0)
    return out


def test_dynamic_sampling_drops_flat_groups_and_falls_back(random_tiny_dir, tmp_path):
    """Every group flat: both rounds are spent, all 2 x 3 groups dropped and counted, and the step
    falls back to round 0's batch (its prompts, in order) with zero advantages."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "algo.selection=dynamic_sampling", "algo.max_num_gen_batches=2",
                      "task.rewards={test_flat: 1.0}"))
    batch, m = t.rollout_step(1)
    assert (m["selection/gen_batches"], m["selection/dropped_groups"], m["selection/kept_groups"],
            m["selection/fallback"]) == (2, 6, 0, 1)
    assert [ex["_index"] for ex in batch.examples] == [i for i in t.batches.sampler.indices(1, 0) for _ in range(2)]
    assert torch.equal(batch.advantages, torch.zeros(6))
    t.update(batch, 1)  # trains on the fallback batch


def test_dynamic_sampling_keeps_the_groups_that_vary(random_tiny_dir, tmp_path):
    """Groups of even examples score [0, 1], of odd ones [0, 0]: the kept batch is the first 3 even
    examples of the rounds, in the order drawn, every odd group before them dropped, and the
    rounds stop as soon as 3 are kept. GRPO advantages of [0, 1]: -+0.5 / std 0.7071 = -+0.7071."""
    t = _trainer(_cfg(random_tiny_dir, tmp_path, 1, "algo.selection=dynamic_sampling", "algo.max_num_gen_batches=5",
                      "task.rewards={test_even_spread: 1.0}"))
    rounds = [t.batches.sampler.indices(1, r) for r in range(5)]
    drawn = [i for r in rounds for i in r]
    evens = [i for i in drawn if i % 2 == 0][:3]
    used = next(r + 1 for r in range(5) if sum(i % 2 == 0 for rr in rounds[:r + 1] for i in rr) >= 3)
    dropped = sum(i % 2 for rr in rounds[:used] for i in rr)
    assert len(evens) == 3 and dropped > 0  # the seed gives the selection something to do
    batch, m = t.rollout_step(1)
    assert [ex["_index"] for ex in batch.examples] == [i for i in evens for _ in range(2)]
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert (m["selection/gen_batches"], m["selection/kept_groups"], m["selection/fallback"]) == (used, 3, 0)
    assert m["selection/dropped_groups"] == dropped
    assert batch.rewards.tolist() == [0.0, 1.0] * 3
    assert batch.advantages.tolist() == pytest.approx([-0.70710, 0.70710] * 3, abs=1e-4)


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
    b = Trainer(c := _cfg(random_tiny_dir, tmp_path / "b", 4, *extra, "resume=true", "allow_config_change=true"), VLMPolicy(c))
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
    # The random model scores zeros: give each group a reward spread by hand, then every stratum
    # (task) has zero mean and unit std, whatever its reward scale (grounding's 10x here).
    sources = [ex["source"] for ex in batch.examples]
    batch.rewards = torch.tensor([(10.0 if s == "grounding" else 1.0) * (i % 3) for i, s in enumerate(sources)])
    a = t.batches._advantages(batch)
    for source in set(sources):
        rows = [i for i, s in enumerate(sources) if s == source]
        assert abs(float(a[rows].mean())) < 1e-6 and abs(float(a[rows].std()) - 1) < 1e-4, (source, a[rows])


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
