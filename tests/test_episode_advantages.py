"""Hand-worked checks of the multi-step episode estimators: episode-level GRPO and GiGPO
(mmrl.core.advantages.episode). Every row is one step of one episode."""

import math

import pytest
import torch

from mmrl.core.advantages import compute_advantages, episode_grpo, gigpo, grpo
from mmrl.core.advantages.episode import anchor_groups, discounted_returns
from mmrl.registry import ADVANTAGES

EPS = 1e-6
F64 = torch.float64
A = 1 / math.sqrt(3)  # 0.577350...


def close(a, b, tol=1e-6):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


# One task (group 0) with three episodes, rows in episode order:
#   episode 0 (length 2): rewards [0, 1], states [start, hall]          return 1
#   episode 1 (length 3): rewards [0, 0, 1], states [start, hall, hall]  return 1 (revisits hall)
#   episode 2 (length 1): rewards [0], states [start]                     return 0
REWARDS = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=F64)
GROUPS = torch.zeros(6, dtype=torch.long)
EPISODES = torch.tensor([0, 0, 1, 1, 1, 2])
STEPS = torch.tensor([0, 1, 0, 1, 2, 0])
KEYS = ["start", "hall", "start", "hall", "hall", "start"]
INPUTS = dict(episode_ids=EPISODES, step_indices=STEPS, anchor_keys=KEYS)

# Episode level. Returns R = [1, 1, 0], mean 2/3, deviations [1/3, 1/3, -2/3],
# unbiased var (1/9 + 1/9 + 4/9) / 2 = 1/3, std 1/sqrt(3) = 0.57735
#   -> A^E = [1/3, 1/3, -2/3] / 0.57735 = [0.57735, 0.57735, -1.15470] per episode.
AE = (1 / 3) / (A + EPS)  # 0.57735 (up to eps)
A_EPISODE = [AE, AE, AE, AE, AE, -2 * AE]
A_EPISODE_NO_STD = [1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, -2 / 3]

# Discounted returns with gamma = 0.5 (R_t = r_t + 0.5 R_{t+1}):
#   episode 0: [0 + 0.5 * 1, 1] = [0.5, 1];  episode 1: [0.25, 0.5, 1];  episode 2: [0].
RETURNS = [0.5, 1.0, 0.25, 0.5, 1.0, 0.0]

# Anchor groups (group 0, key):
#   start = rows 0, 2, 5 -> R_t [0.5, 0.25, 0]: mean 0.25, deviations [0.25, 0, -0.25],
#           var (0.0625 + 0.0625) / 2 = 0.0625, std 0.25 -> A^S = [1, 0, -1]
#   hall  = rows 1, 3, 4 (step 1 of episode 0; steps 1 and 2 of episode 1) -> R_t [1, 0.5, 1]:
#           mean 5/6, deviations [1/6, -1/3, 1/6], var (1/36 + 4/36 + 1/36) / 2 = 1/12,
#           std 0.288675 -> A^S = [0.57735, -1.15470, 0.57735]
S1, SH = 0.25 / (0.25 + EPS), (1 / 6) / (math.sqrt(1 / 12) + EPS)  # 1 and 0.57735 (up to eps)
A_STEP = [S1, SH, 0.0, -2 * SH, SH, -S1]
A_STEP_NO_STD = [0.25, 1 / 6, 0.0, -1 / 3, 1 / 6, -0.25]


def test_registered_with_their_inputs():
    assert ADVANTAGES.get("episode_grpo").estimator_inputs == ("episode_ids", "step_indices")
    assert ADVANTAGES.get("gigpo").estimator_inputs == ("episode_ids", "step_indices", "anchor_keys")
    assert ADVANTAGES.get("gigpo") is gigpo and ADVANTAGES.get("episode_grpo") is episode_grpo


# ---------------------------------------------------------------------------- episode level


def test_episode_grpo_hand_worked():
    assert close(episode_grpo(REWARDS, GROUPS, episode_ids=EPISODES), A_EPISODE, 1e-12)
    assert close(episode_grpo(REWARDS, GROUPS, episode_ids=EPISODES), [A] * 5 + [-2 * A], 1e-5)
    assert close(episode_grpo(REWARDS, GROUPS, episode_ids=EPISODES, scale_rewards=False), A_EPISODE_NO_STD, 1e-12)


def test_episode_statistics_are_over_episodes_not_rows():
    """A 5-step episode (reward 1 on its last step) and a 1-step episode (reward 0), one task.
    Over episodes: returns [1, 0], mean 0.5, std sqrt(0.5) -> A = +-0.5 / 0.70711 = +-0.70711,
    without std +-0.5. Over rows (each row carrying its episode's return) the mean would be
    5/6 and the answer [1/6 x5, -5/6]: the long episode would pull the baseline to itself."""
    r = torch.tensor([0, 0, 0, 0, 1, 0], dtype=F64)
    g = torch.zeros(6, dtype=torch.long)
    e = torch.tensor([0, 0, 0, 0, 0, 1])
    v = 0.5 / (math.sqrt(0.5) + EPS)
    assert close(episode_grpo(r, g, episode_ids=e), [v] * 5 + [-v])
    assert close(episode_grpo(r, g, episode_ids=e, scale_rewards=False), [0.5] * 5 + [-0.5], 1e-12)
    s = torch.tensor([0, 1, 2, 3, 4, 0])
    # gigpo's episode term is the same (all anchors distinct: A^S = 0 everywhere).
    keys = [f"s{i}" for i in range(6)]
    assert close(gigpo(r, g, episode_ids=e, step_indices=s, anchor_keys=keys), [v] * 5 + [-v])


def test_episode_stats_steps_is_the_authors_code():
    """``episode_stats="steps"`` is verl-agent's ``episode_norm_reward`` with its default
    ``compute_mean_std_cross_steps=True``: every step row adds its episode's return to the group's
    scores (``id2score[index[i]].append(scores[i])`` for each row), then ``(score - mean) / (std +
    eps)`` with ``torch.std`` (unbiased over rows). The episodes of the test above: scores
    [1, 1, 1, 1, 1, 0], mean 5/6, squared deviations 5 * (1/6)^2 + (5/6)^2 = 5/6, std
    sqrt((5/6) / 5) = sqrt(1/6) = 0.408248; A = (1/6) / 0.408248 = 0.408248 on the long episode's
    rows and -(5/6) / 0.408248 = -2.041241 on the short one's; without std [1/6 x5, -5/6]."""
    r = torch.tensor([0, 0, 0, 0, 1, 0], dtype=F64)
    g = torch.zeros(6, dtype=torch.long)
    e = torch.tensor([0, 0, 0, 0, 0, 1])
    std = math.sqrt(1 / 6)
    expected = [(1 / 6) / (std + EPS)] * 5 + [-(5 / 6) / (std + EPS)]
    assert close(episode_grpo(r, g, episode_ids=e, episode_stats="steps"), expected, 1e-12)
    assert close(episode_grpo(r, g, episode_ids=e, episode_stats="steps", scale_rewards=False),
                 [1 / 6] * 5 + [-5 / 6], 1e-12)
    keys = [f"s{i}" for i in range(6)]  # all anchors distinct: A^S = 0, the episode term alone
    steps = torch.tensor([0, 1, 2, 3, 4, 0])
    assert close(gigpo(r, g, episode_ids=e, step_indices=steps, anchor_keys=keys, episode_stats="steps"),
                 expected, 1e-12)
    # equal-length episodes: the two statistics agree (each episode counted the same number of times,
    # except the unbiased std's n - 1: 2 episodes x 2 rows -> std over rows = std over episodes * sqrt(2/3))
    r2, e2 = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64), torch.tensor([0, 0, 1, 1])
    g2 = torch.zeros(4, dtype=torch.long)
    assert close(episode_grpo(r2, g2, episode_ids=e2, episode_stats="steps", scale_rewards=False),
                 episode_grpo(r2, g2, episode_ids=e2, scale_rewards=False), 1e-12)
    with pytest.raises(ValueError, match="episode_stats must be one of episodes, steps"):
        episode_grpo(r, g, episode_ids=e, episode_stats="rows")


def test_episode_grpo_without_episode_ids_equals_grpo():
    r = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.0], dtype=F64)
    g = torch.tensor([7, 3, 7, 3, 3])
    assert torch.equal(episode_grpo(r, g), grpo(r, g))
    assert torch.equal(episode_grpo(r, g, scale_rewards=False), grpo(r, g, scale_rewards=False))
    r32 = r.float()
    assert torch.equal(compute_advantages("episode_grpo", r32, g), grpo(r32, g))


def test_episode_constant_groups_are_exactly_zero():
    """Returns 0.1 + 0.2, 0.2 + 0.1 and 0.3 (float32): equal up to rounding -> exactly 0; a task
    with a single episode -> 0 (verl-agent would give it its raw return)."""
    r = torch.tensor([0.1, 0.2, 0.2, 0.1, 0.3, 5.0, 2.0])
    g = torch.tensor([0, 0, 0, 0, 0, 1, 1])
    e = torch.tensor([0, 0, 1, 1, 2, 3, 3])
    a = episode_grpo(r, g, episode_ids=e)
    assert a.dtype == torch.float32
    assert torch.equal(a, torch.zeros(7))


# ---------------------------------------------------------------------------- step level


def test_discounted_returns_hand_worked():
    ep = EPISODES
    assert close(discounted_returns(REWARDS, ep, STEPS, 0.5), RETURNS, 1e-12)
    # gamma 0.95 on [0, 0, 1]: [0.9025, 0.95, 1]; gamma 1 is the reward-to-go; gamma 0 is r_t.
    r, e, s = torch.tensor([0.0, 0, 1]), torch.zeros(3, dtype=torch.long), torch.tensor([0, 1, 2])
    assert close(discounted_returns(r, e, s, 0.95), [0.9025, 0.95, 1.0], 1e-12)
    assert close(discounted_returns(REWARDS, ep, STEPS, 1.0), [1, 1, 1, 1, 1, 0], 1e-12)
    assert close(discounted_returns(REWARDS, ep, STEPS, 0.0), REWARDS, 0)


def test_discounted_returns_rows_in_any_order_and_step_gaps():
    """Rows reversed give the same per-row returns. A missing step counts as reward 0:
    steps [0, 2] with rewards [0, 1], gamma 0.5 -> R_0 = 0.5^2 * 1 = 0.25."""
    perm = torch.tensor([5, 4, 3, 2, 1, 0])
    out = discounted_returns(REWARDS[perm], EPISODES[perm], STEPS[perm], 0.5)
    assert close(out, torch.tensor(RETURNS, dtype=F64)[perm], 1e-12)
    r, e = torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long)
    assert close(discounted_returns(r, e, torch.tensor([2, 0]), 0.5), [1.0, 0.25], 1e-12)


def test_anchor_groups_include_the_group_id():
    ids = anchor_groups(torch.tensor([0, 0, 1, 0]), ["a", "b", "a", "a"])
    assert ids.tolist() == [0, 1, 2, 0]


def test_gigpo_hand_worked():
    """A = A^E + A^S (omega 1), from the tables above:
    [A + 1, A + A, A + 0, A - 2A, A + A, -2A - 1] = [1.57735, 1.15470, 0.57735, -0.57735, 1.15470, -2.15470]."""
    a = gigpo(REWARDS, GROUPS, **INPUTS, gamma=0.5)
    expect = [e + s for e, s in zip(A_EPISODE, A_STEP)]
    assert close(a, expect, 1e-12)
    assert close(a, [1.57735, 1.15470, 0.57735, -0.57735, 1.15470, -2.15470], 1e-5)


def test_gigpo_without_std_and_step_weight():
    """scale_rewards=False (verl-agent's mean_norm): A^E [1/3 x5, -2/3] + A^S [1/4, 1/6, 0, -1/3, 1/6, -1/4]
    = [7/12, 1/2, 1/3, 0, 1/2, -11/12]. step_weight 0.5 halves A^S; step_weight 0 is episode_grpo."""
    a = gigpo(REWARDS, GROUPS, **INPUTS, gamma=0.5, scale_rewards=False)
    assert close(a, [7 / 12, 1 / 2, 1 / 3, 0.0, 1 / 2, -11 / 12], 1e-12)
    half = gigpo(REWARDS, GROUPS, **INPUTS, gamma=0.5, scale_rewards=False, step_weight=0.5)
    assert close(half, [e + 0.5 * s for e, s in zip(A_EPISODE_NO_STD, A_STEP_NO_STD)], 1e-12)
    none = gigpo(REWARDS, GROUPS, **INPUTS, gamma=0.5, step_weight=0.0)
    assert torch.equal(none, episode_grpo(REWARDS, GROUPS, episode_ids=EPISODES))


def test_gigpo_default_gamma_is_0_95():
    """hall with gamma 0.95: R_t [1, 0.95, 1], mean 0.98333, deviations [1/60, -1/30, 1/60]
    -> (no std) A^S = [0.016667, -0.033333, 0.016667]; start: [0.95, 0.9025, 0], mean 0.61750,
    deviations [0.3325, 0.285, -0.6175]."""
    a = gigpo(REWARDS, GROUPS, **INPUTS, scale_rewards=False)
    a_step = [0.3325, 1 / 60, 0.285, -1 / 30, 1 / 60, -0.6175]
    assert close(a, [e + s for e, s in zip(A_EPISODE_NO_STD, a_step)], 1e-12)


def test_gigpo_size_one_step_groups_get_zero_step_advantage():
    """Every state visited once: each step group has size 1, so A^S = 0 and A = A^E."""
    keys = ["s0", "s1", "s2", "s3", "s4", "s5"]
    a = gigpo(REWARDS, GROUPS, episode_ids=EPISODES, step_indices=STEPS, anchor_keys=keys, gamma=0.5)
    assert torch.equal(a, episode_grpo(REWARDS, GROUPS, episode_ids=EPISODES))
    # One lone state among shared ones: episode 1's step 1 moved to a state of its own.
    keys = ["start", "hall", "start", "side", "hall", "start"]
    a = gigpo(REWARDS, GROUPS, episode_ids=EPISODES, step_indices=STEPS, anchor_keys=keys, gamma=0.5)
    # hall = rows 1, 4 with R_t [1, 1]: constant -> 0; side: size 1 -> 0; start as before.
    assert close(a, [AE + S1, AE, AE, AE, AE, -2 * AE - S1], 1e-12)


def test_gigpo_rows_shuffled_give_the_same_per_row_answers():
    gen = torch.Generator().manual_seed(0)
    base = gigpo(REWARDS, GROUPS, **INPUTS, gamma=0.5)
    for _ in range(5):
        p = torch.randperm(6, generator=gen)
        a = gigpo(REWARDS[p], GROUPS[p], episode_ids=EPISODES[p], step_indices=STEPS[p],
                  anchor_keys=[KEYS[i] for i in p.tolist()], gamma=0.5)
        assert close(a, base[p], 1e-12)


def test_gigpo_groups_with_colliding_anchor_keys_are_not_mixed():
    """Two tasks, two one-step episodes each, all at state "start".
    task 0: rewards [1, 0] -> A^E = A^S = +-0.5 / 0.70711 = +-0.70711, A = +-1.41421.
    task 1: rewards [3, 3] -> constant: A = 0. Pooling "start" over both tasks would give
    task 1's rows a non-zero A^S (mean 1.75). Episode ids restart in each task (keyed by task)."""
    r = torch.tensor([1.0, 3.0, 0.0, 3.0], dtype=F64)
    g = torch.tensor([0, 1, 0, 1])
    e = torch.tensor([0, 0, 1, 1])
    s = torch.zeros(4, dtype=torch.long)
    a = gigpo(r, g, episode_ids=e, step_indices=s, anchor_keys=["start"] * 4)
    v = 2 * 0.5 / (math.sqrt(0.5) + EPS)
    assert close(a, [v, 0.0, -v, 0.0])
    assert a[1] == 0 and a[3] == 0
    # Same answer as computing each task alone.
    for task in (0, 1):
        m = g == task
        alone = gigpo(r[m], g[m], episode_ids=e[m], step_indices=s[m], anchor_keys=["start"] * int(m.sum()))
        assert torch.equal(a[m], alone)


def test_gigpo_constant_groups_are_exactly_zero():
    """All episodes fail (return 0): A^E = 0 and every anchor group's returns are 0 -> exactly 0.
    All succeed on their last step at the same depth from a shared state: still exactly 0."""
    r = torch.zeros(6)
    assert torch.equal(gigpo(r, GROUPS, **INPUTS), torch.zeros(6))
    r = torch.tensor([0.0, 1.0, 0.0, 1.0])
    g = torch.zeros(4, dtype=torch.long)
    e = torch.tensor([0, 0, 1, 1])
    s = torch.tensor([0, 1, 0, 1])
    a = gigpo(r, g, episode_ids=e, step_indices=s, anchor_keys=["x", "y", "x", "y"])
    assert a.dtype == torch.float32 and torch.equal(a, torch.zeros(4))


def test_gigpo_through_the_registry():
    """compute_advantages passes the trainer's kwargs through (scale_rewards, the declared inputs,
    algo.advantage_kwargs such as gamma / step_weight)."""
    a = compute_advantages("gigpo", REWARDS, GROUPS, scale_rewards=False, gamma=0.5, step_weight=0.5, **INPUTS)
    assert close(a, [e + 0.5 * s for e, s in zip(A_EPISODE_NO_STD, A_STEP_NO_STD)], 1e-12)
    assert torch.equal(compute_advantages("gigpo", REWARDS, GROUPS, gamma=0.5, **INPUTS),
                       gigpo(REWARDS, GROUPS, gamma=0.5, **INPUTS))


def test_gigpo_missing_inputs_raise_clearly():
    with pytest.raises(ValueError, match=r"gigpo needs an episode task.*missing: anchor_keys$"):
        gigpo(REWARDS, GROUPS, episode_ids=EPISODES, step_indices=STEPS)
    with pytest.raises(ValueError, match="environment task") as err:
        compute_advantages("gigpo", REWARDS, GROUPS)
    assert "missing: episode_ids, step_indices, anchor_keys" in str(err.value)


def test_gigpo_rejects_malformed_inputs():
    with pytest.raises(ValueError, match="anchor_keys must have one entry per row"):
        gigpo(REWARDS, GROUPS, episode_ids=EPISODES, step_indices=STEPS, anchor_keys=KEYS[:5])
    with pytest.raises(ValueError, match="step_indices must have one entry per row"):
        gigpo(REWARDS, GROUPS, episode_ids=EPISODES, step_indices=STEPS[:5], anchor_keys=KEYS)
    with pytest.raises(ValueError, match="unique within an episode"):
        gigpo(REWARDS, GROUPS, episode_ids=EPISODES, step_indices=torch.zeros(6, dtype=torch.long), anchor_keys=KEYS)
    with pytest.raises(ValueError, match="gamma"):
        gigpo(REWARDS, GROUPS, **INPUTS, gamma=1.5)


def test_empty_batch():
    r = torch.zeros(0)
    empty = torch.zeros(0, dtype=torch.long)
    assert episode_grpo(r, empty, episode_ids=empty).numel() == 0
    assert gigpo(r, empty, episode_ids=empty, step_indices=empty, anchor_keys=[]).numel() == 0


def _gigpo_by_loops(rewards, groups, episodes, steps, keys, gamma, eps, scale, weight):
    """A plain-Python GiGPO (the formulas of the docstring, one loop each) for the random check."""
    import statistics

    def norm(values):
        if len(values) < 2 or max(values) - min(values) < 1e-12:
            return [0.0] * len(values)
        mean, std = statistics.fmean(values), statistics.stdev(values)
        return [(v - mean) / (std + eps) if scale else v - mean for v in values]

    rows = list(range(len(rewards)))
    ep_key = [(groups[i], episodes[i]) for i in rows]
    ep_return = {k: sum(rewards[i] for i in rows if ep_key[i] == k) for k in set(ep_key)}
    a_ep = {}
    for g in set(groups):
        eps_g = sorted(k for k in ep_return if k[0] == g)
        a_ep.update(zip(eps_g, norm([ep_return[k] for k in eps_g])))
    ret = [sum(gamma ** (steps[j] - steps[i]) * rewards[j] for j in rows
               if ep_key[j] == ep_key[i] and steps[j] >= steps[i]) for i in rows]
    a_st = [0.0] * len(rows)
    for anchor in set(zip(groups, keys)):
        members = [i for i in rows if (groups[i], keys[i]) == anchor]
        for i, v in zip(members, norm([ret[i] for i in members])):
            a_st[i] = v
    return [a_ep[ep_key[i]] + weight * a_st[i] for i in rows]


@pytest.mark.parametrize("scale", [True, False])
def test_gigpo_matches_a_loop_reference_on_random_batches(scale):
    """Three tasks, four episodes each of 1-6 steps, rewards in {0, 1, -0.1}, states from a small
    set (so anchors repeat across and within episodes), rows shuffled."""
    gen = torch.Generator().manual_seed(1)
    groups, episodes, steps, keys, rewards = [], [], [], [], []
    for g in range(3):
        for ep in range(4):
            length = int(torch.randint(1, 7, (1,), generator=gen))
            for t in range(length):
                groups.append(g)
                episodes.append(ep)  # ids restart per task: episodes are keyed by (task, id)
                steps.append(t)
                keys.append(f"s{int(torch.randint(0, 3, (1,), generator=gen))}")
                rewards.append([0.0, 1.0, -0.1][int(torch.randint(0, 3, (1,), generator=gen))])
    p = torch.randperm(len(rewards), generator=gen).tolist()
    groups, episodes, steps, keys, rewards = ([x[i] for i in p] for x in (groups, episodes, steps, keys, rewards))
    a = gigpo(torch.tensor(rewards, dtype=F64), torch.tensor(groups), episode_ids=torch.tensor(episodes),
              step_indices=torch.tensor(steps), anchor_keys=keys, gamma=0.9, step_weight=0.7, scale_rewards=scale)
    ref = _gigpo_by_loops(rewards, groups, episodes, steps, keys, 0.9, EPS, scale, 0.7)
    assert close(a, ref, 1e-9)
