import math

import pytest
import torch

from mmrl.registry import SDE_SAMPLERS
from mmrl.diffusion.sde import (
    StepOutput,
    cps_step,
    dance_flow_step,
    ddim_step,
    flow_sde_step,
    gaussian_log_prob,
    ode_step,
    sde_step,
)

SHAPE = (3, 2, 4, 5)  # (B, C, H, W)
D = 2 * 4 * 5


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)


def _run(kind, v, x, noise, reduction):
    if kind == "flow_sde":
        return flow_sde_step(v, x, 0.6, 0.5, 0.7, noise=noise, reduction=reduction)
    if kind == "cps":
        return cps_step(v, x, torch.tensor([0.6, 0.7, 0.8]), torch.tensor([0.5, 0.6, 0.7]), 0.8,
                        noise=noise, reduction=reduction)
    if kind == "dance":
        return dance_flow_step(v, x, torch.tensor(0.6), torch.tensor(0.5), 0.3, noise=noise, reduction=reduction)
    return ddim_step(v, x, 0.5, 0.6, 1.0, noise=noise, reduction=reduction)


@pytest.mark.parametrize("kind", ["flow_sde", "dance", "ddim"])
def test_log_prob_matches_torch_normal(kind):
    v, x, noise = _inputs()
    out = _run(kind, v, x, noise, "sum")
    assert isinstance(out, StepOutput) and out.std.shape == (3,) and out.log_prob.shape == (3,)
    assert (out.std > 0).all()
    std = out.std.reshape(3, 1, 1, 1)
    ref = torch.distributions.Normal(out.mean, std.expand_as(out.mean)).log_prob(out.prev_sample).sum((1, 2, 3))
    torch.testing.assert_close(out.log_prob, ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out.prev_sample, out.mean + std * noise)
    mean_out = _run(kind, v, x, noise, "mean")
    torch.testing.assert_close(mean_out.log_prob, ref / D, atol=1e-5, rtol=1e-5)


def test_cps_log_prob_is_the_authors_squared_distance():
    """CPS's log-prob is the authors' -mean((x - mu)^2) ("remove all constants"), not the Gaussian
    density: on random inputs it equals -sum((prev - mean)^2) (sum reduction) and its /D (mean)."""
    v, x, noise = _inputs()
    out = _run("cps", v, x, noise, "sum")
    sq = ((out.prev_sample - out.mean) ** 2).sum((1, 2, 3))
    torch.testing.assert_close(out.log_prob, -sq)
    torch.testing.assert_close(_run("cps", v, x, noise, "mean").log_prob, -sq / D)


def test_cps_ratio_scale_hand_worked():
    """One 1-D CPS step: x = 1, v = 0.5, sigma = 0.5 -> 0.4, a = 0.8, noise = 0.3.
    std = 0.4 sin(0.4 pi) = 0.38042261; x0_hat = 1 - 0.5*0.5 = 0.75; x1_hat = 1 + 0.5*0.5 = 1.25;
    sqrt(0.4^2 - std^2) = sqrt(0.16 - 0.14472136) = 0.12360680;
    mean = 0.75*0.6 + 1.25*0.12360680 = 0.60450850; prev = mean + 0.3 std = 0.71863528;
    log_prob = -(0.3 std)^2 = -0.01302492.
    The same action under v' = 0.6: mean' = 0.7*0.6 + 1.3*0.12360680 = 0.58068884, so the step's
    log-ratio is -(prev - mean')^2 + (prev - mean)^2 = -0.00600430 -- which is 2 std^2 = 0.28944272
    times the Gaussian log-ratio -0.02074434: CPS's ratio is the Gaussian one scaled by 2 std^2."""
    x = torch.ones(1, 1)
    out = cps_step(torch.full((1, 1), 0.5), x, 0.5, 0.4, 0.8, noise=torch.full((1, 1), 0.3))
    assert abs(float(out.std) - 0.38042261) < 1e-6 and abs(float(out.mean) - 0.60450850) < 1e-6
    assert abs(float(out.prev_sample) - 0.71863528) < 1e-6
    assert abs(float(out.log_prob) - (-0.01302492)) < 1e-7
    moved = cps_step(torch.full((1, 1), 0.6), x, 0.5, 0.4, 0.8, prev_sample=out.prev_sample)
    cps_ratio = float(moved.log_prob - out.log_prob)
    gaussian_ratio = float(gaussian_log_prob(out.prev_sample, moved.mean, moved.std)
                           - gaussian_log_prob(out.prev_sample, out.mean, out.std))
    assert abs(cps_ratio - (-0.00600430)) < 1e-7
    assert abs(gaussian_ratio - (-0.02074434)) < 1e-6
    assert abs(cps_ratio - 0.28944272 * gaussian_ratio) < 1e-7


def test_flow_sde_hand_worked():
    # sample=1, v=0.5, sigma=0.5, sigma_next=0.4, a=0.7, noise=0.3
    # std_t = 0.7 * sqrt(0.5 / (1 - 0.5)) = 0.7 ; dt = -0.1
    # x coef = 1 + 0.49 / (2 * 0.5) * (-0.1) = 0.951
    # v coef = (1 + 0.49 * 0.5 / (2 * 0.5)) * (-0.1) = 1.245 * -0.1 = -0.1245 -> 0.5 * -0.1245 = -0.06225
    # mean = 0.951 - 0.06225 = 0.88875
    # step std = 0.7 * sqrt(0.1) = 0.22135944
    # prev = 0.88875 + 0.22135944 * 0.3 = 0.95515783
    # log_prob = -0.3^2 / 2 - log(0.22135944) - 0.5 log(2 pi) = -0.045 + 1.5079674 - 0.9189385 = 0.5440289
    one = lambda val: torch.full((1, 1), val)
    out = flow_sde_step(one(0.5), one(1.0), 0.5, 0.4, 0.7, noise=one(0.3))
    assert out.mean.item() == pytest.approx(0.88875, abs=1e-6)
    assert out.std.item() == pytest.approx(0.22135944, abs=1e-6)
    assert out.prev_sample.item() == pytest.approx(0.95515783, abs=1e-6)
    assert out.log_prob.item() == pytest.approx(0.5440289, abs=1e-5)


@pytest.mark.parametrize("kind", ["flow_sde", "cps", "dance", "ddim"])
def test_recompute_with_prev_sample_gives_identical_log_prob(kind):
    v, x, _ = _inputs(1)
    g = torch.Generator().manual_seed(7)
    if kind == "ddim":
        first = ddim_step(v, x, 0.5, 0.6, 1.0, generator=g)
        again = ddim_step(v, x, 0.5, 0.6, 1.0, prev_sample=first.prev_sample)
    else:
        first = sde_step(kind, v, x, 0.6, 0.5, 0.5, generator=g)
        again = sde_step(kind, v, x, 0.6, 0.5, 0.5, prev_sample=first.prev_sample)
    assert torch.equal(again.prev_sample, first.prev_sample)
    assert torch.equal(again.log_prob, first.log_prob)
    assert torch.equal(torch.exp(again.log_prob - first.log_prob), torch.ones(3))


def test_log_prob_gradient_flows_through_mean_only():
    """The sampled action is held fixed, so d log p / d v runs through the step's mean alone:
    mean = x (...) + v c with c = (1 + std_t^2 (1 - sigma) / (2 sigma)) dt, and log p is the mean
    over the D elements of -(x_prev - mean)^2 / (2 s^2) + const, so d log p / d v = c (x_prev - mean)
    / (s^2 D). At sigma 0.6 -> 0.5, a = 0.7: std_t = 0.7 sqrt(0.6 / 0.4) = 0.857321, std_t^2 = 0.735,
    dt = -0.1, c = (1 + 0.735 * 0.4 / 1.2) * -0.1 = -0.1245, s^2 = 0.735 * 0.1 = 0.0735. A
    reparametrised action (x_prev differentiated too) would make x_prev - mean constant in v and
    the gradient 0."""
    v, x, _ = _inputs(2)
    v.requires_grad_(True)
    out = flow_sde_step(v, x, 0.6, 0.5, 0.7, generator=torch.Generator().manual_seed(0))
    (grad,) = torch.autograd.grad(out.log_prob.sum(), v)
    d = v[0].numel()
    expected = -0.1245 * (out.prev_sample - out.mean).detach() / (0.0735 * d)
    assert grad.abs().sum() > 0 and torch.allclose(grad, expected, rtol=1e-4, atol=1e-7)


def test_flow_sde_noise_level_zero_equals_diffusers_euler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler()
    sched.set_timesteps(10)
    sigmas = sched.sigmas
    g = torch.Generator().manual_seed(3)
    x = torch.randn(SHAPE, generator=g)
    for i in range(10):  # all steps, including sigma == 1 (needs sigma_max) and sigma_next == 0
        v = torch.randn(SHAPE, generator=g)
        ref = sched.step(v, sched.timesteps[i], x).prev_sample
        ours = flow_sde_step(v, x, sigmas[i], sigmas[i + 1], 0.0, sigma_max=sigmas[1], noise=torch.randn(SHAPE))
        assert torch.equal(ours.prev_sample, ref)  # bit-exact: the a=0 coefficients are exactly 1
        assert torch.equal(ours.log_prob, torch.zeros(3)) and torch.equal(ours.std, torch.zeros(3))
        assert torch.equal(ode_step(v, x, sigmas[i], sigmas[i + 1]).prev_sample, ours.mean)
        x = ref


def test_cps_noise_level_zero_is_euler():
    # x=1, v=0.5, sigma=0.6, sigma'=0.5: x0_hat = 1 - 0.3 = 0.7 ; x1_hat = 1 + 0.4 * 0.5 = 1.2
    # mean = 0.7 * 0.5 + 1.2 * 0.5 = 0.95 = x + (0.5 - 0.6) * 0.5 = 1 - 0.05
    out = cps_step(torch.full((1, 1), 0.5), torch.ones(1, 1), 0.6, 0.5, 0.0, noise=torch.ones(1, 1))
    assert out.mean.item() == pytest.approx(0.95, abs=1e-6) and out.prev_sample.item() == pytest.approx(0.95, abs=1e-6)
    v, x, noise = _inputs(4)
    out = cps_step(v, x, 0.6, 0.5, 0.0, noise=noise)
    torch.testing.assert_close(out.prev_sample, x + (0.5 - 0.6) * v, atol=1e-6, rtol=0)
    assert torch.equal(out.log_prob, torch.zeros(3))
    # last step (sigma_next = 0): deterministic even with noise
    last = cps_step(v, x, 0.1, 0.0, 0.8, noise=noise)
    assert torch.equal(last.std, torch.zeros(3)) and torch.equal(last.log_prob, torch.zeros(3))
    torch.testing.assert_close(last.prev_sample, x - 0.1 * v)


def test_cps_preserves_noise_coefficient():
    # with v the exact velocity of x = (1-s) x0 + s n, prev = (1-s') x0 + s'(cos n + sin eps) for any eps
    v, x0, n = _inputs(5)
    x = 0.4 * x0 + 0.6 * n
    out = cps_step(n - x0, x, 0.6, 0.5, 0.5, noise=v)
    c, s = math.cos(math.pi / 4), math.sin(math.pi / 4)
    torch.testing.assert_close(out.prev_sample, 0.5 * x0 + 0.5 * (c * n + s * v), atol=1e-5, rtol=0)


def test_dance_hand_worked():
    # x=1, v=0.5, sigma=0.5, sigma'=0.4, eta=0.3: dsigma=-0.1 ; x0_hat = 1 - 0.25 = 0.75
    # score = -(1 - 0.5 * 0.75) / 0.25 = -2.5 ; mean = 1 - 0.05 - 0.5 * 0.09 * (-2.5) * (-0.1) = 0.93875
    # std = 0.3 * sqrt(0.1) = 0.09486833
    out = dance_flow_step(torch.full((1, 1), 0.5), torch.ones(1, 1), 0.5, 0.4, 0.3, noise=torch.zeros(1, 1))
    assert out.mean.item() == pytest.approx(0.93875, abs=1e-6)
    assert out.std.item() == pytest.approx(0.09486833, abs=1e-6)


@pytest.mark.parametrize("eta,clip", [(0.0, False), (1.0, False), (1.0, True)])
def test_ddim_matches_diffusers(eta, clip):
    """Against DDIMScheduler.step; with ``clip_sample`` (range 1, as ddpo-pytorch's SD checkpoints
    set it) the predicted x0 is clamped first -- the inputs here are wide enough that it binds."""
    from diffusers import DDIMScheduler

    sched = DDIMScheduler(clip_sample=clip, clip_sample_range=1.0, set_alpha_to_one=False)
    clip_range = sched.config.clip_sample_range if clip else None
    clamped = 0
    sched.set_timesteps(10)
    ac = sched.alphas_cumprod
    step = sched.config.num_train_timesteps // sched.num_inference_steps
    g = torch.Generator().manual_seed(6)
    x = torch.randn(SHAPE, generator=g)
    for t in sched.timesteps.tolist():
        eps = torch.randn(SHAPE, generator=g)
        z = torch.randn(SHAPE, generator=g)
        ab_prev = ac[t - step] if t - step >= 0 else sched.final_alpha_cumprod
        kw = {"variance_noise": z} if eta > 0 else {}
        ref = sched.step(eps, t, x, eta=eta, **kw).prev_sample
        ours = ddim_step(eps, x, ac[t], ab_prev, eta, noise=z, clip_sample_range=clip_range)
        torch.testing.assert_close(ours.prev_sample, ref, atol=1e-6, rtol=1e-6)
        clamped += int((((x - (1 - ac[t]).sqrt() * eps) / ac[t].sqrt()).abs() > 1).sum())
        if t - step >= 0:  # last step: alpha_bar_prev == alpha_bar_t (set_alpha_to_one=False) -> variance 0
            assert bool((ours.std > 0).all()) == (eta > 0)
        x = ref
    assert clamped > 0  # the clamp mattered in the clip case (and would have in the others)


def test_sigma_one_needs_sigma_max():
    v, x, noise = _inputs(8)
    with pytest.raises(ValueError, match="sigma_max"):
        flow_sde_step(v, x, 1.0, 0.9, 0.7, noise=noise)
    out = flow_sde_step(v, x, 1.0, 0.9, 0.7, sigma_max=0.9, noise=noise)
    assert torch.isfinite(out.prev_sample).all() and torch.isfinite(out.log_prob).all()
    # per-sample sigmas, only one of them at 1
    out = flow_sde_step(v, x, torch.tensor([1.0, 0.8, 0.6]), torch.tensor([0.9, 0.7, 0.5]), 0.7,
                        sigma_max=0.9, noise=noise)
    assert torch.isfinite(out.log_prob).all() and out.std.shape == (3,)


def test_half_inputs_give_float32():
    v, x, noise = (t.half() for t in _inputs(9))
    for kind in SDE_SAMPLERS.names():
        out = sde_step(kind, v, x, 0.6, 0.5, 0.5, noise=noise)
        assert out.prev_sample.dtype == out.log_prob.dtype == out.mean.dtype == out.std.dtype == torch.float32
    assert ddim_step(v, x, 0.5, 0.6, noise=noise).prev_sample.dtype == torch.float32
    assert ode_step(v, x, 0.6, 0.5).prev_sample.dtype == torch.float32


def test_sde_step_dispatch_and_unknown_kind():
    v, x, noise = _inputs(10)
    a = sde_step("dance", v, x, 0.6, 0.5, 0.4, noise=noise)
    b = dance_flow_step(v, x, 0.6, 0.5, eta=0.4, noise=noise)
    assert torch.equal(a.prev_sample, b.prev_sample)
    with pytest.raises(ValueError, match="cps"):
        sde_step("nope", v, x, 0.6, 0.5, 0.4)


def test_gaussian_log_prob_zero_std_and_bad_reduction():
    x = torch.randn(2, 3)
    assert torch.equal(gaussian_log_prob(x, x + 1, 0.0), torch.zeros(2))
    lp = gaussian_log_prob(x, x, torch.tensor([0.0, 1.0]), reduction="sum")
    assert lp[0] == 0 and lp[1] == pytest.approx(-3 * 0.5 * math.log(2 * math.pi), abs=1e-5)
    with pytest.raises(ValueError):
        gaussian_log_prob(x, x, 1.0, reduction="max")
