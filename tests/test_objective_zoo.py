"""Hand-worked checks of the policy-optimisation zoo: ObjectiveConfig options of policy_loss
(mmrl.core.losses) and their helpers (mmrl.core.losses)."""

import math

import pytest
import torch

from conftest import close, f64

from mmrl.registry import LOSSES

from mmrl.core.losses import (
    LOSS_AGG_MODES,
    ObjectiveConfig,
    TokenSelection,
    count_sequences,
    policy_loss,
    select_tokens,
)
from mmrl.core.losses import token_covariance

D = torch.float64
t = f64

# Every registered loss over log-probs (nft is likelihood-free: tested in test_objective.py).
SURROGATE_LOSS_TYPES = [t for t in LOSSES.names() if t != "nft"]


def run(logps, adv, cfg, old=0.0, mask=None, **kw):
    """policy_loss on (B, T) ``logps`` with old_logps = ``old`` (a number, a nested list, or None
    for a single iteration); returns (loss, d loss / d logps, metrics)."""
    logps = t(logps).requires_grad_(True)
    if old is None:
        old_t = None
    elif isinstance(old, float):
        old_t = torch.full_like(logps, old).detach()
    else:
        old_t = t(old)
    mask = torch.ones_like(logps) if mask is None else t(mask)
    loss, metrics = policy_loss(logps, old_t, t(adv), mask, cfg, **kw)
    loss.backward()
    return loss, logps.grad, metrics


SMTM = "seq_mean_token_mean"


def test_defaults_are_off():
    cfg = ObjectiveConfig()
    assert cfg.loss_type == "clip" and cfg.dual_clip_c is None
    assert cfg.clip_pos is None and cfg.clip_neg is None and cfg.entropy_coef == 0.0
    assert cfg.top_entropy_quantile is None and cfg.clip_cov_ratio is None and cfg.kl_cov_ratio is None
    assert not cfg.needs_entropy and not cfg.needs_selection
    assert ObjectiveConfig(entropy_coef=0.01).needs_entropy
    assert ObjectiveConfig(top_entropy_quantile=0.2).needs_entropy
    assert ObjectiveConfig(kl_cov_ratio=2e-3).needs_selection


# ---- GSPO ------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_is_length_normalised():
    """GSPO, A = +1, eps 0.2, one sequence of 2 real tokens (+1 padding slot with a junk logp 5):
    log-ratios [0.6, -0.4] -> s = exp((0.6 - 0.4) / 2) = e^0.1 = 1.1051709 <= 1.2, not clipped.
    Every token has the value s: loss = -s = -1.1051709 (seq_mean_token_mean), and
    d l / d logp_t = -A * s / |y| = -0.5525855 for both real tokens, 0 for the padding.
    Token-level PPO on the same tokens instead clips the outlier token (ratio e^0.6 = 1.822 ->
    -1.2, no gradient) and keeps e^-0.4 = 0.67032: loss (-1.2 - 0.67032) / 2 = -0.93516,
    grad [0, -0.33516] -- one noisy token decides; GSPO looks at the whole sequence.
    """
    logps, mask = [[0.6, -0.4, 5.0]], [[1.0, 1.0, 0.0]]
    s = math.exp(0.1)
    loss, grad, m = run(logps, [1.0], ObjectiveConfig(loss_type="gspo", loss_agg_mode=SMTM), mask=mask)
    assert close(loss, -s) and close(grad, [[-s / 2, -s / 2, 0.0]])
    assert close(m["seq_ratio_mean"], s) and m["clip_frac_high"] == 0.0
    assert close(m["ratio_mean"], (math.exp(0.6) + math.exp(-0.4)) / 2)  # token ratios, as for clip
    loss, grad, _ = run(logps, [1.0], ObjectiveConfig(loss_agg_mode=SMTM), mask=mask)
    assert close(loss, (-1.2 - math.exp(-0.4)) / 2) and close(grad, [[0.0, -math.exp(-0.4) / 2, 0.0]])


def test_gspo_clips_the_whole_sequence():
    """log-ratios [0.3, 0.3]: s = e^0.3 = 1.34986 > 1.2 with A = +1 -> loss -1.2, no gradient on
    any token, clip_frac_high 1. A = -1 with log-ratios [-0.5, -0.1]: s = e^-0.3 = 0.74082 < 0.8
    -> loss +0.8, no gradient, clip_frac_low 1."""
    cfg = ObjectiveConfig(loss_type="gspo", loss_agg_mode=SMTM)
    loss, grad, m = run([[0.3, 0.3]], [1.0], cfg)
    assert close(loss, -1.2) and close(grad, [[0.0, 0.0]]) and m["clip_frac_high"] == 1.0
    loss, grad, m = run([[-0.5, -0.1]], [-1.0], cfg)
    assert close(loss, 0.8) and close(grad, [[0.0, 0.0]]) and m["clip_frac_low"] == 1.0


def test_gspo_on_policy_equals_grpo():
    """old_logps=None: s = 1 exactly, so GSPO's loss and gradient equal the clipped surrogate's
    (-A per token), in every aggregation mode."""
    g = torch.Generator().manual_seed(3)
    logps = -torch.rand(4, 5, generator=g, dtype=D)
    adv = torch.randn(4, generator=g, dtype=D)
    mask = (torch.arange(5) < torch.tensor([5, 3, 1, 4])[:, None]).to(D)
    for mode in LOSS_AGG_MODES:
        out = []
        for lt in ("clip", "gspo"):
            x = logps.clone().requires_grad_(True)
            cfg = ObjectiveConfig(loss_type=lt, loss_agg_mode=mode, max_completion_length=5)
            loss, _ = policy_loss(x, None, adv, mask, cfg)
            out.append((loss, torch.autograd.grad(loss, x)[0]))
        assert torch.allclose(out[0][0], out[1][0]) and torch.allclose(out[0][1], out[1][1])


# ---- Reg-GRPO --------------------------------------------------------------------------------


def test_reg_grpo_regresses_without_vanishing_gradient():
    """reg_scale 10, A = +1, log-ratios [0.2, 0.4]: r = 0.3, target A / 10 = 0.1.
    l = (10 / 2) * (0.3 - 0.1)^2 = 0.2; d l / d r = 10 * (0.3 - 0.1) = 2; d r / d logp_t = 1/2
    -> grad [1, 1]: positive, i.e. descent pulls the overshooting sequence back.
    The clipped surrogate has both token ratios (1.221, 1.492) above 1.2: gradient 0 (vanishes).
    """
    cfg = ObjectiveConfig(loss_type="reg_grpo", reg_scale=10.0, loss_agg_mode=SMTM)
    loss, grad, m = run([[0.2, 0.4]], [1.0], cfg)
    assert close(loss, 0.2) and close(grad, [[1.0, 1.0]])
    assert "clip_frac_low" not in m and "clip_frac_high" not in m
    _, grad, _ = run([[0.2, 0.4]], [1.0], ObjectiveConfig(loss_agg_mode=SMTM))
    assert close(grad, [[0.0, 0.0]])
    # at the target r = A / reg_scale = 0.1: zero loss, zero gradient
    loss, grad, _ = run([[0.1, 0.1]], [1.0], cfg)
    assert close(loss, 0.0) and close(grad, [[0.0, 0.0]])


def test_reg_grpo_on_policy_gradient_is_grpo():
    """old_logps=None (r = 0), A = [2, -1], m = [[1, 1, 0], [1, 0, 0]], reg_scale 10:
    l_i = A_i^2 / (2 * 10) = [0.2, 0.05] -> seq_mean_token_mean loss (0.2 + 0.05) / 2 = 0.125.
    grad = -A_i / |y_i| / 2 seqs: row 0: -2 / 2 / 2 = -0.5 (x2 tokens), row 1: 1 / 1 / 2 = 0.5,
    exactly the clipped surrogate's on-policy gradient in the same mode."""
    mask = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    logps = [[-0.3, -1.2, -2.0], [-0.7, -0.1, -5.0]]
    cfg = ObjectiveConfig(loss_type="reg_grpo", loss_agg_mode=SMTM)
    loss, grad, _ = run(logps, [2.0, -1.0], cfg, old=None, mask=mask)
    assert close(loss, 0.125) and close(grad, [[-0.5, -0.5, 0.0], [0.5, 0.0, 0.0]])
    _, clip_grad, _ = run(logps, [2.0, -1.0], ObjectiveConfig(loss_agg_mode=SMTM), old=None, mask=mask)
    assert close(grad, clip_grad)


def test_reg_grpo_per_token_advantages_use_the_sequence_mean():
    """(B, T) advantages [[3, 1]] -> A_seq = 2 (masked mean); on-policy l = 4 / 20 = 0.2."""
    cfg = ObjectiveConfig(loss_type="reg_grpo", loss_agg_mode=SMTM)
    loss, _, _ = run([[-1.0, -2.0]], [[3.0, 1.0]], cfg, old=None)
    assert close(loss, 0.2)


# ---- CISPO -----------------------------------------------------------------------------------


def test_cispo_keeps_gradient_of_clipped_tokens():
    """eps 0.2, eps_high 0.28. ratio 1.5, A = +1: weight w = clamp(1.5) = 1.28 (detached);
    loss -A * w = -1.28, gradient -A * w = -1.28 -- PPO would give this token no gradient.
    ratio 1.5, A = -1: loss +1.28, gradient +1.28 (PPO: 1.5, unbounded).
    With epsilon = 1 (no lower bound, as MiniMax-M1) ratio 0.5, A = -1: w = 0.5 -> grad 0.5."""
    cfg = ObjectiveConfig(loss_type="cispo", epsilon=0.2, epsilon_high=0.28)
    loss, grad, m = run([[math.log(1.5)]], [1.0], cfg)
    assert close(loss, -1.28) and close(grad, [[-1.28]]) and m["clip_frac_high"] == 1.0
    _, ppo_grad, _ = run([[math.log(1.5)]], [1.0], ObjectiveConfig(epsilon=0.2, epsilon_high=0.28))
    assert close(ppo_grad, [[0.0]])
    loss, grad, _ = run([[math.log(1.5)]], [-1.0], cfg)
    assert close(loss, 1.28) and close(grad, [[1.28]])
    loss, grad, m = run([[math.log(0.5)]], [-1.0], ObjectiveConfig(loss_type="cispo", epsilon=1.0))
    assert close(loss, 0.5) and close(grad, [[0.5]]) and m["clip_frac_low"] == 0.0


# ---- asymmetric and dual clip ----------------------------------------------------------------


def test_asymmetric_clip_positive_and_negative():
    """Two tokens, per-token A [+1, -1], ratios [1.3, 0.85], token_mean.
    Default eps 0.2: 1.3 > 1.2 clipped (-1.2, grad 0); 0.85 >= 0.8 free (0.85, grad 0.85 / 2)
    -> loss (-1.2 + 0.85) / 2 = -0.175, grad [0, 0.425].
    clip_pos (0.2, 0.4), clip_neg (0.1, 0.2): A > 0 bound 1.4 frees 1.3 (-1.3, grad -0.65);
    A < 0 bound 0.9 clips 0.85 (0.9, grad 0) -> loss (-1.3 + 0.9) / 2 = -0.2, grad [-0.65, 0],
    clip_frac_low 0.5. Only clip_pos given: the negative side keeps eps 0.2 -> 0.85 free."""
    logps, adv = [[math.log(1.3), math.log(0.85)]], [[1.0, -1.0]]
    loss, grad, _ = run(logps, adv, ObjectiveConfig())
    assert close(loss, -0.175) and close(grad, [[0.0, 0.425]])
    cfg = ObjectiveConfig(clip_pos=(0.2, 0.4), clip_neg=(0.1, 0.2))
    loss, grad, m = run(logps, adv, cfg)
    assert close(loss, -0.2) and close(grad, [[-0.65, 0.0]])
    assert m["clip_frac_low"] == 0.5 and m["clip_frac_high"] == 0.0
    loss, grad, _ = run(logps, adv, ObjectiveConfig(clip_pos=[0.2, 0.4]))
    assert close(loss, (-1.3 + 0.85) / 2) and close(grad, [[-0.65, 0.425]])
    assert ObjectiveConfig(clip_pos=[0.2, 0.4]).clip_pos == (0.2, 0.4)  # YAML lists accepted
    with pytest.raises(ValueError, match="clip_neg"):
        ObjectiveConfig(clip_neg=(0.1,))


def test_dual_clip_caps_negative_advantage_loss():
    """c = 3, eps 0.2, ratios [5, 2, 5], per-token A [-1, -1, +1], token_mean over 3:
    token 0: PPO loss |A| * max(5, 1.2) = 5 -> min(5, 3 * 1) = 3, no gradient (dual-clipped);
    token 1: 2 < 3 unchanged, gradient -A * ratio = 2;
    token 2: A > 0 untouched: clipped at 1.2 -> -1.2, gradient 0.
    loss (3 + 2 - 1.2) / 3 = 1.266667, grad [0, 2/3, 0], clip_frac_dual 1/3.
    Without dual-clip: (5 + 2 - 1.2) / 3 and grad [5/3, 2/3, 0] -- one stale token dominates."""
    logps, adv = [[math.log(5.0), math.log(2.0), math.log(5.0)]], [[-1.0, -1.0, 1.0]]
    loss, grad, m = run(logps, adv, ObjectiveConfig(dual_clip_c=3.0))
    assert close(loss, 3.8 / 3) and close(grad, [[0.0, 2 / 3, 0.0]])
    assert close(m["clip_frac_dual"], 1 / 3)
    loss, grad, m = run(logps, adv, ObjectiveConfig())
    assert close(loss, 5.8 / 3) and close(grad, [[5 / 3, 2 / 3, 0.0]]) and "clip_frac_dual" not in m
    with pytest.raises(ValueError, match="> 1"):
        ObjectiveConfig(dual_clip_c=1.0)
    with pytest.raises(ValueError, match="dual_clip_c"):
        ObjectiveConfig(dual_clip_c=3.0, loss_type="cispo")


# ---- entropy ---------------------------------------------------------------------------------


def test_entropy_bonus():
    """On-policy, A = +1, 2 tokens, entropies [0.5, 1.5], entropy_coef 0.01, token_mean:
    loss = -1 - 0.01 * mean(H) = -1.01; d loss / d H_t = -0.01 / 2 = -0.005; metric entropy 1.0.
    Without entropies the config that needs them raises."""
    cfg = ObjectiveConfig(entropy_coef=0.01)
    ent = t([[0.5, 1.5]]).requires_grad_(True)
    loss, m = policy_loss(t([[-1.0, -2.0]]), None, t([1.0]), torch.ones(1, 2), cfg, entropies=ent)
    loss.backward()
    assert close(loss, -1.01) and close(ent.grad, [[-0.005, -0.005]]) and m["entropy"] == 1.0
    with pytest.raises(ValueError, match="entropies"):
        policy_loss(t([[-1.0]]), None, t([1.0]), torch.ones(1, 1), cfg)


ENT = [[0.1, 0.9, 0.3, 0.4, 0.5, 5.0], [0.6, 0.7, 0.8, 1.0, 0.2, 0.0]]
ENT_MASK = [[1.0] * 5 + [0.0], [1.0] * 5 + [0.0]]


def test_top_entropy_quantile_selection():
    """10 real tokens with entropies 0.1 .. 1.0 (padding slots hold 5.0 and 0.0), q = 0.2:
    tau = quantile(H[mask], 0.8) = sorted[7] + 0.2 * (sorted[8] - sorted[7]) = 0.8 + 0.02 = 0.82
    -> keep the tokens with 0.9 (row 0, col 1) and 1.0 (row 1, col 3). The padding 5.0 is
    neither kept nor counted (with it, tau would be 0.88 and 5.0 would be "selected")."""
    cfg = ObjectiveConfig(top_entropy_quantile=0.2)
    zeros = torch.zeros(2, 6, dtype=D)
    sel = select_tokens(cfg, zeros, None, t([1.0, 1.0]), t(ENT_MASK), entropies=t(ENT))
    expected = torch.zeros(2, 6, dtype=torch.bool)
    expected[0, 1] = expected[1, 3] = True
    assert torch.equal(sel.entropy_keep, expected)
    assert sel.clip_cov is None and sel.kl_cov is None


def test_top_entropy_gradient_keeps_full_normaliser():
    """On-policy, A = [2, -1], same entropies, token_mean: pg = -A on the 2 kept tokens only,
    but the normaliser stays the 10 real tokens (as in the paper's objective):
    loss = (-2 + 1) / 10 = -0.1; grad -2/10 = -0.2 at (0, 1), +1/10 = 0.1 at (1, 3), 0 elsewhere.
    entropy_keep_frac = 2 / 10."""
    cfg = ObjectiveConfig(top_entropy_quantile=0.2)
    logps = torch.zeros(2, 6, dtype=D, requires_grad=True)
    loss, m = policy_loss(logps, None, t([2.0, -1.0]), t(ENT_MASK), cfg, entropies=t(ENT))
    loss.backward()
    expected = torch.zeros(2, 6, dtype=D)
    expected[0, 1], expected[1, 3] = -0.2, 0.1
    assert close(loss, -0.1) and close(logps.grad, expected)
    assert close(m["entropy_keep_frac"], 0.2) and close(m["pg_loss"], -0.1)


# ---- Clip-Cov / KL-Cov -------------------------------------------------------------------------

# mean(logp) = (-0.5 - 4 - 1 - 3 - 6 - 0.5) / 6 = -2.5; A = [+1, -1] -> mean(A) = 0
COV_LOGPS = [[-0.5, -4.0, -1.0], [-3.0, -6.0, -0.5]]
COV_ADV = [1.0, -1.0]
COV = [[2.0, -1.5, 1.5], [0.5, 3.5, -2.0]]  # (logp + 2.5) * A


def test_token_covariance_by_hand():
    """cov_t = (logp_t - (-2.5)) * (A_t - 0): row 0 (A=+1): [2, -1.5, 1.5]; row 1 (A=-1):
    -[-0.5, -3.5, 2] = [0.5, 3.5, -2]."""
    cov = token_covariance(t(COV_LOGPS), t(COV_ADV).unsqueeze(-1), torch.ones(2, 3, dtype=D))
    assert close(cov, COV)


def test_clip_cov_selection():
    """Candidates 1 < cov < 5: (0,0)=2, (0,2)=1.5, (1,1)=3.5.
    clip_cov_ratio 0.5 -> k = max(int(0.5 * 6), 1) = 3: all three, whatever the generator.
    clip_cov_ratio 2e-4 -> k = 1: one candidate at random, the same for the same seed.
    A PPO-clipped token is no candidate: old logp of (0,0) = -1 -> ratio e^0.5 = 1.65 > 1.2
    with A > 0 -> only (0,2) and (1,1) remain."""
    logps, adv, mask = t(COV_LOGPS), t(COV_ADV), torch.ones(2, 3, dtype=D)
    cand = torch.tensor([[True, False, True], [False, True, False]])
    sel = select_tokens(ObjectiveConfig(clip_cov_ratio=0.5), logps, None, adv, mask)
    assert torch.equal(sel.clip_cov, cand) and sel.entropy_keep is None

    cfg = ObjectiveConfig(clip_cov_ratio=2e-4)
    picks = set()
    for seed in range(8):
        a = select_tokens(cfg, logps, None, adv, mask, generator=torch.Generator().manual_seed(seed))
        b = select_tokens(cfg, logps, None, adv, mask, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(a.clip_cov, b.clip_cov) and int(a.clip_cov.sum()) == 1
        assert bool((a.clip_cov <= cand).all())
        picks.add(tuple(a.clip_cov.nonzero()[0].tolist()))
    assert len(picks) > 1

    old = logps.clone()
    old[0, 0] = -1.0
    sel = select_tokens(ObjectiveConfig(clip_cov_ratio=0.5), logps, old, adv, mask)
    assert torch.equal(sel.clip_cov, torch.tensor([[False, False, True], [False, True, False]]))


def test_clip_cov_gradient():
    """On-policy, clip_cov_ratio 0.5: (0,0), (0,2), (1,1) get no policy gradient (and no loss).
    The rest: pg = -A, token_mean over all 6 tokens: loss = (-1 + 1 + 1) / 6 = 1/6;
    grad (0,1) = -1/6, (1,0) = (1,2) = +1/6. clip_cov_frac = 3/6."""
    loss, grad, m = run(COV_LOGPS, COV_ADV, ObjectiveConfig(clip_cov_ratio=0.5), old=None)
    assert close(loss, 1 / 6)
    assert close(grad, [[0.0, -1 / 6, 0.0], [1 / 6, 0.0, 1 / 6]])
    assert m["clip_cov_frac"] == 0.5


def test_kl_cov_selection_and_gradient():
    """kl_cov_ratio 0.34 -> k = max(int(0.34 * 6), 1) = 2 top-cov tokens: (1,1)=3.5, (0,0)=2.
    old = logp - 0.1 everywhere: ratio e^0.1 = 1.1051709 (inside [0.8, 1.2]), kl_cov_coef 1.
    pg = -A * 1.10517 sums to 0 over the 6 tokens; KL-Cov adds |0.1| on the 2 tokens:
    loss = 0.2 / 6 = 0.0333333.
    grad = -A * 1.10517 / 6 (= -/+0.1841952) plus 1/6 on (0,0) and (1,1):
    (0,0) = -0.1841952 + 0.1666667 = -0.0175285; (1,1) = 0.1841952 + 0.1666667 = 0.3508618.
    On-policy (old = None) the penalty |logp - old| is 0 with 0 gradient: KL-Cov only acts once
    the policy has moved from the sampler."""
    cfg = ObjectiveConfig(kl_cov_ratio=0.34)
    old = [[x - 0.1 for x in row] for row in COV_LOGPS]
    loss, grad, m = run(COV_LOGPS, COV_ADV, cfg, old=old)
    r6 = math.exp(0.1) / 6
    assert close(loss, 0.2 / 6)
    assert close(grad, [[-r6 + 1 / 6, -r6, -r6], [r6, r6 + 1 / 6, r6]])
    assert close(m["kl_cov_frac"], 2 / 6)
    sel = select_tokens(cfg, t(COV_LOGPS), t(old), t(COV_ADV), torch.ones(2, 3))
    assert torch.equal(sel.kl_cov, torch.tensor([[True, False, False], [False, True, False]]))
    loss, grad, _ = run(COV_LOGPS, COV_ADV, cfg, old=None)
    _, plain_grad, _ = run(COV_LOGPS, COV_ADV, ObjectiveConfig(), old=None)
    assert close(loss, 0.0) and close(grad, plain_grad)


# ---- gradient accumulation with batch-dependent selections -------------------------------------


@pytest.mark.parametrize("loss_type", SURROGATE_LOSS_TYPES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_accumulation_equivalence_with_precomputed_selection(loss_type, mode):
    """Every loss type with entropy bonus, top-entropy mask, Clip-Cov, KL-Cov and KL on: the
    loss and gradients (w.r.t. logps and entropies) of a 6-sequence batch equal the sums over
    micro-batches [0:2], [2:6] when select_tokens runs once on the batch and each call gets
    ``selection=sel[rows]`` plus the batch totals."""
    g = torch.Generator().manual_seed(0)
    B, T = 6, 5
    logps = (-torch.rand(B, T, generator=g, dtype=D) * 3).requires_grad_(True)
    ent = (torch.rand(B, T, generator=g, dtype=D) * 2).requires_grad_(True)
    old = logps.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=D)
    ref = logps.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=D)
    adv = torch.randn(B, generator=g, dtype=D)
    mask = (torch.arange(T) < torch.tensor([5, 2, 0, 4, 1, 3])[:, None]).to(D)
    token_level = loss_type != "reg_grpo"
    cfg = ObjectiveConfig(
        epsilon=0.2, epsilon_high=0.28, beta=0.05, loss_agg_mode=mode, max_completion_length=T,
        loss_type=loss_type, entropy_coef=0.01, kl_cov_ratio=0.2,
        top_entropy_quantile=0.5 if token_level else None,
        clip_cov_ratio=0.2 if token_level else None, clip_cov_lb=0.0, clip_cov_ub=10.0,
    )
    sel = select_tokens(cfg, logps, old, adv, mask, ent, generator=torch.Generator().manual_seed(1))
    assert int(sel.kl_cov.sum()) == 3
    if token_level:
        assert 0 < int(sel.clip_cov.sum()) and 0 < int(sel.entropy_keep.sum()) < int(mask.sum())

    def loss_of(rows, **totals):
        return policy_loss(logps[rows], old[rows], adv[rows], mask[rows], cfg, ref_logps=ref[rows],
                           entropies=ent[rows], selection=sel[rows], **totals)[0]

    full = loss_of(slice(0, B))
    full_grads = torch.autograd.grad(full, (logps, ent))
    totals = dict(num_tokens=mask.sum(), num_seqs=count_sequences(mask))  # the non-empty rows
    summed = loss_of(slice(0, 2), **totals) + loss_of(torch.tensor([2, 3, 4, 5]), **totals)
    micro_grads = torch.autograd.grad(summed, (logps, ent))
    assert torch.allclose(full, summed, atol=1e-12)
    for a, b in zip(full_grads, micro_grads):
        assert torch.allclose(a, b, atol=1e-12) and a.abs().sum() > 0
    # Sanity that the test can fail: per-call (micro-batch-local) selections differ.
    if token_level:
        local = sum(
            policy_loss(logps[s], old[s], adv[s], mask[s], cfg, ref_logps=ref[s], entropies=ent[s],
                        generator=torch.Generator().manual_seed(1), **totals)[0]
            for s in (slice(0, 2), slice(2, 6))
        )
        assert not torch.allclose(full, local)


def test_local_selection_equals_select_tokens_on_the_call():
    """selection=None with a selection-needing cfg selects from the call's own tokens."""
    cfg = ObjectiveConfig(top_entropy_quantile=0.2, kl_cov_ratio=0.34)
    logps, adv, mask, old = t(ENT), t([2.0, -1.0]), t(ENT_MASK), t(ENT) - 0.05
    a, ma = policy_loss(logps, old, adv, mask, cfg, entropies=t(ENT))
    sel = select_tokens(cfg, logps, old, adv, mask, t(ENT))
    b, mb = policy_loss(logps, old, adv, mask, cfg, entropies=t(ENT), selection=sel)
    assert torch.equal(a, b) and ma == mb


def test_token_selection_slicing():
    sel = TokenSelection(entropy_keep=torch.tensor([[True, False], [False, True]]),
                         clip_cov=torch.tensor([[True, True], [False, False]]))
    assert torch.equal(sel[1:].entropy_keep, torch.tensor([[False, True]])) and sel[1:].kl_cov is None
    assert torch.equal(sel.pg_weight(torch.zeros(1)), torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    assert TokenSelection().pg_weight(torch.zeros(1)) is None


# ---- metrics and config ------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", SURROGATE_LOSS_TYPES)
def test_metric_keys_depend_on_config_only(loss_type):
    """The policy averages metrics over micro-batches, so every call must return the same keys
    (python floats) for a given config, whatever the data."""
    cfg = ObjectiveConfig(loss_type=loss_type, entropy_coef=0.01, kl_cov_ratio=0.5)
    keys = []
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        logps = -torch.rand(3, 4, generator=g, dtype=D)
        _, m = policy_loss(logps, logps - 0.5 * torch.rand(3, 4, generator=g, dtype=D),
                           torch.randn(3, generator=g, dtype=D), torch.ones(3, 4), cfg,
                           entropies=torch.rand(3, 4, generator=g, dtype=D))
        assert all(type(v) is float for v in m.values())
        keys.append(list(m))
    assert keys[0] == keys[1]
    assert "entropy" in keys[0] and "kl_cov_frac" in keys[0]


def test_config_validation():
    with pytest.raises(ValueError, match="known: awm, cispo, clip, gspo, nft, reg_grpo"):
        ObjectiveConfig(loss_type="ppo2")
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        ObjectiveConfig(top_entropy_quantile=0.0)
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        ObjectiveConfig(clip_cov_ratio=1.5)
    with pytest.raises(ValueError, match="reg_grpo"):
        ObjectiveConfig(loss_type="reg_grpo", top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="reg_scale"):
        ObjectiveConfig(reg_scale=0.0)


def test_from_algo_copies_zoo_fields():
    from mmrl.config.schema import AlgoConfig

    algo = AlgoConfig(loss_type="gspo", dual_clip_c=3.0, clip_pos=[0.2, 0.3], top_entropy_quantile=0.2)
    cfg = ObjectiveConfig.from_algo(algo)
    assert cfg.loss_type == "gspo" and cfg.dual_clip_c == 3.0 and cfg.clip_pos == (0.2, 0.3)
    assert cfg.top_entropy_quantile == 0.2 and cfg.kl_cov_ratio is None
