"""Where mmrl was found to deviate from the reference implementations (verl's core_algos, the
papers' own code), pinned by hand-worked examples and a property test."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.core.advantages import compute_advantages, make_advantage_state
from mmrl.core.losses import ObjectiveConfig, kl_penalty, policy_loss

# Estimators whose paper gives a group of all-equal rewards no signal (NGRPO is the exception).
ZERO_FOR_EQUAL_GROUPS = ("grpo", "dr_grpo", "rloo", "bnpo", "stratified_grpo", "reinforce_pp")


def _estimate(name, rewards, group_ids, r_min, r_max):
    kwargs = {}
    if name == "bnpo":
        kwargs = dict(state=make_advantage_state("bnpo"), r_min=r_min, r_max=r_max)
    if name == "stratified_grpo":
        kwargs = dict(task_ids=group_ids % 2)
    if name == "reinforce_pp":
        kwargs = dict(lengths=torch.arange(len(rewards)) % 5 + 1)
    return compute_advantages(name, rewards, group_ids, **kwargs)


def _weighted_total(components, weights):
    """A reward total the way RewardComputer builds it: float32, summed component by component."""
    total = torch.zeros(components.shape[0])
    for k, w in enumerate(weights):
        total += w * components[:, k]
    return total


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=32)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.lists(finite, min_size=1, max_size=3), min_size=1, max_size=6),
       weights=st.lists(st.floats(min_value=-3, max_value=3, allow_nan=False, width=32), min_size=3, max_size=3),
       size=st.integers(min_value=2, max_value=9))
def test_all_equal_groups_get_exactly_zero(values, weights, size):
    """Groups of identical arbitrary totals (any magnitude, any reward weights), next to one
    group that varies, get exactly 0 advantage from every estimator whose paper gives them no
    signal; the varying group still gets some."""
    comps = [v + [0.0] * (3 - len(v)) for v in values]
    rows = [c for c in comps for _ in range(size)] + [[0.0, 0.0, 0.0], [1.0, 0.5, 0.25]]
    rewards = _weighted_total(torch.tensor(rows, dtype=torch.float32), weights)
    group_ids = torch.arange(len(comps) + 1).repeat_interleave(
        torch.tensor([size] * len(comps) + [2]))
    equal = group_ids < len(comps)
    lo, hi = float(rewards.min()) - 1, float(rewards.max()) + 1
    for name in ZERO_FOR_EQUAL_GROUPS:
        adv = _estimate(name, rewards, group_ids, lo, hi)
        assert torch.isfinite(adv).all(), name
        assert (adv[equal] == 0).all(), (name, adv[equal])
        spread, scale = abs(float(rewards[-1] - rewards[-2])), max(1.0, float(rewards.abs().max()))
        if spread > 1e-3 * scale:  # a real difference (not one lost when BNPO maps to [0, 1])
            assert (adv[~equal] != 0).any(), name


@settings(max_examples=40, deadline=None)
@given(value=finite, size=st.integers(min_value=1, max_value=9), r_max=finite)
def test_ngrpo_all_equal_group_gets_exactly_its_formula(value, size, r_max):
    """NGRPO by design gives an all-equal group a signal: with one virtual sample at r_max,
    A = (r - r_max)/(n+1) / (|r_max - r|/sqrt(n+1) + eps) for every sample, all identical."""
    r = torch.full((size,), value, dtype=torch.float32)
    adv = compute_advantages("ngrpo", r, torch.zeros(size, dtype=torch.long), r_max=r_max)
    r64, n = float(r[0]), size
    expected = (r64 - r_max) / (n + 1) / (abs(r_max - r64) / math.sqrt(n + 1) + 1e-6)
    assert (adv == adv[0]).all()
    assert float(adv[0]) == pytest.approx(expected, rel=1e-6, abs=1e-6)
    if r64 == r_max:
        assert (adv == 0).all()


def test_float32_group_mean_residue_is_gone():
    """The case that was found: 500 random float32 rewards, each repeated 8 times as a group.
    A float32 mean of 8 equal values misses the value by an ulp in many of them, and the
    residue over std + 1e-6 was an advantage of up to ~0.1. Now every group gets exactly 0."""
    g = torch.Generator().manual_seed(0)
    values = torch.rand(500, generator=g) * 0.2 + 0.1 * torch.rand(500, generator=g)
    rewards = values.repeat_interleave(8)
    group_ids = torch.arange(500).repeat_interleave(8)
    naive = (rewards.view(500, 8) - rewards.view(500, 8).mean(1, keepdim=True))
    naive = naive / (rewards.view(500, 8).std(1, keepdim=True) + 1e-6)
    assert (naive != 0).any()  # the residue this test is about really occurs in float32
    for name in ("grpo", "dr_grpo", "rloo"):
        assert (compute_advantages(name, rewards, group_ids) == 0).all(), name


def test_constant_batch_whitens_to_zero():
    """REINFORCE++ without a group baseline whitens the batch; a constant batch gives 0 exactly."""
    r = torch.full((7,), 0.7, dtype=torch.float32)
    adv = compute_advantages("reinforce_pp", r, torch.arange(7), group_baseline=False, lengths=torch.ones(7))
    assert (adv == 0).all()


def test_reinforce_pp_whitens_over_tokens():
    """group_baseline=False, rewards [1, 0, 0] with [3, 1, 2] tokens.
    Token-level (the paper's eq. 10, OpenRLHF/verl masked_whiten): the 6 token advantages are
    1, 1, 1, 0, 0, 0 -> mean 0.5, var (6 * 0.25) / (6 - 1) = 0.3, std 0.5477226;
    A = [0.5, -0.5, -0.5] / 0.5477226 = [0.9128709, -0.9128709, -0.9128709].
    Sequence-level: mean 1/3, var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3, std 0.5773503;
    A = [1.1547005, -0.5773503, -0.5773503]."""
    r, ids, lengths = torch.tensor([1.0, 0.0, 0.0]), torch.arange(3), torch.tensor([3, 1, 2])
    token = compute_advantages("reinforce_pp", r, ids, group_baseline=False, lengths=lengths)
    seq = compute_advantages("reinforce_pp", r, ids, group_baseline=False, lengths=lengths, whiten="sequence")
    torch.testing.assert_close(token, torch.tensor([0.9128709, -0.9128709, -0.9128709]), atol=3e-6, rtol=0)
    torch.testing.assert_close(seq, torch.tensor([1.1547005, -0.5773503, -0.5773503]), atol=3e-6, rtol=0)


def test_k3_is_clamped_like_verl():
    """k3 = exp(d) - 1 - d with d = ref - logp clamped to [-20, 20] and k3 to <= 10.
    d = 2: e^2 - 3 = 4.3890561 (inside both bounds). d = +30 and d = -30: 10 (the unclamped
    values would be 1.07e13 and 29). Clamped tokens pass no gradient."""
    logp = torch.zeros(3, requires_grad=True)
    ref = torch.tensor([2.0, 30.0, -30.0])
    k3 = kl_penalty(logp, ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([4.3890561, 10.0, 10.0]))
    k3.sum().backward()
    assert logp.grad[0] != 0 and logp.grad[1] == 0 and logp.grad[2] == 0


def _kl_cov_case(clip: bool):
    """One sequence of 3 tokens, per-token advantages A = [1, 0.5, -1], logp = [-0.5, -1, -2],
    logp - old = [0.5, 0, -0.1] (ratios e^0.5 = 1.6487213, 1, e^-0.1 = 0.9048374)."""
    logp = torch.tensor([[-0.5, -1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor([[0.5, 0.0, -0.1]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 0.5, -1.0]], dtype=torch.float64)
    cfg = ObjectiveConfig(epsilon=0.2, kl_cov_ratio=0.34, kl_cov_coef=1.0, kl_cov_clip=clip)
    loss, metrics = policy_loss(logp, old, adv, torch.ones(1, 3, dtype=torch.float64), cfg)
    loss.backward()
    return loss, metrics, logp.grad


def test_kl_cov_objective_is_unclipped_with_the_penalty():
    """KL-Cov ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models";
    verl's compute_policy_loss_kl_cov): covariance (logp - mean logp)(A - mean A) with means
    -7/6 and 1/6 is [0.5556, 0.0556, 0.9722]; int(0.34 * 3) = 1 token, the top one: token 2.
    pg = -A * ratio, unclipped: [-1.6487213, -0.5, +0.9048374]; token 2 adds |logp - old| = 0.1.
    token_mean: (-1.6487213 - 0.5 + 1.0048374) / 3 = -0.3812946, and token 0 (ratio 1.65 > 1.2)
    keeps its gradient -A ratio / 3 = -0.5495738.
    With kl_cov_clip=true the PPO clip stays: token 0 -> -1.2 (no gradient), loss
    (-1.2 - 0.5 + 1.0048374) / 3 = -0.2317209."""
    loss, metrics, grad = _kl_cov_case(clip=False)
    assert float(loss.detach()) == pytest.approx(-0.3812946, abs=1e-6)
    assert float(grad[0, 0]) == pytest.approx(-0.5495738, abs=1e-6)
    assert metrics["kl_cov_frac"] == pytest.approx(1 / 3) and "clip_frac_high" not in metrics
    loss, metrics, grad = _kl_cov_case(clip=True)
    assert float(loss.detach()) == pytest.approx(-0.2317209, abs=1e-6)
    assert float(grad[0, 0]) == 0.0 and metrics["clip_frac_high"] == pytest.approx(1 / 3)


def test_rollout_importance_weight_modes():
    """old - rollout log-probs per token [0.1, 1.0, -3.0] (mask all ones), clip [0.5, 2]:
    token_truncate: [e^0.1, e^1 -> 2, e^-3 -> 0.5] = [1.1052, 2.0, 0.5];
    token_mask: [1.1052, 0 (2.718 > 2), 0 (0.0498 < 0.5)];
    sequence_*: one ratio exp(0.1 + 1 - 3) = e^-1.9 = 0.1496 -> truncate 0.5, mask 0 (TRL's modes)."""
    from mmrl.core.losses import rollout_is_weight

    old = torch.tensor([[0.0, 0.0, 0.0]])
    rollout = torch.tensor([[-0.1, -1.0, 3.0]])
    mask = torch.ones(1, 3)

    def weight(mode):
        cfg = ObjectiveConfig(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=0.5,
                              vllm_importance_sampling_clip_max=2.0)
        return rollout_is_weight(old, rollout, mask, cfg)

    torch.testing.assert_close(weight("token_truncate"), torch.tensor([[1.1051709, 2.0, 0.5]]))
    torch.testing.assert_close(weight("token_mask"), torch.tensor([[1.1051709, 0.0, 0.0]]))
    torch.testing.assert_close(weight("sequence_truncate"), torch.tensor([[0.5]]))
    torch.testing.assert_close(weight("sequence_mask"), torch.tensor([[0.0]]))


def test_rollout_importance_weight_scales_the_policy_gradient():
    """With engine log-probs the pg term is weighted (not the KL term): A = 1, one token, ratio 1,
    old - rollout = log 1.5 -> loss -1.5 (token_truncate, clip 2) and the metric reports 1.5."""
    logp = torch.zeros(1, 1, requires_grad=True)
    cfg = ObjectiveConfig()
    loss, m = policy_loss(logp, None, torch.ones(1), torch.ones(1, 1), cfg,
                          rollout_logps=torch.full((1, 1), -math.log(1.5)))
    assert float(loss.detach()) == pytest.approx(-1.5) and m["rollout_is_ratio"] == pytest.approx(1.5)
    off = ObjectiveConfig(vllm_importance_sampling_correction=False)
    loss, m = policy_loss(logp, None, torch.ones(1), torch.ones(1, 1), off, rollout_logps=torch.full((1, 1), -5.0))
    assert float(loss.detach()) == pytest.approx(-1.0) and "rollout_is_ratio" not in m
