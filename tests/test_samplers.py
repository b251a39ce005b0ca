"""Prompt samplers: uniform epochs, MMR1 variance-aware sampling, DUMP's UCB over sources."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.core.batch.prompts import (
    DUMPSampler,
    UniformSampler,
    VarianceAwareSampler,
    make_sampler,
    outcome_variance,
    trajectory_diversity,
)
from mmrl.core.seeding import stream_seed


def test_uniform_is_seeded_epochs():
    s = UniformSampler({"t": 10}, batch=4, seed=3)
    perm0 = torch.randperm(10, generator=torch.Generator().manual_seed(stream_seed(3, 0, "epoch_order"))).tolist()
    perm1 = torch.randperm(10, generator=torch.Generator().manual_seed(stream_seed(3, 1, "epoch_order"))).tolist()
    assert s.indices(0) == perm0[:4] and s.indices(1) == perm0[4:8]
    assert s.indices(2) == perm0[8:] + perm1[:2]  # crosses into epoch 1
    assert sorted(s.indices(0) + s.indices(1) + perm0[8:]) == list(range(10))
    assert s.indices(1, round=1) != s.indices(1) and s.indices(1, round=1) == s.indices(1, round=1)


def test_outcome_variance_hand_values():
    """Bernoulli: 2 of 4 right -> p(1-p) = 0.25; all equal -> 0; (0.5, 1.0): mean .75, var .0625."""
    assert outcome_variance(torch.tensor([1.0, 0, 1, 0])) == pytest.approx(0.25)
    assert outcome_variance(torch.tensor([1.0, 1, 1])) == 0.0
    assert outcome_variance(torch.tensor([0.5, 1.0])) == pytest.approx(0.0625)


def test_trajectory_diversity_hand_values():
    """{a,b} vs {a,c}: Jaccard 1/3 -> distance 2/3. a, a, b: pair distances 0, 1, 1 -> 2/3."""
    assert trajectory_diversity(["a b", "a c"]) == pytest.approx(2 / 3)
    assert trajectory_diversity(["a", "a", "b"]) == pytest.approx(2 / 3)
    assert trajectory_diversity(["same text"] * 3) == 0.0
    assert trajectory_diversity(["one"]) == 0.0


def test_variance_sampler_redraws_high_variance_prompts():
    """VPS = OVS + 0.5 TDS. Prompt 7: rewards (1, 0), completions "x y" / "x z" -> 0.25 + 0.5*2/3;
    prompt 8: (1, 1) identical -> 0 (never redrawn by weight); prompt 9: (0, 1) "p" / "q" -> 0.75."""
    s = VarianceAwareSampler({"t": 1000}, batch=4, seed=0, alpha=1.0, beta=0.5, mix=0.5)
    m = s.observe([7, 8, 9], torch.tensor([1.0, 0, 1, 1, 0, 1]), torch.zeros(6), torch.tensor([0, 0, 1, 1, 2, 2]),
                  ["x y", "x z", "s", "s", "p", "q"])
    assert s.scores == pytest.approx({7: 0.25 + 0.5 * 2 / 3, 8: 0.0, 9: 0.75})
    assert m["sampler/tracked"] == 3
    idx = s.indices(5)
    assert len(idx) == 4 and sorted(idx[:2]) == [7, 9]  # mix * batch = 2 weighted draws, both positive prompts
    assert idx[2:] == [i for i in s.uniform_indices(5) if i not in (7, 9)][:2]
    assert s.indices(5) == idx  # deterministic
    t = VarianceAwareSampler({"t": 1000}, batch=4, seed=0, alpha=1.0, beta=0.5, mix=0.5)
    t.load_state_dict(s.state_dict())
    assert t.indices(5) == idx


def test_dump_ucb_hand_values():
    """a: 4 samples, window |A| (1, 1, 0, 0) -> mean .5; b: 12 samples, window of .25s. ln 16 =
    2.7726: UCB_a = .5 + sqrt(2*2.7726/4) = 1.6774, UCB_b = .25 + sqrt(2*2.7726/12) = .9298;
    softmax at T = 0.1: p_a = 1 / (1 + exp(-(16.774 - 9.298))) = 0.99943."""
    s = DUMPSampler({"a": 5, "b": 7}, batch=8, seed=0)
    assert s.probabilities() == {"a": 0.5, "b": 0.5}  # both unseen
    s.observe([0], torch.zeros(4), torch.tensor([1.0, -1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long), [""] * 4)
    assert s.probabilities() == {"a": 0.0, "b": 1.0}  # b still unseen: tried first
    s.observe([5, 6, 7], torch.zeros(12), torch.full((12,), 0.25) * torch.tensor([1, -1] * 6),
              torch.arange(3).repeat_interleave(4), [""] * 12)
    ucb = s.ucb()
    assert ucb["a"] == pytest.approx(0.5 + math.sqrt(2 * math.log(16) / 4), abs=1e-9)
    assert ucb["b"] == pytest.approx(0.25 + math.sqrt(2 * math.log(16) / 12), abs=1e-9)
    assert s.probabilities()["a"] == pytest.approx(0.99943, abs=1e-5)
    idx = s.indices(3)
    assert all(0 <= i < 5 for i in idx)  # p_a ~ 1: every prompt from source a (offsets 0..4)
    t = DUMPSampler({"a": 5, "b": 7}, batch=8, seed=0)
    t.load_state_dict(s.state_dict())
    assert t.indices(3) == idx and t.ucb() == ucb


def test_dump_shifts_to_the_source_with_signal():
    """Source "solved" always gives |A| = 0, "learnable" |A| = 1: after a few steps nearly all
    prompts come from "learnable"."""
    s = DUMPSampler({"solved": 100, "learnable": 100}, batch=16, seed=1, window=50)
    for step in range(1, 6):
        idx = s.indices(step)
        adv = torch.tensor([0.0 if s.source_of(i) == "solved" else 1.0 for i in idx])
        s.observe(idx, torch.zeros(16), adv, torch.arange(16), [""] * 16)
    late = s.indices(6)
    assert sum(s.source_of(i) == "learnable" for i in late) >= 15


def test_make_sampler_errors():
    with pytest.raises(KeyError, match=r"unknown data sampler 'vas'.*known: dump, uniform, variance"):
        make_sampler("vas", {"t": 3}, 2, 0)
    with pytest.raises(ValueError, match="task.name=mixture"):
        make_sampler("dump", {"t": 3}, 2, 0)
    with pytest.raises(ValueError, match=r"data.sampler_kwargs: the variance sampler takes no lamda \(it takes: alpha, beta"):
        make_sampler("variance", {"t": 3}, 2, 0, lamda=0.3)
