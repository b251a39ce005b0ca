import pytest
import torch

from mmrl.core.losses import ObjectiveConfig
from mmrl.diffusion.losses import (
    awm_log_likelihood,
    flow_matching_target,
    guard_log_ratio,
    nft_errors,
    nft_optimality,
    noised,
)
from mmrl.diffusion.sde import gaussian_log_prob
from mmrl.registry import LOSSES


def nft_loss(v, v_old, x0, noise, advantages, beta=1.0, adv_clip_max=5.0):
    """The registered ``nft`` loss per sample (B,), on what the policy hands it: the errors of
    nft_errors as (B, 1) actions (one denoising step), one advantage per sample."""
    positive, negative = nft_errors(v, v_old, x0, noise, beta)
    sur = LOSSES.get("nft")(None, None, advantages[:, None], torch.ones(len(advantages), 1),
                            ObjectiveConfig(loss_type="nft"), positive=positive[:, None],
                            negative=negative[:, None], adv_max=adv_clip_max)
    return sur.pg[:, 0]


def test_guard_log_ratio_hand_computed():
    # sample 0: mean - old_mean = [0.2, 0.4] -> mse = (0.04 + 0.16) / 2 = 0.1 ; s = 0.5, log r = -0.3
    #   corrected = -0.3 * 0.5 + 0.1 / (2 * 0.5) = -0.15 + 0.1 = -0.05
    # sample 1: mse = 0.01 ; s = 0.1, log r = 0.2 -> 0.2 * 0.1 + 0.01 / 0.2 = 0.02 + 0.05 = 0.07
    # sample 2: s = 0 (deterministic step) -> 0
    mean = torch.tensor([[0.2, 0.4], [0.1, -0.1], [5.0, 5.0]])
    old_mean = torch.zeros(3, 2)
    out = guard_log_ratio(torch.tensor([-0.3, 0.2, 1.0]), torch.zeros(3), mean, old_mean, torch.tensor([0.5, 0.1, 0.0]))
    torch.testing.assert_close(out, torch.tensor([-0.05, 0.07, 0.0]))
    assert out.dtype == torch.float32


def test_guard_log_ratio_recentres_monte_carlo():
    n, delta, s = 20000, 0.3, 0.5
    g = torch.Generator().manual_seed(0)
    old_mean = torch.zeros(n, 1)
    mean = torch.full((n, 1), delta)
    prev = old_mean + s * torch.randn(n, 1, generator=g)  # actions drawn from the old policy
    raw = gaussian_log_prob(prev, mean, s, "sum") - gaussian_log_prob(prev, old_mean, s, "sum")
    corrected = guard_log_ratio(gaussian_log_prob(prev, mean, s, "sum"), gaussian_log_prob(prev, old_mean, s, "sum"),
                                mean, old_mean, torch.full((n,), s))
    bias = -(delta**2) / (2 * s**2)  # -0.18
    assert raw.mean().item() == pytest.approx(bias, abs=0.02)  # std 0.6 -> s.e. 0.004
    assert raw.std().item() == pytest.approx(delta / s, rel=0.05)
    assert corrected.mean().item() == pytest.approx(0.0, abs=0.01)  # std 0.3 -> s.e. 0.002
    assert corrected.std().item() == pytest.approx(delta, rel=0.05)


def test_target_and_noised():
    x0, noise = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -1.0]])
    torch.testing.assert_close(flow_matching_target(x0, noise), torch.tensor([[2.0, -3.0]]))
    # 0.75 * [1, 2] + 0.25 * [3, -1] = [1.5, 1.25]
    torch.testing.assert_close(noised(x0, noise, 0.25), torch.tensor([[1.5, 1.25]]))
    torch.testing.assert_close(noised(x0.repeat(2, 1), noise.repeat(2, 1), torch.tensor([0.0, 1.0])),
                               torch.tensor([[1.0, 2.0], [3.0, -1.0]]))


def test_awm_log_likelihood_numbers():
    # target = noise - x0 = [2, -3]; v - target = [0.5, 1.0] -> -(0.25 + 1) / 2 = -0.625
    v = torch.tensor([[2.5, -2.0]], dtype=torch.float16)
    out = awm_log_likelihood(v, torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -1.0]]))
    torch.testing.assert_close(out, torch.tensor([-0.625]))
    assert out.dtype == torch.float32


def _nft_example():
    v = torch.tensor([[1.0, 0.0]])
    v_old = torch.tensor([[0.5, 0.5]])
    x0, noise = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 1.0]])  # target = [1, 0]
    return v, v_old, x0, noise


def test_nft_loss_hand_computed():
    v, v_old, x0, noise = _nft_example()
    # A = 2.5, max 5 -> r = 2.5 / 5 / 2 + 0.5 = 0.75
    # beta = 0.5: v+ = 0.5 v + 0.5 v_old = [0.75, 0.25] ; v- = 1.5 v_old - 0.5 v = [0.25, 0.75]
    # pos = mean([(0.75-1)^2, 0.25^2]) = 0.0625 ; neg = mean([(0.25-1)^2, 0.75^2]) = 0.5625
    # loss = 0.75 * 0.0625 + 0.25 * 0.5625 = 0.1875
    out = nft_loss(v, v_old, x0, noise, torch.tensor([2.5]), beta=0.5, adv_clip_max=5.0)
    torch.testing.assert_close(out, torch.tensor([0.1875]))
    # beta = 1: v+ = v = [1, 0] (pos 0) ; v- = 2 v_old - v = [0, 1] (neg 1) -> 0.25
    torch.testing.assert_close(nft_loss(v, v_old, x0, noise, torch.tensor([2.5])), torch.tensor([0.25]))


def test_nft_optimality_clips():
    r = nft_optimality(torch.tensor([-100.0, -5.0, -2.5, 0.0, 2.5, 5.0, 100.0]), 5.0)
    torch.testing.assert_close(r, torch.tensor([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]))


def test_nft_gradients():
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    target = noise - x0
    v0 = torch.randn(2, 3, 4, generator=g)

    # r = 1, beta = 1: exactly the flow-matching gradient on positive samples
    v = v0.clone().requires_grad_(True)
    (g_nft,) = torch.autograd.grad(nft_loss(v, v0, x0, noise, torch.full((2,), 50.0)).sum(), v)
    w = v0.clone().requires_grad_(True)
    (g_fm,) = torch.autograd.grad(((w - target) ** 2).mean((1, 2)).sum(), w)
    torch.testing.assert_close(g_nft, g_fm)

    # r = 0 (on-policy, v_old = v): descent moves v away from the target
    v = v0.clone().requires_grad_(True)
    (g_neg,) = torch.autograd.grad(nft_loss(v, v0, x0, noise, torch.full((2,), -50.0)).sum(), v)
    assert ((-g_neg) * (v0 - target)).sum((1, 2)).gt(0).all()
    stepped = v0 - 0.1 * g_neg
    assert ((stepped - target) ** 2).sum() > ((v0 - target) ** 2).sum()
    # old_velocity is treated as a constant
    v_old = v0.clone().requires_grad_(True)
    nft_loss(v0.clone().requires_grad_(True), v_old, x0, noise, torch.zeros(2)).sum().backward()
    assert v_old.grad is None
