"""Hand-worked checks of the group-relative advantage estimators in mmrl.core.advantages."""

import math

import pytest
import torch

from mmrl.core.advantages import compute_advantages, dr_grpo, group_stats, grpo, rloo
from mmrl.registry import ADVANTAGES, UnknownNameError

EPS = 1e-6

# Two interleaved groups of different sizes, ids not contiguous and not sorted:
#   group 7 = positions 0, 2 -> rewards [1, 0]
#   group 3 = positions 1, 3, 4 -> rewards [2, 4, 0]
REWARDS = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.0], dtype=torch.float64)
GROUPS = torch.tensor([7, 3, 7, 3, 3])


def close(a, b, tol=1e-9):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


def test_grpo_single_group():
    """rewards [1, 0, 0, 1], one group.

    mean = 0.5; unbiased var = 4 * 0.25 / 3 = 1/3; std = 0.577350...
    A = +-0.5 / (0.57735 + eps) = +-0.866025...
    """
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    a = grpo(r, torch.zeros(4, dtype=torch.long), eps=EPS)
    v = 0.5 / (math.sqrt(1 / 3) + EPS)
    assert close(a, [v, -v, -v, v])
    assert abs(v - 0.8660254) < 1e-5


def test_grpo_interleaved_groups_of_different_sizes():
    """group 7 [1, 0]: mean 0.5, std sqrt(0.5/1) = 0.70711 -> A = +-0.5/0.70711 = +-0.70711.
    group 3 [2, 4, 0]: mean 2, deviations [0, 2, -2], var 8/2 = 4, std 2 -> A = [0, 1, -1].
    In batch order: [0.70711, 0, -0.70711, 1, -1].
    """
    a = grpo(REWARDS, GROUPS, eps=EPS)
    s = 0.5 / (math.sqrt(0.5) + EPS)
    assert close(a, [s, 0.0, -s, 2 / (2 + EPS), -2 / (2 + EPS)])


def test_grpo_equal_rewards_and_singleton_groups_give_zero():
    """[3, 3, 3] in one group: every deviation is 0 -> A = 0 (std 0, divided by eps only).
    A group of size 1 (reward 5) has no spread: A = 0, not NaN (unbiased std would be 0/0).
    The other group [1, 0] is unaffected: +-0.70711."""
    a = grpo(torch.tensor([3.0, 3.0, 3.0]), torch.tensor([0, 0, 0]))
    assert torch.equal(a, torch.zeros(3))

    r = torch.tensor([5.0, 1.0, 0.0], dtype=torch.float64)
    a = grpo(r, torch.tensor([0, 1, 1]), eps=EPS)
    assert not torch.isnan(a).any()
    s = 0.5 / (math.sqrt(0.5) + EPS)
    assert close(a, [0.0, s, -s])


def test_grpo_without_scaling_and_dr_grpo():
    """scale_rewards=False (and Dr. GRPO) keep only the mean baseline:
    group 7 [1, 0] - 0.5 -> [0.5, -0.5]; group 3 [2, 4, 0] - 2 -> [0, 2, -2].
    Batch order: [0.5, 0, -0.5, 2, -2]."""
    expected = [0.5, 0.0, -0.5, 2.0, -2.0]
    assert close(grpo(REWARDS, GROUPS, scale_rewards=False), expected)
    assert close(dr_grpo(REWARDS, GROUPS), expected)
    # Dr. GRPO has no std division: it takes no scale_rewards (or any other key), and the config's
    # algo.scale_rewards=false under dr_grpo is an error at setup (test_estimator_options_are_checked).
    with pytest.raises(TypeError, match="scale_rewards"):
        dr_grpo(REWARDS, GROUPS, scale_rewards=True)


def test_rloo_hand_values():
    """Leave-one-out baselines.
    [1, 0, 0, 1]: A_0 = 1 - mean(0, 0, 1) = 2/3, A_1 = 0 - mean(1, 0, 1) = -2/3.
    group 7 [1, 0]: 1 - 0 = 1, 0 - 1 = -1.
    group 3 [2, 4, 0]: 2 - mean(4, 0) = 0, 4 - mean(2, 0) = 3, 0 - mean(2, 4) = -3.
    """
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    assert close(rloo(r, torch.zeros(4, dtype=torch.long)), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert close(rloo(REWARDS, GROUPS), [1.0, 0.0, -1.0, 3.0, -3.0])
    # size-1 group -> 0
    assert close(rloo(torch.tensor([5.0, 1.0, 0.0]), torch.tensor([0, 1, 1])), [0.0, 1.0, -1.0])


def test_rloo_identity_matches_explicit_leave_one_out():
    """A_i = r_i - mean_{j != i} r_j == n/(n-1) (r_i - mean_g) on random groups."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 5, (40,), generator=g)
    r = torch.randn(40, generator=g, dtype=torch.float64)
    expected = torch.zeros_like(r)
    for i in range(40):
        others = (ids == ids[i]) & (torch.arange(40) != i)
        expected[i] = r[i] - r[others].mean() if others.any() else 0.0
    assert close(rloo(r, ids), expected, tol=1e-12)
    mean, _, n = group_stats(r, ids)
    assert close(rloo(r, ids), torch.where(n > 1, n / (n - 1).clamp(min=1) * (r - mean), 0.0))


def test_group_stats_matches_torch_per_group():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4, (30,), generator=g)
    r = torch.rand(30, generator=g, dtype=torch.float64)
    mean, std, n = group_stats(r, ids)
    for gid in ids.unique():
        sel = ids == gid
        assert close(mean[sel], r[sel].mean().expand(int(sel.sum())), tol=1e-12)
        assert close(n[sel], float(sel.sum()))
        if sel.sum() > 1:
            assert close(std[sel], r[sel].std().expand(int(sel.sum())), tol=1e-12)


def test_integer_rewards_and_dtype():
    a = grpo(torch.tensor([1, 0]), torch.tensor([0, 0]), eps=0.0)
    assert a.dtype == torch.float32
    assert close(a, [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)], tol=1e-6)
    assert grpo(REWARDS, GROUPS).dtype == torch.float64


def test_registry_lookup():
    assert {"grpo", "dr_grpo", "rloo"} <= set(ADVANTAGES.names())
    assert close(compute_advantages("rloo", REWARDS, GROUPS), [1.0, 0.0, -1.0, 3.0, -3.0])
    assert close(compute_advantages("grpo", REWARDS, GROUPS, scale_rewards=False), [0.5, 0.0, -0.5, 2.0, -2.0])
    with pytest.raises(TypeError, match="num_iterations"):  # no **kwargs: a key it does not take is an error
        compute_advantages("grpo", REWARDS, GROUPS, num_iterations=2)
    with pytest.raises(UnknownNameError, match="rloo"):
        compute_advantages("rlo", REWARDS, GROUPS)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same length"):
        grpo(torch.zeros(3), torch.zeros(4, dtype=torch.long))


def test_estimator_options_are_checked_against_the_signature():
    """A typo in algo.advantage_kwargs, or algo.scale_rewards=false where the estimator has no std
    to drop, is a ConfigError naming the options the estimator takes (it was silently ignored)."""
    from mmrl.config import ConfigError
    from mmrl.core.advantages import estimator_options

    assert estimator_options("grpo", {}, True) == {"scale_rewards": True}
    assert estimator_options("grpo", {"eps": 1e-4}, False) == {"eps": 1e-4, "scale_rewards": False}
    assert estimator_options("rloo", {}, True) == {}  # the default is not passed where it means nothing
    with pytest.raises(ConfigError, match=r"algo.advantage_kwargs: the grpo estimator takes no alhpa "
                                          r"\(it takes: eps, scale_rewards\)"):
        estimator_options("grpo", {"alhpa": 0.5}, True)
    for name in ("rloo", "dr_grpo", "bnpo", "spo", "stratified_grpo", "reinforce_pp"):
        with pytest.raises(ConfigError, match=f"algo.scale_rewards=false: the {name} estimator divides by no"):
            estimator_options(name, {}, False)
    # declared inputs (supplied by the trainer) are not options a config may set
    with pytest.raises(ConfigError, match="takes no episode_ids"):
        estimator_options("gigpo", {"episode_ids": [0]}, True)
