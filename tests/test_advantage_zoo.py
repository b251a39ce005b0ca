"""Hand-worked checks of the estimators in mmrl.core.advantages (REINFORCE++, NGRPO, BNPO,
Stratified GRPO, SPO) and of the estimator-state plumbing."""

import copy
import io
import math

import pytest
import torch

from mmrl.core.advantages import BNPOState, SPOState, bnpo, ngrpo, reinforce_pp, spo, stratified_grpo
from mmrl.core.advantages import EstimatorState, compute_advantages, grpo, make_advantage_state
from mmrl.registry import ADVANTAGES

EPS = 1e-6
F64 = torch.float64


def t(*xs):
    return torch.tensor(xs, dtype=F64)


def close(a, b, tol=1e-6):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


# Two interleaved groups of different sizes (as in test_advantages.py):
#   group 7 = positions 0, 2 -> [1, 0];  group 3 = positions 1, 3, 4 -> [2, 4, 0]
REWARDS = t(1.0, 2.0, 0.0, 4.0, 0.0)
GROUPS = torch.tensor([7, 3, 7, 3, 3])


def test_all_registered_and_state_factories():
    assert {"reinforce_pp", "ngrpo", "bnpo", "stratified_grpo", "spo"} <= set(ADVANTAGES.names())
    assert make_advantage_state("grpo") is None and make_advantage_state("ngrpo") is None
    assert isinstance(make_advantage_state("bnpo"), BNPOState)
    assert isinstance(make_advantage_state("spo"), SPOState)
    assert isinstance(make_advantage_state("spo"), EstimatorState)
    assert make_advantage_state("spo") is not make_advantage_state("spo")  # fresh each time


# ---------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_plain_batch_normalisation():
    """group_baseline=False ignores groups: r = [1, 2, 0, 4, 0], batch mean 7/5 = 1.4,
    deviations [-0.4, 0.6, -1.4, 2.6, -1.4], squares sum 11.2, unbiased var 11.2/4 = 2.8,
    std 1.67332 -> A = [-0.23905, 0.35857, -0.83666, 1.55380, -0.83666]."""
    a = reinforce_pp(REWARDS, GROUPS, eps=EPS, group_baseline=False)
    assert close(a, [-0.23905, 0.35857, -0.83666, 1.55380, -0.83666], tol=1e-5)
    assert close(a, (REWARDS - 1.4) / (math.sqrt(2.8) + EPS), tol=1e-12)


def test_reinforce_pp_group_baseline_then_batch_whitening():
    """Default (verl's reinforce_plus_plus_baseline): subtract the group mean, then whiten.
    group 7 [1, 0] - 0.5 -> [0.5, -0.5]; group 3 [2, 4, 0] - 2 -> [0, 2, -2].
    u = [0.5, 0, -0.5, 2, -2], mean 0, squares 8.5, var 8.5/4 = 2.125, std 1.457738
    -> A = [0.34300, 0, -0.34300, 1.37199, -1.37199]."""
    a = compute_advantages("reinforce_pp", REWARDS, GROUPS)
    assert close(a, [0.34300, 0.0, -0.34300, 1.37199, -1.37199], tol=1e-5)
    assert close(a, t(0.5, 0, -0.5, 2, -2) / (math.sqrt(2.125) + EPS), tol=1e-12)


def test_reinforce_pp_does_not_inflate_tiny_group_differences():
    """The edge case that motivates batch normalisation. r = [0.50, 0.51 | 0, 1]:
    GRPO divides each group by its own std, so the 0.01 difference becomes +-0.7071, as large as
    the 0-vs-1 group. REINFORCE++: u = [-0.005, 0.005, -0.5, 0.5], batch var
    (2*0.000025 + 2*0.25)/3 = 0.1666833, std 0.408269 -> A = [-0.012247, 0.012247, -1.224684, 1.224684]."""
    r, g = t(0.50, 0.51, 0.0, 1.0), torch.tensor([0, 0, 1, 1])
    assert close(grpo(r, g)[:2], [-0.70710, 0.70710], tol=1e-4)
    a = reinforce_pp(r, g)
    assert close(a, [-0.012247, 0.012247, -1.224684, 1.224684], tol=1e-5)


def test_reinforce_pp_singletons_use_the_batch_mean():
    """r = [5 | 1, 0] with the first sample alone in its group: its baseline is the batch mean
    2, so u = [3, 0.5, -0.5]; mean 1, deviations [2, -0.5, -1.5], var 6.5/2 = 3.25, std 1.802776
    -> A = [1.109400, -0.277350, -0.832050]. An all-singleton batch equals the plain variant."""
    a = reinforce_pp(t(5, 1, 0), torch.tensor([0, 1, 1]))
    assert close(a, [1.109400, -0.277350, -0.832050], tol=1e-5)
    r = t(1, 0, 1, 1)
    assert close(reinforce_pp(r, torch.arange(4)), reinforce_pp(r, torch.arange(4), group_baseline=False), tol=1e-12)
    # plain: mean 0.75, deviations [0.25, -0.75, 0.25, 0.25], var 0.75/3 = 0.25 -> std 0.5
    assert close(reinforce_pp(r, torch.arange(4)), [0.5, -1.5, 0.5, 0.5], tol=1e-5)


# ---------------------------------------------------------------------------- NGRPO


def test_ngrpo_reproduces_the_papers_case_study():
    """8 samples, one correct. GRPO: mean 1/8, unbiased std sqrt(8 * (1/8)(7/8) / 7) = 0.353553
    -> +2.4749 / -0.3536. NGRPO adds a virtual 1: 9 values with two 1s, mean 2/9,
    var 9 * (2/9)(7/9) / 8 = 0.194444, std 0.440959 -> correct (7/9)/0.440959 = +1.7638,
    wrong -(2/9)/0.440959 = -0.5040 (the paper's table: 2.47 -> 1.76, -0.35 -> -0.50)."""
    r = t(1, 0, 0, 0, 0, 0, 0, 0)
    g = torch.zeros(8, dtype=torch.long)
    assert close(grpo(r, g)[:2], [2.4749, -0.3536], tol=1e-4)
    a = ngrpo(r, g)
    assert close(a[:2], [1.7638, -0.5040], tol=1e-4)
    assert close(a[1:], torch.full((7,), a[1].item(), dtype=F64), tol=1e-12)


def test_ngrpo_homogeneous_groups():
    """All-wrong [0, 0, 0] (+ virtual 1): mean 1/4, deviations [-1/4]*3 and 3/4, squares
    3/16 + 9/16 = 3/4, var (3/4)/3 = 1/4, std 1/2 -> A = -0.5 each (GRPO: 0).
    All-correct [1, 1, 1] at r_max: the virtual 1 changes nothing -> A = 0.
    Mixed [1, 0, 0] -> values [1, 0, 0, 1]: mean 1/2, var 1/3 -> [+0.866025, -0.866025, -0.866025].
    The three groups interleaved in one batch give the same per-group values."""
    g = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    r = t(0, 1, 1, 0, 1, 0, 0, 1, 0)  # group 0 all wrong, group 1 all right, group 2 = [1, 0, 0]
    a = ngrpo(r, g, eps=EPS)
    h = 0.5 / (math.sqrt(1 / 3) + EPS)
    assert close(a, [-0.5, 0, h, -0.5, 0, -h, -0.5, 0, -h], tol=1e-5)
    assert (a[g == 0] < 0).all() and torch.equal(a[g == 1], torch.zeros(3, dtype=F64))
    assert torch.equal(grpo(r, g)[g == 0], torch.zeros(3, dtype=F64))


def test_ngrpo_options():
    """scale_rewards=False keeps only the calibrated mean: all-wrong [0, 0, 0] -> -1/4 each.
    r_max = 2 for [0, 0, 0]: values [0, 0, 0, 2], mean 1/2, var (3/4 + 9/4)/3 = 1 -> A = -0.5.
    A single sample 0 (+ virtual 1): mean 1/2, var 1/2, std 0.707107 -> A = -0.707107.
    num_virtual=0 is plain GRPO; num_virtual=2 on [0, 0]: [0, 0, 1, 1] mean 1/2, std
    sqrt(1/3) -> -0.866025."""
    z = t(0, 0, 0)
    g = torch.zeros(3, dtype=torch.long)
    assert close(ngrpo(z, g, scale_rewards=False), [-0.25] * 3, tol=1e-12)
    assert close(ngrpo(z, g, r_max=2.0), [-0.5] * 3, tol=1e-5)
    assert close(ngrpo(t(0), torch.zeros(1, dtype=torch.long)), [-0.707107], tol=1e-5)
    assert close(ngrpo(REWARDS, GROUPS, num_virtual=0), grpo(REWARDS, GROUPS), tol=1e-12)
    assert close(ngrpo(t(0, 0), torch.zeros(2, dtype=torch.long), num_virtual=2), [-0.866025] * 2, tol=1e-5)
    with pytest.raises(ValueError, match="num_virtual"):
        ngrpo(z, g, num_virtual=-1)


# ---------------------------------------------------------------------------- BNPO

# Three groups of 4 binary rewards with success rates p = 1/4, 1/2, 3/4.
BN_R = t(1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0)
BN_G = torch.arange(3).repeat_interleave(4)


def test_bnpo_reduces_to_scaled_grpo_at_alpha_beta_three_halves():
    """p = [1/4, 1/2, 3/4]: m = 1/2, unbiased v = ((1/4)^2 + 0 + (1/4)^2) / 2 = 1/16.
    m(1-m)/v - 1 = 4 - 1 = 3 -> a = b = 3/2 -> alpha = beta = 1 + (3/2)/3 = 3/2.
    Beta(3/2, 3/2) pdf = sqrt(p(1-p)) / B(3/2, 3/2), B(3/2, 3/2) = pi/8, so
    A = (s - p) * pi / (8 sqrt(p(1-p))):
      p = 1/4: weight = 0.392699/0.433013 = 0.906900 -> correct +0.680175, wrong -0.226725
      p = 1/2: weight = 0.392699/0.5 = 0.785398      -> +-0.392699
      p = 3/4: correct +0.226725, wrong -0.680175.
    i.e. pi/8 times GRPO with the population std sqrt(p(1-p))."""
    a = bnpo(BN_R, BN_G, momentum=0.0)  # per-batch refit: no state needed
    w, v = 0.680175, 0.226725
    assert close(a, [w, -v, -v, -v, 0.392699, 0.392699, -0.392699, -0.392699, v, v, v, -w], tol=1e-5)
    p = t(0.25, 0.5, 0.75)[BN_G]
    assert close(a, math.pi / 8 * (BN_R - p) / torch.sqrt(p * (1 - p)), tol=1e-12)


def test_bnpo_parameters_update_across_calls():
    """momentum 0.5, one state across two batches.
    Call 1: groups [0, 0], [1, 1] -> p = [0, 1], m = 1/2, v = 1/2; state (m, v) = (1/2, 1/2).
      m(1-m)/v - 1 = -1/2 < 0 -> alpha = beta = 1. Homogeneous groups: A = 0.
    Call 2: groups [1, 0, 0, 0], [1, 1, 1, 0] -> p = [1/4, 3/4], batch m = 1/2, v = 1/8.
      state m = 1/2, v = 0.5 * 1/2 + 0.5 * 1/8 = 5/16; 0.25/0.3125 - 1 = -0.2 -> alpha = beta = 1
      -> REINFORCE with a group baseline, A = s - p = [3/4, -1/4, -1/4, -1/4, 1/4, 1/4, 1/4, -3/4].
    Without the history (momentum 0): v = 1/8, 0.25/0.125 - 1 = 1, a = b = 1/2,
      alpha = beta = 7/6; B(7/6, 7/6) = Gamma(7/6)^2/Gamma(7/3) = 0.722858,
      p(1-p) = 3/16 for both -> weight 0.722858/(3/16)^(1/6) = 0.955475
      -> A = [0.716606, -0.238869 x3, 0.238869 x3, -0.716606]."""
    state = make_advantage_state("bnpo")
    assert state.beta_params() == (1.0, 1.0)
    a1 = compute_advantages("bnpo", t(0, 0, 1, 1), torch.tensor([0, 0, 1, 1]), state=state, momentum=0.5)
    assert torch.equal(a1, torch.zeros(4, dtype=F64))
    assert state.state_dict() == {"mean": 0.5, "var": 0.5, "updates": 1}

    r2, g2 = t(1, 0, 0, 0, 1, 1, 1, 0), torch.tensor([0] * 4 + [1] * 4)
    a2 = compute_advantages("bnpo", r2, g2, state=state, momentum=0.5)
    assert state.mean == 0.5 and abs(state.var - 5 / 16) < 1e-12 and state.updates == 2
    assert state.beta_params() == (1.0, 1.0)
    assert close(a2, [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75], tol=1e-12)

    fresh = bnpo(r2, g2, momentum=0.0)
    x, y = 0.716606, 0.238869
    assert close(fresh, [x, -y, -y, -y, y, y, y, -x], tol=1e-5)

    restored = BNPOState()
    restored.load_state_dict(copy.deepcopy(state.state_dict()))
    assert restored.state_dict() == state.state_dict()


def test_bnpo_reward_range_and_errors():
    """Rewards in {0, 10} with r_max = 10 are the binary case scaled to [0, 1] (advantages are in
    the scaled units, as in the authors' code). Out-of-range rewards and a missing state with
    momentum > 0 are errors, not silent garbage."""
    assert close(bnpo(BN_R * 10, BN_G, momentum=0.0, r_max=10.0), bnpo(BN_R, BN_G, momentum=0.0), tol=1e-12)
    with pytest.raises(ValueError, match="r_min/r_max"):
        bnpo(BN_R * 2, BN_G, momentum=0.0)
    with pytest.raises(ValueError, match="make_advantage_state"):
        bnpo(BN_R, BN_G)
    # one group only: no moment update, alpha = beta = 1 -> s - p; a singleton group -> 0
    st = BNPOState()
    assert close(bnpo(t(1, 0, 0, 0), torch.zeros(4, dtype=torch.long), state=st), [0.75, -0.25, -0.25, -0.25])
    assert st.updates == 0
    assert torch.equal(bnpo(t(1, 0), torch.tensor([0, 1]), momentum=0.0), torch.zeros(2, dtype=F64))


# ---------------------------------------------------------------------------- Stratified GRPO

# Task 0 (rewards in [0, 1]): groups [1, 0] and [1, 1, 0, 0]; task 1 (rewards in [0, 10]):
# groups [10, 0] and [6, 2].
ST_R = t(1, 0, 1, 1, 0, 0, 10, 0, 6, 2)
ST_G = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2, 3, 3])
ST_T = torch.tensor([0] * 6 + [1] * 4)


def test_stratified_gives_each_task_unit_std():
    """Group residuals u = [.5, -.5, .5, .5, -.5, -.5 | 5, -5, 2, -2].
    Task 0: mean 0, var 6 * 0.25 / 5 = 0.3, std 0.547723 -> A = +-0.5/0.547723 = +-0.912871.
    Task 1: mean 0, var (25 + 25 + 4 + 4)/3 = 58/3, std 4.396969 -> A = [1.137147, -1.137147,
    0.454859, -0.454859]. Each task's advantages then have (unbiased) std 1."""
    a = stratified_grpo(ST_R, ST_G, task_ids=ST_T, eps=EPS)
    s = 0.912871
    assert close(a, [s, -s, s, s, -s, -s, 1.137147, -1.137147, 0.454859, -0.454859], tol=1e-5)
    assert abs(a[:6].std().item() - 1) < 1e-5 and abs(a[6:].std().item() - 1) < 1e-5
    assert abs(a[:6].mean().item()) < 1e-12 and abs(a[6:].mean().item()) < 1e-12
    # any integer stratum label works, passed as `strata` (it wins over task_ids)
    assert close(stratified_grpo(ST_R, ST_G, strata=ST_T, task_ids=torch.zeros(10)), a, tol=1e-12)


def test_stratified_global_and_blend():
    """Without labels (or alpha = 0): global standardisation of u. Squares sum
    6 * 0.25 + 50 + 8 = 59.5, var 59.5/9 = 6.611111, std 2.571208: task 0 gets only
    +-0.5/2.571208 = +-0.194461 (the [0, 10] task dominates), task 1 [1.944611, -1.944611,
    0.777844, -0.777844]. alpha = 0.5 averages: task 0 +-(0.912871 + 0.194461)/2 = +-0.553666."""
    glob = stratified_grpo(ST_R, ST_G)
    g0 = 0.194461
    assert close(glob, [g0, -g0, g0, g0, -g0, -g0, 1.944611, -1.944611, 0.777844, -0.777844], tol=1e-5)
    assert close(stratified_grpo(ST_R, ST_G, task_ids=ST_T, alpha=0.0), glob, tol=1e-12)
    half = compute_advantages("stratified_grpo", ST_R, ST_G, task_ids=ST_T, alpha=0.5)
    assert close(half[:2], [0.553666, -0.553666], tol=1e-5)
    with pytest.raises(ValueError, match="alpha"):
        stratified_grpo(ST_R, ST_G, task_ids=ST_T, alpha=1.5)
    with pytest.raises(ValueError, match="one label per sample"):
        stratified_grpo(ST_R, ST_G, task_ids=ST_T[:3])


# ---------------------------------------------------------------------------- SPO


def test_spo_single_samples_get_signal_and_tracker_moves():
    """One sample per prompt (GRPO would give all zeros). prior_count 1, init_value 0.5.
    Batch 1: prompts a, b, c, d, rewards [1, 0, 1, 1]; every prompt is new, v = 0.5:
      a = r - 0.5 = [.5, -.5, .5, .5], mean .25, deviations [.25, -.75, .25, .25],
      var 0.75/3 = 0.25, std 0.5 -> A = [0.5, -1.5, 0.5, 0.5].
      Update (new prompt: S = 1 * 0.5 + R, W = 1 + k): a, c, d -> 1.5/2 = 0.75; b -> 0.5/2 = 0.25.
      Global: S = 0.5 + 3 = 3.5, W = 1 + 4 = 5 -> 0.7.
    Batch 2: prompts a, b, e (new), rewards [1, 1, 0], no policy_kl -> rho = rho_max = 0.96.
      v before = [0.75, 0.25, 0.7 (global)], a = [0.25, 0.75, -0.7], mean 0.1,
      deviations [0.15, 0.65, -0.8], var (0.0225 + 0.4225 + 0.64)/2 = 0.5425, std 0.736546
      -> A = [0.203654, 0.882498, -1.086151].
      a: S = 0.96 * 1.5 + 1 = 2.44, W = 0.96 * 2 + 1 = 2.92 -> 0.835616 (up from 0.75 toward 1)
      b: S = 0.96 * 0.5 + 1 = 1.48 -> 0.506849; e: S = 0.7, W = 2 -> 0.35 (down toward 0).
      Global: S = 0.96 * 3.5 + 2 = 5.36, W = 0.96 * 5 + 3 = 7.8 -> 0.687179."""
    st = make_advantage_state("spo")
    a1 = compute_advantages("spo", t(1, 0, 1, 1), torch.arange(4), state=st, prompt_keys=list("abcd"), init_value=0.5)
    assert close(a1, [0.5, -1.5, 0.5, 0.5], tol=1e-5)
    assert torch.equal(grpo(t(1, 0, 1, 1), torch.arange(4)), torch.zeros(4, dtype=F64))
    assert st.value("a") == 0.75 and st.value("b") == 0.25 and st.value("e") is None
    assert st.global_value == [3.5, 5.0, 0.0]

    a2 = spo(t(1, 1, 0), torch.arange(3), state=st, prompt_keys=["a", "b", "e"])
    assert close(a2, [0.203654, 0.882498, -1.086151], tol=1e-5)
    assert abs(st.value("a") - 2.44 / 2.92) < 1e-12 and abs(st.value("a") - 0.835616) < 1e-6
    assert abs(st.value("b") - 1.48 / 2.92) < 1e-12 and abs(st.value("e") - 0.35) < 1e-12
    assert abs(st.global_value[0] / st.global_value[1] - 5.36 / 7.8) < 1e-12
    assert st.value("c") == 0.75  # prompts not in the batch are untouched


def test_spo_kl_adaptive_forgetting():
    """After batch 1 above (v(a) = 1.5/2), prompt a is seen again with reward 1.
    policy_kl = 0.006 -> D = 0.006, rho = 2^(-0.006/0.06) = 2^-0.1 = 0.933033 (inside
      [0.875, 0.96]): S = 0.933033 * 1.5 + 1 = 2.399550, W = 0.933033 * 2 + 1 = 2.866066 -> 0.837228.
    A second visit with no new KL has D = 0 again (drift since the last visit) -> rho 0.96 ->
      (0.96 * 2.399550 + 1)/(0.96 * 2.866066 + 1) = 0.880617.
    policy_kl = 0.06 -> 2^-1 = 0.5, clipped to rho_min 0.875: 2.3125/2.75 = 0.840909.
    rho = 0.5 fixed: 1.75/2 = 0.875. More policy drift -> more forgetting -> closer to 1.
    Two samples of a new prompt f with rewards [1, 0]: S = 0.7 + 1, W = 1 + 2 -> 0.566667.
    A missing state or prompt_keys is an error."""

    def after_batch1():
        st = SPOState()
        spo(t(1, 0, 1, 1), torch.arange(4), state=st, prompt_keys=list("abcd"), init_value=0.5)
        return st

    st = after_batch1()
    spo(t(1), torch.zeros(1), state=st, prompt_keys=["a"], policy_kl=0.006)
    assert abs(st.value("a") - 0.837228) < 1e-6 and abs(st.cum_kl - 0.006) < 1e-15
    # D counts the drift since a's *last* visit: no new KL -> D = 0 -> rho = 0.96:
    # S = 0.96 * 2.399550 + 1 = 3.303568, W = 0.96 * 2.866066 + 1 = 3.751423 -> 0.880617
    spo(t(1), torch.zeros(1), state=st, prompt_keys=["a"])
    assert abs(st.value("a") - 0.880617) < 1e-6
    st = after_batch1()
    spo(t(1), torch.zeros(1), state=st, prompt_keys=["a"], policy_kl=0.06)
    assert abs(st.value("a") - 2.3125 / 2.75) < 1e-12
    st = after_batch1()
    spo(t(1), torch.zeros(1), state=st, prompt_keys=["a"], rho=0.5)
    assert abs(st.value("a") - 0.875) < 1e-12
    st = after_batch1()
    spo(t(1, 0), torch.zeros(2), state=st, prompt_keys=["f", "f"])
    assert abs(st.value("f") - 1.7 / 3) < 1e-12

    with pytest.raises(ValueError, match="make_advantage_state"):
        compute_advantages("spo", t(1, 0), torch.arange(2), prompt_keys=["a", "b"])
    with pytest.raises(ValueError, match="prompt_keys"):
        compute_advantages("spo", t(1, 0), torch.arange(2), state=SPOState())
    with pytest.raises(ValueError, match="prompt_keys"):
        compute_advantages("spo", t(1, 0), torch.arange(2), state=SPOState(), prompt_keys=["a"])


def test_spo_state_round_trips_through_torch_save():
    """state_dict() holds plain Python types: torch.save / torch.load(weights_only=True) restores
    it, and the restored tracker gives the same advantages and the same next state."""
    st = SPOState()
    spo(t(1, 0, 1, 1), torch.arange(4), state=st, prompt_keys=[0, 1, 2, 3], policy_kl=0.01)
    st.set_prior("offline", 0.2, 8.0)
    buf = io.BytesIO()
    torch.save(st.state_dict(), buf)
    buf.seek(0)
    restored = SPOState()
    restored.load_state_dict(torch.load(buf, weights_only=True))
    assert restored.state_dict() == st.state_dict()
    assert restored.value("offline") == pytest.approx(0.2)

    batch = dict(prompt_keys=[1, "offline", 7, 1], policy_kl=0.02)
    r, g = t(1, 1, 0, 0), torch.tensor([0, 1, 2, 0])
    assert torch.equal(spo(r, g, state=st, **batch), spo(r, g, state=restored, **batch))
    assert restored.state_dict() == st.state_dict()


def test_spo_dtype_and_group_ids_are_ignored():
    """float32 rewards give float32 advantages; group ids do not matter, only prompt keys."""
    st1, st2 = SPOState(), SPOState()
    r = torch.tensor([1.0, 0.0, 0.0])
    a = spo(r, torch.tensor([0, 0, 0]), state=st1, prompt_keys=["x", "y", "z"])
    b = spo(r, torch.tensor([5, 6, 7]), state=st2, prompt_keys=["x", "y", "z"])
    assert a.dtype == torch.float32 and torch.equal(a, b)
