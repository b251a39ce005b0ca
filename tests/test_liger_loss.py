"""train.use_liger_loss: Liger's fused LM head + clipped GRPO loss (mmrl/vlm/liger.py) against the
lean path (chunked log-probs + the core objective).

Liger's chunked loss is plain torch (its Triton kernels are elsewhere), so the mapping is checked on
the CPU by calling it directly (``compiled=False``): every loss aggregation, the clip-higher range,
temperature, suppressed vision tokens (at the vocabulary's edges too), the rollout importance
weight, mini-batch normalisers; loss and gradients equal in float32 (1e-5 / 1e-6). Through the
policy too, with the CUDA check lifted and Liger uncompiled; as configured (compiled, refused on a
CPU) it runs only on CUDA: that test is marked ``gpu``. The settings Liger does not compute are refused at setup, naming the key."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.config import ConfigError
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.vlm.liger import check_liger, fused_loss
from mmrl.vlm.logprobs import token_logprobs

pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed (pip install 'mmrl[fit]')")

V, H = 40, 8


def _inputs(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    targets = torch.randint(6, V - 1, (B, T), generator=g)  # never a suppressed id (0, 5, V - 1)
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    mask[3] = 0  # an empty row (overlong-filtered): left out of num_seqs
    advantages = torch.tensor([1.0, -0.5, 0.8, 0.3])
    return hidden, head, targets, mask, advantages, g


def _both(cfg, temperature=0.7, suppressed=(0, 5, V - 1), rollout=False, old=True, num_tokens=30.0, num_seqs=5.0):
    """(loss, metrics, grad of hidden, grad of the head) of the lean path and of Liger's."""
    hidden, head, targets, mask, advantages, g = _inputs()
    lean_logps = token_logprobs(hidden, head, targets, temperature, suppressed)
    old_logps = (lean_logps + 0.3 * torch.randn(lean_logps.shape, generator=g)).detach() if old else None
    rollout_logps = (lean_logps + 0.5 * torch.randn(lean_logps.shape, generator=g)).detach() if rollout else None
    out = []
    for fused in (False, True):
        h = hidden.clone().requires_grad_(True)
        head.zero_grad()
        if fused:
            loss, metrics = fused_loss(h, head, targets, mask, advantages, old_logps, rollout_logps, cfg, num_tokens,
                                       num_seqs, temperature, suppressed, compiled=False)
        else:
            logps = token_logprobs(h, head, targets, temperature, suppressed) * mask
            loss, metrics = Objective(cfg)(logps, old_logps, advantages, mask, rollout_logps=rollout_logps,
                                           num_tokens=num_tokens, num_seqs=num_seqs)
        loss.backward()
        out.append((loss.detach(), metrics, h.grad.clone(), head.weight.grad.clone()))
    return out


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
def test_every_aggregation_equals_the_lean_path(mode):
    """Clip-higher (0.2 / 0.28), temperature 0.7, three suppressed ids (the first and last of the
    vocabulary among them), a micro-batch's share of the mini-batch's 30 tokens / 5 sequences."""
    cfg = ObjectiveConfig(loss_agg_mode=mode, epsilon=0.2, epsilon_high=0.28, max_completion_length=8)
    lean, liger = _both(cfg)
    torch.testing.assert_close(liger[0], lean[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(liger[2], lean[2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(liger[3], lean[3], rtol=1e-5, atol=1e-6)
    assert lean[1]["clip_frac_low"] + lean[1]["clip_frac_high"] > 0  # the clip is exercised
    assert liger[1]["clip_frac"] == pytest.approx(lean[1]["clip_frac_low"] + lean[1]["clip_frac_high"], abs=1e-6)
    assert liger[1]["loss"] == pytest.approx(float(lean[0]), rel=1e-5)


def test_rollout_importance_weight_and_one_iteration():
    """The rollout engine's truncated importance weight (token_truncate, at most 2) multiplies the
    clipped term in both; without old log-probs (one iteration) the ratio is 1 in both."""
    cfg = ObjectiveConfig(loss_agg_mode="token_mean")
    lean, liger = _both(cfg, rollout=True)
    torch.testing.assert_close(liger[0], lean[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(liger[2], lean[2], rtol=1e-5, atol=1e-6)
    lean, liger = _both(cfg, old=False, temperature=1.0, suppressed=())
    torch.testing.assert_close(liger[0], lean[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(liger[3], lean[3], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("override, key", [
    ("algo.loss_type=gspo", "algo.loss_type"), ("algo.beta=0.04", "algo.beta"), ("algo.entropy_coef=0.01",
                                                                                  "algo.entropy_coef"),
    ("algo.top_entropy_quantile=0.2", "algo.top_entropy_quantile"), ("algo.dual_clip_c=3", "algo.dual_clip_c"),
    ("algo.clip_pos=[0.2,0.3]", "algo.clip_pos")])
def test_settings_liger_does_not_compute_are_refused(override, key):
    cfg = make_config("train.use_liger_loss=true", override)
    with pytest.raises(ConfigError, match=f"train.use_liger_loss=true: {key}"):
        check_liger(cfg, torch.device("cuda"))
    check_liger(make_config("train.use_liger_loss=true"), torch.device("cuda"))  # the default objective passes


def test_an_objective_it_does_not_fuse_is_refused_when_called():
    """The objective the trainer hands over is checked again (mmrl sft's likelihood, a KL that a
    schedule turned on): never a clip loss computed in its place."""
    hidden, head, targets, mask, advantages, _ = _inputs()
    for cfg in (ObjectiveConfig.reference_likelihood(), ObjectiveConfig(beta=0.01), ObjectiveConfig(entropy_coef=0.1)):
        with pytest.raises(ValueError, match="train.use_liger_loss=true fuses the clip loss alone"):
            fused_loss(hidden, head, targets, mask, advantages, None, None, cfg, None, None, 1.0, (), compiled=False)


def test_a_cpu_run_and_a_generator_are_refused(random_tiny_dir):
    from mmrl.vlm.policy import VLMPolicy

    with pytest.raises(ConfigError, match="train.use_liger_loss=true: .*CUDA.*set train.use_liger_loss=false"):
        VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "train.use_liger_loss=true"))
    from mmrl.diffusion.policy import DiffusionPolicy

    with pytest.raises(ValueError, match="train.use_liger_loss=true: DiffusionPolicy has no fused loss"):
        DiffusionPolicy(make_config("train.device=cpu", "train.use_liger_loss=true", "task.name=composition"),
                        pipeline=object())


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["train.shared_prefix=true", "train.padding_free=true"])
def test_the_policys_update_through_liger_on_the_cpu(layout, random_tiny_dir, monkeypatch):
    """The policy's wiring (hidden states, targets, mask, suppressed vision tokens, temperature,
    normalisers, micro-batches of 4 over 6 samples; shared prefix or packed rows) checked on the
    CPU: the CUDA check lifted and Liger uncompiled, one update's loss and every gradient as the
    lean path's."""
    import mmrl.vlm.liger as liger

    monkeypatch.setattr(liger, "check_liger", lambda cfg, device: None)
    fused, calls = liger.fused_loss, []
    monkeypatch.setattr(liger, "fused_loss", lambda *a, **k: calls.append(1) or fused(*a, **{**k, "compiled": False}))
    _compare_updates(random_tiny_dir, "cpu", "train.micro_batch_size=4", layout)
    assert len(calls) == 2  # the fused path ran, once per micro-batch


def _compare_updates(path, device, *overrides):
    from test_gradient_checkpointing import _scored, _update_grads
    from test_shared_prefix import _groups
    from mmrl.vlm.policy import VLMPolicy

    results, batch = {}, None
    for use in (False, True):
        policy = VLMPolicy(make_config(f"model.path={path}", f"train.device={device}", "rollout.temperature=0.7",
                                       "vlm.freeze_vision=false", f"train.use_liger_loss={str(use).lower()}",
                                       "algo.epsilon_high=0.28", *overrides))
        if batch is None:
            batch = _scored(policy, _groups(policy))
        results[use] = _update_grads(policy, batch, cfg=ObjectiveConfig.from_algo(policy.cfg.algo))
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5, abs=1e-7)
    assert results[True][1].keys() == results[False][1].keys()
    for name, g in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.gpu
def test_the_policys_update_on_cuda_equals_the_lean_path(random_tiny_dir):
    """Through the policy on CUDA, Liger compiled as configured (float32, the tiny Qwen2.5-VL): one
    update's loss and every gradient as the lean path's."""
    _compare_updates(random_tiny_dir, "cuda")
