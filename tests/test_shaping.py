"""Hand-worked checks of reward-side length shaping (mmrl.core.batch.shaping) and of the KL-weight and
reference-reset schedules (mmrl.core.schedules)."""

import pytest
import torch

from mmrl.core.schedules import kl_coef_at, should_reset_reference
from mmrl.core.batch.shaping import overlong_mask, soft_overlong_penalty


def test_overlong_mask():
    """Truncated samples get 0 (dropped from the loss), the others 1; applied to the action
    mask before the normalisers, the dropped sample adds no tokens."""
    assert torch.equal(overlong_mask(torch.tensor([False, True, False])), torch.tensor([1.0, 0.0, 1.0]))
    assert torch.equal(overlong_mask([True, False]), torch.tensor([0.0, 1.0]))
    assert torch.equal(overlong_mask(None, n=2), torch.ones(2))
    action_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    mask = action_mask * overlong_mask(torch.tensor([False, True]))[:, None]
    assert mask.sum() == 2
    with pytest.raises(ValueError, match="n"):
        overlong_mask(None)


def test_soft_overlong_penalty_boundaries():
    """max_len 20, buffer 4 -> start 16, penalty 1:
    L = 10, 16 -> 0 (at start: still free); 17 -> -(17 - 16) / 4 = -0.25; 18 -> -0.5;
    20 -> -1 (exactly -penalty at max_len); 21, 30 -> -1. penalty 0.5 halves every value."""
    lengths = torch.tensor([10, 16, 17, 18, 20, 21, 30])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    assert torch.allclose(soft_overlong_penalty(lengths, 20, 4), expected)
    assert torch.allclose(soft_overlong_penalty(lengths, 20, 4, penalty=0.5), expected / 2)
    assert torch.allclose(soft_overlong_penalty([3, 4], 4, 4), torch.tensor([-0.75, -1.0]))
    with pytest.raises(ValueError, match="buffer_len"):
        soft_overlong_penalty([1], 4, 0)
    with pytest.raises(ValueError, match="buffer_len"):
        soft_overlong_penalty([1], 4, 5)


def test_kl_schedules():
    """constant: beta everywhere. linear_decay 0.1 -> 0.02 over 100 steps: step 0 0.1,
    step 50 0.06, step 100 and later 0.02. grpo_d 0 -> 0.1 over ramp 0.5 * 100 = 50 steps:
    step 0 -> 0, step 25 -> 0.05, step 50 and later -> 0.1; beta_min 0.01, beta_max 0.05 over
    100 steps: step 20 -> 0.01 + 0.04 * 0.2 = 0.018."""
    assert kl_coef_at(7, 0.04) == 0.04
    assert kl_coef_at(7, 0.04, "constant", total_steps=10) == 0.04
    lin = dict(total_steps=100, beta_end=0.02)
    assert [round(kl_coef_at(s, 0.1, "linear_decay", **lin), 12) for s in (0, 50, 100, 150)] == [
        0.1, 0.06, 0.02, 0.02]
    d = dict(total_steps=100, ramp_frac=0.5)
    assert [round(kl_coef_at(s, 0.1, "grpo_d", **d), 12) for s in (0, 25, 50, 99)] == [0.0, 0.05, 0.1, 0.1]
    assert abs(kl_coef_at(20, 0.0, "grpo_d", total_steps=100, beta_min=0.01, beta_max=0.05) - 0.018) < 1e-12
    with pytest.raises(ValueError, match="total_steps"):
        kl_coef_at(1, 0.1, "grpo_d")
    with pytest.raises(ValueError, match="algo.kl_schedule.*known: constant, grpo_d, linear_decay"):
        kl_coef_at(1, 0.1, "cosine")


def test_should_reset_reference():
    """every 3: reset after steps 3, 6, 9 (1-based count of completed steps), never at 0;
    every None/0 never."""
    assert [s for s in range(10) if should_reset_reference(s, 3)] == [3, 6, 9]
    assert not any(should_reset_reference(s, None) or should_reset_reference(s, 0) for s in range(10))
