"""Hand-worked checks of the clipped policy-gradient objective in mmrl.core.losses."""

import math

import pytest
import torch

from mmrl.core.losses import ObjectiveConfig, aggregate, count_sequences, kl_penalty, policy_loss

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def close(a, b, tol=1e-9):
    a, b = torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D)
    return torch.allclose(a, b, atol=tol, rtol=0)


def run(ratios, adv, cfg, mask=None):
    """One sequence of tokens with the given ratios (old_logps = 0, logps = log ratio)."""
    logps = t([[math.log(r) for r in ratios]]).requires_grad_(True)
    old = torch.zeros_like(logps)
    mask = torch.ones_like(logps) if mask is None else t(mask)
    loss, metrics = policy_loss(logps, old, t([adv]), mask, cfg)
    loss.backward()
    return loss, logps.grad, metrics


# ---- clipping ------------------------------------------------------------------------------


def test_symmetric_clip_positive_advantage():
    """ratio 1.5, A = +1, eps 0.2: min(1.5 * 1, clamp(1.5, 0.8, 1.2) * 1) = 1.2 -> loss -1.2.
    The clipped branch is constant in logps, so the gradient is 0; the token counts as clipped high.
    """
    loss, grad, m = run([1.5], 1.0, ObjectiveConfig(epsilon=0.2))
    assert close(loss, -1.2)
    assert close(grad, [[0.0]])
    assert m["clip_frac_high"] == 1.0 and m["clip_frac_low"] == 0.0
    assert abs(m["ratio_mean"] - 1.5) < 1e-12


def test_symmetric_clip_does_not_apply_to_pessimistic_side():
    """ratio 1.5, A = -1: min(-1.5, -1.2) = -1.5 -> loss 1.5, unclipped, so
    d loss / d logp = -A * ratio = 1.5."""
    loss, grad, m = run([1.5], -1.0, ObjectiveConfig(epsilon=0.2))
    assert close(loss, 1.5)
    assert close(grad, [[1.5]])
    assert m["clip_frac_high"] == 0.0 and m["clip_frac_low"] == 0.0


def test_decoupled_clip_higher():
    """eps 0.2, eps_high 0.28, A = +1, two tokens with ratios 1.25 and 1.3 (token_mean over 2):
    1.25 <= 1.28 is not clipped: l = -1.25, dl/dlogp = -1.25
    1.3 > 1.28 is clipped:       l = -1.28, dl/dlogp = 0
    loss = (-1.25 - 1.28) / 2 = -1.265; grad = [-0.625, 0]; clip_frac_high = 0.5.
    """
    loss, grad, m = run([1.25, 1.3], 1.0, ObjectiveConfig(epsilon=0.2, epsilon_high=0.28))
    assert close(loss, -1.265)
    assert close(grad, [[-0.625, 0.0]])
    assert m["clip_frac_high"] == 0.5
    # with epsilon_high=None the upper bound is 1 + epsilon = 1.2: both clipped -> loss -1.2
    loss, grad, m = run([1.25, 1.3], 1.0, ObjectiveConfig(epsilon=0.2))
    assert close(loss, -1.2) and close(grad, [[0.0, 0.0]]) and m["clip_frac_high"] == 1.0


def test_negative_advantage_clips_at_one_minus_eps():
    """A = -1, eps 0.2, eps_high 0.28 (the upper bound must not matter here):
    ratio 0.7: min(-0.7, clamp(0.7)=0.8 * -1 = -0.8) = -0.8 -> l = 0.8, grad 0, clipped low
    ratio 0.9: inside [0.8, 1.28]: l = 0.9, dl/dlogp = -A * ratio = 0.9
    token_mean: loss = 1.7 / 2 = 0.85, grad = [0, 0.45], clip_frac_low = 0.5.
    """
    loss, grad, m = run([0.7, 0.9], -1.0, ObjectiveConfig(epsilon=0.2, epsilon_high=0.28))
    assert close(loss, 0.85)
    assert close(grad, [[0.0, 0.45]])
    assert m["clip_frac_low"] == 0.5 and m["clip_frac_high"] == 0.0


def test_positive_advantage_below_lower_bound_is_not_clipped():
    """ratio 0.7, A = +1: min(0.7, 0.8) = 0.7 -> l = -0.7, gradient -0.7 (the surrogate is
    pessimistic: a decreased probability with positive advantage is always pushed back up)."""
    loss, grad, m = run([0.7], 1.0, ObjectiveConfig(epsilon=0.2))
    assert close(loss, -0.7) and close(grad, [[-0.7]])
    assert m["clip_frac_low"] == 0.0


def test_per_token_advantages():
    """(B, T) advantages are used as given: ratios [1.5, 1.5] with A [+1, -1]:
    l = [-1.2, 1.5] -> token_mean 0.15; grad = [0, 1.5 / 2]."""
    logps = t([[math.log(1.5), math.log(1.5)]]).requires_grad_(True)
    old, adv = torch.zeros_like(logps), t([[1.0, -1.0]])
    loss, _ = policy_loss(logps, old, adv, torch.ones(1, 2), ObjectiveConfig())
    loss.backward()
    assert close(loss, 0.15) and close(logps.grad, [[0.0, 0.75]])


# ---- KL --------------------------------------------------------------------------------------


def test_kl_estimators_hand_values():
    """logp = -1, ref = -1.5: log_ratio = ref - logp = -0.5
    k1 = 0.5; k2 = 0.5 * 0.25 = 0.125; k3 = e^-0.5 - 1 + 0.5 = 0.606531 - 0.5 = 0.106531.
    logp = -1.5, ref = -1: log_ratio = +0.5
    k1 = -0.5; k2 = 0.125; k3 = e^0.5 - 1 - 0.5 = 1.648721 - 1.5 = 0.148721.
    """
    logp, ref = t([-1.0, -1.5]), t([-1.5, -1.0])
    assert close(kl_penalty(logp, ref, "k1"), [0.5, -0.5])
    assert close(kl_penalty(logp, ref, "k2"), [0.125, 0.125])
    assert close(kl_penalty(logp, ref, "k3"), [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5])
    assert close(kl_penalty(logp, ref, "k3"), [0.1065307, 0.1487213], tol=1e-7)


def test_kl_term_in_loss():
    """Single iteration (old = None -> ratio 1), A = +1, beta 0.1, k3, logp = -1, ref = -1.5:
    pg = -1; kl = 0.1065307 -> l = -1 + 0.01065307 = -0.98934693.
    d l / d logp = -A * ratio + beta * d k3/d logp; d k3 / d logp = -e^(ref-logp) + 1 = 1 - e^-0.5
    = 0.3934693 -> grad = -1 + 0.03934693 = -0.96065307.
    """
    logps = t([[-1.0]]).requires_grad_(True)
    cfg = ObjectiveConfig(beta=0.1, kl_estimator="k3")
    loss, m = policy_loss(logps, None, t([1.0]), torch.ones(1, 1), cfg, ref_logps=t([[-1.5]]))
    loss.backward()
    k3 = math.exp(-0.5) - 0.5
    assert close(loss, -1 + 0.1 * k3)
    assert close(logps.grad, [[-1 + 0.1 * (1 - math.exp(-0.5))]])
    assert abs(m["kl"] - k3) < 1e-12
    assert abs(m["pg_loss"] + 1.0) < 1e-12 and abs(m["loss"] - (-1 + 0.1 * k3)) < 1e-12


def test_kl_needs_reference():
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(t([[-1.0]]), None, t([1.0]), torch.ones(1, 1), ObjectiveConfig(beta=0.1))
    # beta = 0: no reference needed and no kl metric
    _, m = policy_loss(t([[-1.0]]), None, t([1.0]), torch.ones(1, 1), ObjectiveConfig())
    assert "kl" not in m


# ---- aggregation -----------------------------------------------------------------------------

L = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
M = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_aggregation_modes_by_hand():
    """l = [[1, 2, 3], [4, 5, 6]], m = [[1, 1, 0], [1, 0, 0]] -> masked rows [1, 2] and [4].
    token_mean:              (1 + 2 + 4) / 3 tokens = 7/3 = 2.33333
    seq_mean_token_sum:      (3 + 4) / 2 seqs = 3.5
    seq_mean_token_mean:     (3/2 + 4/1) / 2 = 2.75
    seq_mean_token_sum_norm: (3 + 4) / (2 seqs * 3 max length) = 7/6 = 1.16667
    """
    l, m = t(L), t(M)
    assert close(aggregate(l, m, "token_mean"), 7 / 3)
    assert close(aggregate(l, m, "seq_mean_token_sum"), 3.5)
    assert close(aggregate(l, m, "seq_mean_token_mean"), 2.75)
    assert close(aggregate(l, m, "seq_mean_token_sum_norm", max_completion_length=3), 7 / 6)


def test_aggregation_empty_row_and_overrides():
    """Add a row [7, 8, 9] with no tokens (an overlong-filtered sample): it adds nothing to any
    numerator and, being left out of the loss, does not count as a sequence either (as verl's
    agg_loss). token_mean 7/3; seq_mean_token_sum 7/2 = 3.5; seq_mean_token_mean (1.5 + 4) / 2
    = 2.75 -- the same as without the row. count_sequences gives the 2 non-empty rows.
    Overrides: num_tokens=10 -> 7/10; num_seqs=4 -> 7/4, (5.5)/4, 7/(4*3).
    """
    l, m = t(L + [[7.0, 8.0, 9.0]]), t(M + [[0.0, 0.0, 0.0]])
    assert count_sequences(m) == 2.0
    assert close(aggregate(l, m, "token_mean"), 7 / 3)
    assert close(aggregate(l, m, "seq_mean_token_sum"), 3.5)
    assert close(aggregate(l, m, "seq_mean_token_mean"), 2.75)
    assert close(aggregate(l, m, "token_mean", num_tokens=10), 0.7)
    assert close(aggregate(l, m, "seq_mean_token_sum", num_seqs=4), 1.75)
    assert close(aggregate(l, m, "seq_mean_token_mean", num_seqs=4), 5.5 / 4)
    norm = aggregate(l, m, "seq_mean_token_sum_norm", num_seqs=4, max_completion_length=3)
    assert close(norm, 7 / 12)


def test_aggregation_empty_mask_is_zero_not_nan():
    l, m = t(L), torch.zeros(2, 3, dtype=D)
    for mode in ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"):
        assert aggregate(l, m, mode).item() == 0.0
    assert aggregate(l, m, "token_mean", num_tokens=0).item() == 0.0


def test_bool_mask_accepted():
    assert close(aggregate(t(L), t(M).bool(), "token_mean"), 7 / 3)


@pytest.mark.parametrize(
    "mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
def test_gradient_accumulation_equivalence(mode):
    """Loss and gradient over a 5-sequence batch == sum over micro-batches [0:2] and [2:5]
    when each micro-batch call is given the batch totals (num_tokens, num_seqs)."""
    g = torch.Generator().manual_seed(0)
    B, T = 5, 6
    logps = (-torch.rand(B, T, generator=g, dtype=D) * 3).requires_grad_(True)
    old = logps.detach() + 0.4 * torch.randn(B, T, generator=g, dtype=D)  # some tokens clip
    ref = logps.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=D)
    adv = torch.randn(B, generator=g, dtype=D)
    lengths = torch.tensor([6, 2, 0, 4, 1])
    mask = (torch.arange(T) < lengths[:, None]).to(D)
    cfg = ObjectiveConfig(
        epsilon=0.2, epsilon_high=0.28, beta=0.05, loss_agg_mode=mode, max_completion_length=T
    )

    full, _ = policy_loss(logps, old, adv, mask, cfg, ref_logps=ref)
    (full_grad,) = torch.autograd.grad(full, logps)

    totals = dict(num_tokens=mask.sum(), num_seqs=count_sequences(mask))  # the non-empty rows
    parts = [slice(0, 2), slice(2, 5)]
    summed = sum(
        policy_loss(logps[s], old[s], adv[s], mask[s], cfg, ref_logps=ref[s], **totals)[0]
        for s in parts
    )
    (micro_grad,) = torch.autograd.grad(summed, logps)
    assert torch.allclose(full, summed, atol=1e-12)
    assert torch.allclose(full_grad, micro_grad, atol=1e-12)
    assert full_grad.abs().sum() > 0
    # Sanity that the test can fail: micro-batch-local normalisers give a different loss.
    local = sum(
        policy_loss(logps[s], old[s], adv[s], mask[s], cfg, ref_logps=ref[s])[0] for s in parts
    )
    assert not torch.allclose(full, local)


def test_single_iteration_ratio_one_and_gradient():
    """old_logps=None: ratio == 1 exactly, no clipping, so per token l = -A and
    d loss / d logp = -A * m / num_tokens. With A = [2, -1], m = [[1, 1, 0], [1, 0, 0]]
    (3 tokens): loss = -(2 + 2 - 1) / 3 = -1; grad = [[-2/3, -2/3, 0], [1/3, 0, 0]]."""
    logps = torch.tensor([[-0.3, -1.2, -2.0], [-0.7, -0.1, -5.0]], dtype=D, requires_grad=True)
    loss, m = policy_loss(logps, None, t([2.0, -1.0]), t(M), ObjectiveConfig())
    loss.backward()
    assert m["ratio_mean"] == 1.0
    assert m["clip_frac_low"] == 0.0 and m["clip_frac_high"] == 0.0
    assert close(loss, -1.0)
    assert close(logps.grad, [[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]])


def test_metrics_are_token_means_and_loss_is_the_aggregate():
    """Same inputs with seq_mean_token_sum and num_seqs=4 (a micro-batch of a 4-sequence batch):
    per-token pg = -A = [[-2, -2, 0], [1, 0, 0]] masked; loss = (-4 + 1) / 4 = -0.75, but the
    pg_loss metric is this call's token mean (-2 - 2 + 1) / 3 = -1, so callers can average it."""
    logps = torch.zeros(2, 3, dtype=D, requires_grad=True)
    cfg = ObjectiveConfig(loss_agg_mode="seq_mean_token_sum")
    loss, m = policy_loss(logps, None, t([2.0, -1.0]), t(M), cfg, num_seqs=4)
    assert close(loss, -0.75) and m["loss"] == -0.75
    assert m["pg_loss"] == -1.0


# ---- config and errors -----------------------------------------------------------------------


def test_from_algo():
    from mmrl.config.schema import AlgoConfig

    algo = AlgoConfig(epsilon=0.1, epsilon_high=0.3, beta=0.04, kl_estimator="k2", loss_agg_mode="seq_mean_token_sum_norm")
    cfg = ObjectiveConfig.from_algo(algo, max_completion_length=64)
    assert cfg == ObjectiveConfig(epsilon=0.1, epsilon_high=0.3, beta=0.04, kl_estimator="k2",
                                  loss_agg_mode="seq_mean_token_sum_norm", max_completion_length=64)
    assert cfg.clip_high == 0.3
    assert ObjectiveConfig(epsilon=0.2).clip_high == 0.2


def test_from_real_algo_config():
    from mmrl.config.schema import AlgoConfig

    cfg = ObjectiveConfig.from_algo(AlgoConfig())
    assert cfg == ObjectiveConfig()


def test_every_loss_setting_of_the_algo_config_reaches_the_objective():
    """One source of truth: each LossConfig field set away from its default on the run's config
    arrives in the ObjectiveConfig (a renamed field would fail here, not fall back silently)."""
    from dataclasses import fields

    from mmrl.config.schema import AlgoConfig, LossConfig

    changed = {"loss_type": "gspo", "epsilon": 0.1, "epsilon_high": 0.3, "clip_pos": [0.1, 0.2],
               "clip_neg": [0.3, 0.4], "dual_clip_c": 3.0, "reg_scale": 5.0, "loss_agg_mode": "seq_mean_token_mean",
               "beta": 0.04, "kl_estimator": "k1", "entropy_coef": 0.01, "top_entropy_quantile": 0.2,
               "clip_cov_ratio": None, "clip_cov_lb": 2.0, "clip_cov_ub": 6.0, "kl_cov_ratio": None,
               "kl_cov_coef": 2.0, "kl_cov_clip": True, "off_policy_gamma": 0.2,
               "vllm_importance_sampling_correction": False, "vllm_importance_sampling_mode": "token_mask",
               "vllm_importance_sampling_clip_max": 3.0, "vllm_importance_sampling_clip_min": 0.5}
    assert set(changed) == {f.name for f in fields(LossConfig)}
    cfg = ObjectiveConfig.from_algo(AlgoConfig(**changed))
    for name, value in changed.items():
        got = getattr(cfg, name)
        assert (list(got) if isinstance(got, tuple) else got) == value, name


def test_bad_names_raise_with_valid_values():
    with pytest.raises(ValueError, match="seq_mean_token_sum_norm"):
        ObjectiveConfig(loss_agg_mode="sum")
    with pytest.raises(ValueError, match="k1, k2, k3"):
        ObjectiveConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="token_mean"):
        aggregate(t(L), t(M), "mean")
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(t([0.0]), t([0.0]), "kl")
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate(t(L), t(M), "seq_mean_token_sum_norm")


def test_closed_form_kl_replaces_the_estimator():
    """A policy-supplied per-action KL (diffusion: ||mu - mu_ref||^2 / 2 sigma^2) is added as
    beta * kl, and no ref_logps are needed. Ratio 1, A = 0: loss = beta * mean(kl)."""
    logps = torch.zeros(2, 2, requires_grad=True)
    kl = torch.tensor([[0.5, 1.5], [2.0, 0.0]])
    cfg = ObjectiveConfig(beta=0.1)
    loss, metrics = policy_loss(logps, None, torch.zeros(2), torch.ones(2, 2), cfg, kl=kl)
    assert abs(float(loss) - 0.1 * 1.0) < 1e-7  # mean(kl) = 4 / 4 = 1
    assert abs(metrics["kl"] - 1.0) < 1e-7
    loss0, metrics0 = policy_loss(logps, None, torch.zeros(2), torch.ones(2, 2), ObjectiveConfig(beta=0.0), kl=kl)
    assert float(loss0) == 0.0 and "kl" not in metrics0


def test_nft_goes_through_the_objective():
    """DiffusionNFT is a registered loss computed by the same objective, from the policy's
    positive / negative velocity errors (no log-probs). A = [2.5, -5], adv_max 5 -> optimality
    r = clip(A / 5 / 2 + 0.5) = [0.75, 0]; positive [0.4, 0.1], negative [1.2, 0.3] ->
    per action 0.75*0.4 + 0.25*1.2 = 0.6 and 0*0.1 + 1*0.3 = 0.3; token_mean 0.45."""
    inputs = {"positive": torch.tensor([[0.4], [0.1]]), "negative": torch.tensor([[1.2], [0.3]]), "adv_max": 5.0}
    loss, metrics = policy_loss(None, None, torch.tensor([2.5, -5.0]), torch.ones(2, 1),
                                ObjectiveConfig(loss_type="nft"), inputs=inputs)
    assert abs(float(loss) - 0.45) < 1e-7 and "ratio_mean" not in metrics


def test_the_likelihood_of_reference_completions_is_their_mean_nll():
    """mmrl sft's objective (ObjectiveConfig.reference_likelihood()), called as RL's is: logps
    [[-1, -2], [-3, -9]], the last token masked out, 3 tokens in the mini-batch:
    L = (1 + 2 + 3) / 3 = 2 and dL/dlogp = -1/3 on each kept token, 0 on the masked one; the
    advantages, the old log-probs and the reference play no part, and ``loss`` is the only metric.
    As one micro-batch of a 6-token mini-batch it is half that: (1 + 2 + 3) / 6 = 1."""
    cfg = ObjectiveConfig.reference_likelihood()
    logps = t([[-1.0, -2.0], [-3.0, -9.0]]).requires_grad_(True)
    mask = t([[1, 1], [1, 0]])
    loss, metrics = policy_loss(logps, t([[5.0, 5.0], [5.0, 5.0]]), t([7.0, -7.0]), mask, cfg,
                                ref_logps=torch.zeros(2, 2, dtype=D), num_tokens=3.0, num_seqs=2.0)
    loss.backward()
    assert close(loss, 2.0) and metrics == {"loss": 2.0}
    assert close(logps.grad, [[-1 / 3, -1 / 3], [-1 / 3, 0.0]])
    half, _ = policy_loss(logps.detach(), None, t([0.0, 0.0]), mask, cfg, num_tokens=6.0, num_seqs=2.0)
    assert close(half, 1.0)
