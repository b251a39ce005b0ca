"""Each piece of the policy loss alone, on small hand-worked numbers (mmrl.core.losses): the ratios,
the clip modes, the surrogates' helpers, the penalties, the aggregation modes and the metrics; then
the objective as their composition."""

import math

import pytest
import torch

from conftest import close, f64 as t

from mmrl.core.losses import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    GaussianActions,
    Objective,
    ObjectiveConfig,
    Surrogate,
    TokenSelection,
    aggregate,
    count_sequences,
    policy_loss,
)
from mmrl.core.losses.clipping import clip_bounds, clip_events, clipped_surrogate
from mmrl.core.losses.metrics import loss_metrics
from mmrl.core.losses.penalties import entropy_bonus, gaussian_kl, kl_cov_penalty, kl_penalty, reference_kl
from mmrl.core.losses.ratios import gspo_ratio, rollout_is_weight, seq_mean, token_ratio
from mmrl.core.losses.surrogates import cispo_loss, off_policy_rows, reg_grpo_loss, shape_off_policy_rows
from mmrl.registry import register_loss

# ---- ratios -------------------------------------------------------------------------------------


def test_token_ratio():
    # exp(-1.0 - -1.5) = e^0.5 = 1.6487213 ; exp(0) = 1
    assert close(token_ratio(t([-1.0, -2.0]), t([-1.5, -2.0])), [1.6487213, 1.0])


def test_seq_mean_skips_padding_and_empty_rows():
    # row 0: (1 + 2) / 2 = 1.5 ; row 1 has no tokens: 0
    assert close(seq_mean(t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), t([[1, 1, 0], [0, 0, 0]])), [1.5, 0.0])


def test_gspo_ratio_value_and_gradient():
    # log-ratios [0.2, 0.6] -> mean 0.4 -> s = e^0.4 = 1.4918247 on both tokens; d s_t / d logp_t = s
    logps = t([[-1.0, -2.0]]).requires_grad_(True)
    ratio = gspo_ratio(logps, t([[-1.2, -2.6]]), t([[1, 1]]))
    assert close(ratio, [[1.4918247, 1.4918247]])
    ratio.sum().backward()
    assert close(logps.grad, [[1.4918247, 1.4918247]])
    # the padded token is left out of the mean: e^0.2 = 1.2214028
    assert close(gspo_ratio(t([[-1.0, -2.0]]), t([[-1.2, -2.6]]), t([[1, 0]])), [[1.2214028, 1.2214028]])


def test_rollout_is_weight_ignores_padding_and_unreported_log_probs():
    # token 0: engine log-prob NaN (not reported) -> weight 1; token 1 is padding -> weight 1
    cfg = ObjectiveConfig()  # token_truncate, clip_max 2
    w = rollout_is_weight(t([[0.0, 0.0]]), t([[float("nan"), -5.0]]), t([[1, 0]]), cfg)
    assert close(w, [[1.0, 1.0]])
    # sequence_truncate: the padded -9 is left out of the sum: exp(0.5) = 1.6487213 < 2
    seq = ObjectiveConfig(vllm_importance_sampling_mode="sequence_truncate")
    assert close(rollout_is_weight(t([[0.0, 0.0]]), t([[-0.5, -9.0]]), t([[1, 0]]), seq), [[1.6487213]])


# ---- clip modes ---------------------------------------------------------------------------------


def test_clip_bounds_default_and_asymmetric():
    assert clip_bounds(t([[1.0]]), 0.2, 0.28) == pytest.approx((0.8, 1.28))
    # A >= 0 uses clip_pos = (0.1, 0.5): [0.9, 1.5]; A < 0 falls back to (0.2, 0.2): [0.8, 1.2]
    low, high = clip_bounds(t([[1.0], [-1.0]]), 0.2, 0.2, clip_pos=(0.1, 0.5))
    assert close(low, [[0.9], [0.8]]) and close(high, [[1.5], [1.2]])


def test_clipped_surrogate_and_dual_clip():
    # bounds [0.8, 1.2]: ratio 1.5, A 1 -> -min(1.5, 1.2) = -1.2 ; ratio 0.5, A -1 -> -min(-0.5, -0.8) = 0.8 ;
    # ratio 1.1, A 1 -> -1.1 (inside the bounds)
    pg, dual = clipped_surrogate(t([1.5, 0.5, 1.1]), t([1.0, -1.0, 1.0]), 0.8, 1.2)
    assert close(pg, [-1.2, 0.8, -1.1]) and dual is None
    # dual-clip c = 3: ratio 5, A -1 -> PPO's -min(-5, -1.2) = 5, capped at 3 * |A| = 3, no gradient
    ratio = t([5.0, 0.5]).requires_grad_(True)
    pg, dual = clipped_surrogate(ratio, t([-1.0, -1.0]), 0.8, 1.2, dual_clip_c=3.0)
    assert close(pg, [3.0, 0.8]) and dual.tolist() == [True, False]
    pg.sum().backward()
    assert ratio.grad.tolist() == [0.0, 0.0]  # token 1 is clipped at the low bound too


def test_clip_events():
    # bounds [0.8, 1.2], A < 0: ratio 0.7 is held at the low bound, 1.3 is not (the PPO min lets it through)
    low, high = clip_events(t([0.7, 1.3]), t([-1.0, -1.0]), 0.8, 1.2)
    assert low.tolist() == [True, False] and high.tolist() == [False, False]
    low, high = clip_events(t([0.7, 1.3]), t([-1.0, -1.0]), 0.8, 1.2, both_sides=True)  # CISPO
    assert low.tolist() == [True, False] and high.tolist() == [False, True]


# ---- surrogates' helpers ------------------------------------------------------------------------


def test_cispo_keeps_the_gradient_of_a_clipped_token():
    # ratio e^0.5 = 1.6487 -> w = clamp(., 0, 1.2) = 1.2 (detached); A = 2: value -2 * 1.2 = -2.4,
    # gradient -A * w = -2.4 although the token is clipped
    logps = t([[0.5]]).requires_grad_(True)
    loss = cispo_loss(token_ratio(logps, t([[0.0]])), logps, t([[2.0]]), 0.0, 1.2)
    assert close(loss, [[-2.4]])
    loss.sum().backward()
    assert close(logps.grad, [[-2.4]])


def test_reg_grpo_loss_by_hand():
    # r = mean(0.2, 0.4) = 0.3, A = 1, reg_scale 2: 0.5 * 2 * (0.3 - 1/2)^2 = 0.04 on every token
    assert close(reg_grpo_loss(t([[0.2, 0.4]]), t([[0.0, 0.0]]), t([[1.0]]), t([[1, 1]]), 2.0), [[0.04, 0.04]])


def test_off_policy_rows_and_their_shaped_loss():
    assert off_policy_rows(None, t([[0.0]])) is None
    rows = off_policy_rows(torch.tensor([False, True]), t([[0.0], [0.0]]))
    assert rows.tolist() == [[False], [True]]
    with pytest.raises(ValueError, match=r"off_policy must have shape \(B,\) = \(2,\), got \(3,\)"):
        off_policy_rows(torch.tensor([False, True, True]), t([[0.0], [0.0]]))
    # row 1: p = exp(0) = 1, gamma 0.1, A 1 -> -1 / 1.1 = -0.9090909 ; row 0 keeps its pg
    pg = shape_off_policy_rows(t([[0.3], [0.3]]), t([[0.0], [0.0]]), t([[1.0], [1.0]]), rows, 0.1)
    assert close(pg, [[0.3], [-0.9090909]])
    assert shape_off_policy_rows(t([[0.3]]), t([[0.0]]), t([[1.0]]), torch.tensor([[False]]), 0.1).tolist() == [[0.3]]


# ---- penalties ----------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    # log_ratio = ref - logp = -1: k1 = 1, k2 = 0.5, k3 = e^-1 - 1 + 1 = 0.3678794
    expected = {"k1": 1.0, "k2": 0.5, "k3": 0.3678794}
    assert set(expected) == set(KL_ESTIMATORS)
    for name, value in expected.items():
        assert close(kl_penalty(t([0.0]), t([-1.0]), name), [value]), name
    # k3 clamps: log-ratio +30 -> 20 -> e^20 - 21 -> at most 10 ; -30 -> -20 -> 19.0 -> 10
    assert kl_penalty(t([0.0, 0.0]), t([30.0, -30.0]), "k3").tolist() == [10.0, 10.0]


def test_gaussian_kl_by_hand():
    # ||mu - mu_ref||^2 as a mean over the event: (0.04 + 0.16) / 2 = 0.1 ; / (2 * 0.5^2) = 0.2
    assert close(gaussian_kl(t([[[0.2, 0.4]]]), t([[[0.0, 0.0]]]), t([[0.5]])), [[0.2]])
    # no event dims: (0.3 - 0.1)^2 / (2 * 0.1^2) = 0.04 / 0.02 = 2
    assert close(gaussian_kl(t([[0.3]]), t([[0.1]]), t([[0.1]])), [[2.0]])


def test_reference_kl_picks_its_source():
    logps, ref = t([[0.0]]), t([[-1.0]])
    assert reference_kl(ObjectiveConfig(beta=0.0), logps, ref) is None  # no KL term at all
    cfg = ObjectiveConfig(beta=0.1, kl_estimator="k1")
    assert close(reference_kl(cfg, logps, ref), [[1.0]])  # k1 = -(ref - logp) = 1
    g = GaussianActions(t([[[0.2, 0.4]]]), t([[[0.0, 0.0]]]), t([[0.5]]))
    assert close(reference_kl(cfg, logps, ref, gaussians=g), [[0.2]])  # the closed form wins over ref_logps
    assert close(reference_kl(cfg, logps, ref, kl=t([[7.0]]), gaussians=g), [[7.0]])  # the caller's wins over both
    with pytest.raises(ValueError, match="needs ref_logps"):
        reference_kl(cfg, logps)


def test_kl_cov_and_entropy_terms():
    # |logp - old| = [0.5, 0.5] on the selected token only, coef 2 -> [1.0, 0.0]
    assert close(kl_cov_penalty(t([-1.0, -2.0]), t([-1.5, -1.5]), torch.tensor([True, False]), 2.0), [1.0, 0.0])
    assert close(entropy_bonus(t([0.5, 2.0]), 0.1), [-0.05, -0.2])


# ---- aggregation --------------------------------------------------------------------------------

L = [[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [5.0, 5.0, 5.0]]
M = [[1, 1, 1], [1, 0, 0], [0, 0, 0]]  # masked sums: 6, 4, 0 ; 4 tokens ; 2 non-empty rows


@pytest.mark.parametrize("mode, this_call, mini_batch", [
    ("token_mean", 10 / 4, 10 / 8),                        # sum / num_tokens
    ("seq_mean_token_sum", 10 / 2, 10 / 4),                # sum / num_seqs
    ("seq_mean_token_mean", (6 / 3 + 4 / 1) / 2, 6 / 4),   # sum_i (sum_i / len_i) / num_seqs
    ("seq_mean_token_sum_norm", 10 / (2 * 4), 10 / (4 * 4)),  # sum / (num_seqs * max_len 4)
])
def test_each_aggregation_mode(mode, this_call, mini_batch):
    assert mode in LOSS_AGG_MODES
    out = aggregate(t(L), t(M), mode, max_completion_length=4)
    assert close(out, this_call)
    # the mini-batch's normalisers (8 tokens, 4 sequences) passed to one of its micro-batches
    assert close(aggregate(t(L), t(M), mode, num_tokens=8, num_seqs=4, max_completion_length=4), mini_batch)
    assert float(aggregate(t(L), torch.zeros(3, 3), mode, max_completion_length=4)) == 0.0  # empty: 0, not NaN


def test_count_sequences_counts_rows_with_an_action():
    assert count_sequences(t(M)) == 2.0


# ---- metrics ------------------------------------------------------------------------------------


def test_loss_metrics_count_clip_events_of_on_policy_rows():
    # both rows: token 0 held at the high bound (A 1, ratio 1.5), token 1 at the low one (A -1, ratio 0.5);
    # row 1 is off-policy, so each fraction is 1 of the 4 tokens
    ratio = t([[1.5, 0.5], [1.5, 0.5]])
    adv = t([[1.0, -1.0], [1.0, -1.0]])
    sur = Surrogate(pg=t([[-1.2, 0.8], [-1.2, 0.8]]), clip_ratio=ratio, low=0.8, high=1.2)
    m = loss_metrics(sur, t([[0.0, 0.0]] * 2), t([[0.0, 0.0]] * 2), adv, t([[1, 1], [1, 1]]), sur.pg, t(0.3),
                     kl=t([[0.5, 1.5], [0.0, 2.0]]), off_rows=torch.tensor([[False], [True]]), is_weight=t([[2.0], [1.0]]))
    assert m == pytest.approx({"ratio_mean": 1.0, "clip_frac_low": 0.25, "clip_frac_high": 0.25, "off_policy_frac": 0.5,
                               "pg_loss": -0.2, "loss": 0.3, "kl": 1.0, "rollout_is_ratio": 1.5})


# ---- the composition ----------------------------------------------------------------------------


def test_policy_loss_composes_the_pieces():
    """One row, two tokens, ratio 1 (one iteration), A = 1 -> pg = [-1, -1];
    rho = exp(old - rollout) = [e^0.5, 1] = [1.6487213, 1]; selection keeps token 0 -> w pg rho = [-1.6487213, 0];
    k1 = logp - ref = [0, 2], beta 0.1 -> [0, 0.2]; entropy bonus -0.5 H = [-0.2, -0.5];
    per token [-1.8487213, -0.3] -> token_mean -1.07436065.
    d/d logp: token 0 (-1.6487213 + 0.1) / 2 = -0.77436065; token 1 (0 + 0.1) / 2 = 0.05."""
    cfg = ObjectiveConfig(beta=0.1, kl_estimator="k1", entropy_coef=0.5)
    logps = t([[-1.0, -1.0]]).requires_grad_(True)
    loss, m = policy_loss(logps, None, t([1.0]), t([[1, 1]]), cfg, ref_logps=t([[-1.0, -3.0]]),
                          rollout_logps=t([[-1.5, -1.0]]), entropies=t([[0.4, 1.0]]),
                          selection=TokenSelection(entropy_keep=torch.tensor([[True, False]])))
    assert close(loss.detach(), -1.07436065)
    loss.backward()
    assert close(logps.grad, [[-0.77436065, 0.05]])
    assert m == pytest.approx({"ratio_mean": 1.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0, "pg_loss": -0.82436065,
                               "loss": -1.07436065, "kl": 1.0, "entropy": 0.7, "entropy_keep_frac": 0.5,
                               "rollout_is_ratio": 1.32436065})


def test_policy_loss_takes_the_closed_form_kl_of_gaussian_actions():
    """KL = mean(mu^2) / (2 * 0.5^2) = mu_1^2 + mu_2^2 = 0.2, beta 0.1, A = 0 -> loss 0.02;
    d loss / d mu = beta * 2 mu = [0.04, 0.08] (the gradient flows through the policy's mean)."""
    mean = t([[[0.2, 0.4]]]).requires_grad_(True)
    loss, m = policy_loss(t([[0.0]]), None, t([0.0]), t([[1]]), ObjectiveConfig(beta=0.1),
                          gaussians=GaussianActions(mean, t([[[0.0, 0.0]]]), t([[0.5]])))
    assert close(loss.detach(), 0.02) and m["kl"] == pytest.approx(0.2)
    loss.backward()
    assert close(mean.grad, [[[0.04, 0.08]]])


def _weighted_pg(logps, old_logps, advantages, mask, cfg, *, weights):
    """A plugin loss with an input of its own: -A * w * ratio."""
    return Surrogate(-advantages * weights * token_ratio(logps, old_logps))


def test_a_plugin_loss_gets_its_declared_inputs():
    register_loss("test_weighted_pg", requires=("logps", "test_weights"))(_weighted_pg)
    cfg = ObjectiveConfig(loss_type="test_weighted_pg")
    assert cfg.requires == ("logps", "test_weights") and Objective(cfg).requires == cfg.requires
    # ratio 1, A = 2, weights [0.5, 1.5] -> pg [-1, -3] -> token_mean -2
    loss, m = Objective(cfg)(t([[0.0, 0.0]]), None, t([2.0]), t([[1, 1]]), inputs={"weights": t([[0.5, 1.5]])})
    assert close(loss.detach(), -2.0) and "clip_frac_low" not in m


def test_config_says_what_the_policy_computes():
    assert ObjectiveConfig().requires == ("logps",)
    assert ObjectiveConfig(loss_type="gspo").requires == ("logps", "whole_sequences")
    assert not ObjectiveConfig().needs_reference and ObjectiveConfig(beta=0.01).needs_reference
    assert math.isclose(ObjectiveConfig(epsilon=0.2).clip_high, 0.2)
