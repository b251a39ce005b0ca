"""T-GRPO (Video-R1): the temporal-contrast bonus on a hand-worked batch, and the frame shuffle."""

import numpy as np
import pytest
import torch

from mmrl.core.batch.temporal import temporal_contrast_bonus
from mmrl.media.frame_order import non_identity_permutation, shuffle_frames

# 2 groups x 4 ordered samples; 4 shuffled samples per group
CORRECT = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
SHUFFLED = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
SHUFFLED_GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_hand_worked_batch():
    bonus, metrics = temporal_contrast_bonus(CORRECT, GROUPS, SHUFFLED, SHUFFLED_GROUPS, alpha=0.3, mu=0.8)
    # group 0: p = 3/4 = 0.75 > 0.8 * 1/4 = 0.2 -> its three correct answers get 0.3
    # group 1: p = 1/4 = 0.25 < 0.8 * 2/4 = 0.4 -> nothing
    assert torch.equal(bonus, torch.tensor([0.3, 0.3, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0]))
    assert bonus.dtype == CORRECT.dtype
    # ordered acc (3 + 1) / 8 = 0.5; shuffled (1 + 2) / 8 = 0.375; 1 of 2 groups got the bonus
    assert metrics == {"temporal/ordered_acc": 0.5, "temporal/shuffled_acc": 0.375, "temporal/bonus_groups": 0.5}


def test_samples_may_come_in_any_order_and_groups_differ_in_size():
    # the same batch interleaved; Video-R1's G~ = G / 2: two shuffled samples per group
    correct = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([1, 0, 1, 0, 0, 1, 0, 1])
    shuffled, shuffled_groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([1, 0, 1, 0])
    bonus, metrics = temporal_contrast_bonus(correct, groups, shuffled, shuffled_groups)
    # group 0 = samples 1, 3, 4, 6: [1, 1, 0, 1], p 0.75; shuffled [0, 1], p~ 0.5: 0.75 > 0.4 -> bonus
    # group 1 = samples 0, 2, 5, 7: [0, 1, 0, 0], p 0.25; shuffled [1, 1], p~ 1.0: 0.25 < 0.8 -> none
    assert torch.equal(bonus, torch.tensor([0.0, 0.3, 0.0, 0.3, 0.0, 0.0, 0.3, 0.0]))
    assert metrics["temporal/shuffled_acc"] == 0.75 and metrics["temporal/bonus_groups"] == 0.5


def test_the_comparison_is_strict():
    # p = 0.4 = 0.8 * p~ (p~ = 0.5): the paper's p > mu p~ gives nothing (Video-R1's code, >=, would)
    correct = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])
    groups = torch.zeros(5, dtype=torch.long)
    bonus, metrics = temporal_contrast_bonus(correct, groups, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]),
                                             mu=0.8)
    assert torch.equal(bonus, torch.zeros(5)) and metrics["temporal/bonus_groups"] == 0.0


def test_the_codes_comparison_gives_the_tie_its_bonus():
    """G = 5, G~ = 2, ordered [1, 1, 0, 0, 0] against shuffled [1, 0]: 2/5 = 0.4 = 0.8 * 1/2, a tie at
    nonzero accuracy. Video-R1's code (``if acc_mean >= 0.8 * shuffled_acc_mean``) gives the two
    right answers 0.3; the paper's strict rule (the default, above) gives nothing."""
    correct = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])
    bonus, metrics = temporal_contrast_bonus(correct, torch.zeros(5, dtype=torch.long), torch.tensor([1.0, 0.0]),
                                             torch.tensor([0, 0]), mu=0.8, comparison="ge")
    assert torch.equal(bonus, torch.tensor([0.3, 0.3, 0.0, 0.0, 0.0])) and metrics["temporal/bonus_groups"] == 1.0
    # with G = 8, G~ = 4 the two rules differ only when both groups score 0 (no right answer to reward)
    for k in range(9):
        for k_shuffled in range(5):
            ordered = torch.tensor([1.0] * k + [0.0] * (8 - k))
            shuffled = torch.tensor([1.0] * k_shuffled + [0.0] * (4 - k_shuffled))
            ids, sids = torch.zeros(8, dtype=torch.long), torch.zeros(4, dtype=torch.long)
            gt = temporal_contrast_bonus(ordered, ids, shuffled, sids)[0]
            ge = temporal_contrast_bonus(ordered, ids, shuffled, sids, comparison="ge")[0]
            assert torch.equal(gt, ge), (k, k_shuffled)
    with pytest.raises(ValueError, match="comparison must be one of gt, ge"):
        temporal_contrast_bonus(correct, torch.zeros(5, dtype=torch.long), torch.tensor([1.0]), torch.tensor([0]),
                                comparison=">=")


def test_graded_accuracy_threshold_and_alpha():
    # graded rewards (ROUGE, 1 - WER) enter the means with their value; "correct" is accuracy > 0.1
    correct = torch.tensor([0.05, 0.1, 0.15, 0.9])  # p = 1.2 / 4 = 0.3
    bonus, metrics = temporal_contrast_bonus(correct, torch.zeros(4, dtype=torch.long),
                                             torch.tensor([0.2, 0.3]), torch.tensor([0, 0]), alpha=0.5)
    # p~ = 0.25; 0.3 > 0.8 * 0.25 = 0.2 -> 0.5 for the two answers above 0.1 (0.1 itself is not)
    assert torch.equal(bonus, torch.tensor([0.0, 0.0, 0.5, 0.5]))
    assert metrics["temporal/ordered_acc"] == pytest.approx(0.3)
    assert metrics["temporal/shuffled_acc"] == pytest.approx(0.25)
    bonus, _ = temporal_contrast_bonus(correct, torch.zeros(4, dtype=torch.long), torch.tensor([0.2, 0.3]),
                                       torch.tensor([0, 0]), correct_threshold=0.5)
    assert torch.equal(bonus, torch.tensor([0.0, 0.0, 0.0, 0.3]))


def test_groups_without_shuffled_samples_get_nothing_and_are_not_counted():
    # group 1 (an image question, say) has no shuffled samples
    bonus, metrics = temporal_contrast_bonus(CORRECT, GROUPS, SHUFFLED[:4], SHUFFLED_GROUPS[:4])
    assert torch.equal(bonus, torch.tensor([0.3, 0.3, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0]))
    assert metrics == {"temporal/ordered_acc": 0.75, "temporal/shuffled_acc": 0.25, "temporal/bonus_groups": 1.0}
    bonus, metrics = temporal_contrast_bonus(CORRECT, GROUPS, torch.tensor([]), torch.tensor([], dtype=torch.long))
    assert torch.equal(bonus, torch.zeros(8))
    assert metrics == {"temporal/ordered_acc": 0.0, "temporal/shuffled_acc": 0.0, "temporal/bonus_groups": 0.0}


def test_all_wrong_everywhere_gets_nothing():
    bonus, metrics = temporal_contrast_bonus(torch.zeros(4), torch.zeros(4, dtype=torch.long), torch.zeros(2),
                                             torch.zeros(2, dtype=torch.long))
    assert torch.equal(bonus, torch.zeros(4)) and metrics["temporal/bonus_groups"] == 0.0  # 0 > 0.8 * 0 fails


def test_integer_and_bool_accuracies_are_accepted():
    bonus, _ = temporal_contrast_bonus(CORRECT.bool(), GROUPS, SHUFFLED.long(), SHUFFLED_GROUPS)
    assert bonus.is_floating_point()
    assert torch.allclose(bonus, torch.tensor([0.3, 0.3, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0]))


def test_mismatched_inputs_are_errors():
    with pytest.raises(ValueError, match="group_ids"):
        temporal_contrast_bonus(CORRECT, GROUPS[:3], SHUFFLED, SHUFFLED_GROUPS)
    with pytest.raises(ValueError, match="shuffled_group_ids"):
        temporal_contrast_bonus(CORRECT, GROUPS, SHUFFLED, SHUFFLED_GROUPS[:3])
    with pytest.raises(ValueError, match=r"groups \[7\]"):
        temporal_contrast_bonus(CORRECT, GROUPS, SHUFFLED[:1], torch.tensor([7]))


# -- shuffling frames ------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [2, 3, 4, 16])
def test_shuffle_is_a_permutation_and_never_the_identity(T):
    frames = torch.arange(T * 6, dtype=torch.float32).reshape(T, 2, 3)  # frame t holds 6t .. 6t + 5
    rng = np.random.default_rng(0)
    for _ in range(200):
        out = shuffle_frames(frames, rng)
        assert out.shape == frames.shape
        order = (out[:, 0, 0] / 6).long()  # which frame landed where
        assert sorted(order.tolist()) == list(range(T))  # every frame once
        assert order.tolist() != list(range(T))  # never the original order
        assert torch.equal(out, frames[order])  # whole frames moved, not pixels


def test_two_frames_are_always_swapped():
    rng = np.random.default_rng(1)
    assert all(non_identity_permutation(2, rng).tolist() == [1, 0] for _ in range(50))


def test_shuffle_is_deterministic_given_the_seed():
    frames = torch.arange(16)
    a = [shuffle_frames(frames, np.random.default_rng(7)) for _ in range(2)]
    assert torch.equal(a[0], a[1])
    runs = [shuffle_frames(frames, np.random.default_rng(s)).tolist() for s in range(5)]
    assert len({tuple(r) for r in runs}) > 1  # and the seed matters


def test_shuffle_lists_and_short_clips():
    rng = np.random.default_rng(0)
    out = shuffle_frames(["a", "b", "c"], rng)
    assert isinstance(out, list) and sorted(out) == ["a", "b", "c"] and out != ["a", "b", "c"]
    one = torch.ones(1, 2)
    assert torch.equal(shuffle_frames(one, rng), one) and shuffle_frames([], rng) == []
    assert non_identity_permutation(0, rng).tolist() == [] and non_identity_permutation(1, rng).tolist() == [0]


@pytest.mark.slow
def test_temporal_grpo_in_the_batch_pipeline(random_tiny_dir, tmp_path, monkeypatch):
    """algo.temporal_grpo=true on video_qa: each group's clip is rolled out again with its frames
    shuffled (a permutation of the same frames), and the bonus lands on the correct ordered answers
    of groups that beat their shuffled twin. Completions are set by hand: ordered samples right
    in group 0 only (2 of 2), every shuffled sample wrong, so group 0 gets +0.3 on both."""
    from conftest import tiny_run_config, tiny_trainer

    cfg = tiny_run_config(random_tiny_dir, tmp_path, 2, "task.name=video_qa", "algo.temporal_grpo=true",
                          "vlm.video_min_pixels=12544", "vlm.video_max_pixels=12544", "algo.beta=0")
    trainer = tiny_trainer(cfg)
    policy = trainer.policy
    real = policy.rollout
    calls = []

    def scripted(examples, prompts, n, mode="train", **kw):
        batch = real(examples, prompts, n, mode, **kw)
        calls.append(list(examples))
        ordered = len(calls) == 1
        batch.completions = [f"<think>a</think><answer>{ex['answer']}</answer>" if ordered and g == 0
                             else "<think>a</think><answer>Z</answer>"
                             for g, ex in zip(batch.group_ids.tolist(), batch.examples)]
        return batch

    monkeypatch.setattr(policy, "rollout", scripted)
    batch, metrics = trainer.rollout_step(1)
    assert len(calls) == 2
    ordered, shuffled = calls
    assert len(shuffled) == 3  # one shuffled twin per group; num_generations 2 -> 1 shuffled sample each
    for a, b in zip(ordered, shuffled):
        fa, fb = a["video"].frames, b["video"].frames
        assert not torch.equal(fa, fb)
        assert sorted(x.sum().item() for x in fa) == sorted(x.sum().item() for x in fb)
    bonus = batch.reward_components["temporal_bonus"]
    assert bonus.tolist() == pytest.approx([0.3, 0.3, 0.0, 0.0, 0.0, 0.0])
    accuracy = batch.reward_components["video_r1_accuracy"]
    assert torch.allclose(batch.rewards, 0.5 * batch.reward_components["format"] + accuracy + bonus)
    assert metrics["temporal/bonus_groups"] == pytest.approx(1 / 3)
