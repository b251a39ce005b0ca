"""Hand-worked checks of mmrl.core.batch.aggregation.aggregate_rewards."""

import math

import pytest
import torch

from mmrl.core.batch.aggregation import aggregate_rewards

F64 = torch.float64
EPS = 1e-6

# Four samples, two groups (0, 0, 1, 1). "iou" lives in [0, 1], "count" in [0, 100],
# "format" is 1 everywhere.
COMPONENTS = {
    "iou": torch.tensor([0.2, 0.4, 0.6, 0.8], dtype=F64),
    "count": torch.tensor([100.0, 0.0, 50.0, 50.0], dtype=F64),
    "format": torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=F64),
}
WEIGHTS = {"iou": 1.0, "count": 0.5, "format": 2.0}


def close(a, b, tol=1e-6):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


def test_weighted_sum():
    """R = 1 * iou + 0.5 * count + 2 * format:
    [0.2 + 50 + 2, 0.4 + 0 + 2, 0.6 + 25 + 2, 0.8 + 25 + 2] = [52.2, 2.4, 27.6, 27.8].
    The count reward's spread (50) swamps the iou ranking (0.2 steps)."""
    total = aggregate_rewards(COMPONENTS, WEIGHTS, "weighted_sum")
    assert close(total, [52.2, 2.4, 27.6, 27.8], tol=1e-12)


def test_zscore_over_the_batch():
    """Each component standardised over the batch (unbiased std) before weighting.
    iou: mean 0.5, deviations [-.3, -.1, .1, .3], var 0.2/3, std 0.258199
      -> [-1.161895, -0.387298, 0.387298, 1.161895].
    count: mean 50, deviations [50, -50, 0, 0], var 5000/3, std 40.824829
      -> [1.224745, -1.224745, 0, 0].
    format: constant -> contributes exactly 0.
    R = 1 * iou + 0.5 * count = [-0.549523, -0.999671, 0.387298, 1.161895]."""
    total = aggregate_rewards(COMPONENTS, WEIGHTS, "zscore")
    assert close(total, [-0.549523, -0.999671, 0.387298, 1.161895], tol=1e-5)
    iou = (COMPONENTS["iou"] - 0.5) / (math.sqrt(0.2 / 3) + EPS)
    count = (COMPONENTS["count"] - 50) / (math.sqrt(5000 / 3) + EPS)
    assert close(total, iou + 0.5 * count, tol=1e-12)
    only_format = aggregate_rewards({"format": COMPONENTS["format"]}, {"format": 2.0}, "zscore")
    assert torch.equal(only_format, torch.zeros(4, dtype=F64))
    # a constant that is not exactly representable is still exactly 0
    tenth = aggregate_rewards({"x": torch.full((3,), 0.1)}, {"x": 1.0}, "zscore")
    assert torch.equal(tenth, torch.zeros(3))


def test_group_zscore():
    """Standardised within each group (0, 0 | 1, 1); a pair's unbiased std is |a - b|/sqrt(2).
    iou: group 0 [.2, .4] -> [-0.707107, 0.707107]; group 1 [.6, .8] -> same.
    count: group 0 [100, 0] -> [0.707107, -0.707107]; group 1 [50, 50] constant -> 0.
    format: 0. R = iou + 0.5 * count = [-0.353553, 0.353553, -0.707107, 0.707107]."""
    g = torch.tensor([0, 0, 1, 1])
    total = aggregate_rewards(COMPONENTS, WEIGHTS, "group_zscore", group_ids=g)
    assert close(total, [-0.353553, 0.353553, -0.707107, 0.707107], tol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="same rewards"):
        aggregate_rewards(COMPONENTS, {"iou": 1.0}, "weighted_sum")
    with pytest.raises(ValueError, match="mode"):
        aggregate_rewards(COMPONENTS, WEIGHTS, "mean")
    with pytest.raises(ValueError, match="group_ids"):
        aggregate_rewards(COMPONENTS, WEIGHTS, "group_zscore")
    with pytest.raises(ValueError, match="1-D of one length"):
        aggregate_rewards({"a": torch.zeros(3), "b": torch.zeros(4)}, {"a": 1.0, "b": 1.0})


def test_single_sample_and_integer_scores():
    """One sample has std 0, so zscore gives 0; integer scores are promoted to float."""
    assert torch.equal(aggregate_rewards({"a": torch.tensor([3.0])}, {"a": 1.0}, "zscore"), torch.zeros(1))
    total = aggregate_rewards({"a": torch.tensor([1, 0])}, {"a": 0.5})
    assert total.dtype == torch.float32 and close(total, [0.5, 0.0])
