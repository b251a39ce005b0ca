"""A loss plugin (``register_loss``) gets from the generator policy what a built-in gets: the policy
computes what a loss declares it requires (``logps``, ``flow_matching_logps``, ``nft_errors``) and
the objective adds the KL, whatever the loss's name."""

from __future__ import annotations

import pytest
import torch

from mmrl.core.losses import Objective, ObjectiveConfig, Surrogate
from mmrl.core.losses.surrogates import clip_loss
from mmrl.registry import register_loss
from test_diffusion_policy import Spy, generator_dir, policy_for, rollout  # noqa: F401 (generator_dir: a fixture)


def _clip_on_sde_steps(logps, old_logps, advantages, mask, cfg) -> Surrogate:
    return clip_loss(logps, old_logps, advantages, mask, cfg)


def _clip_on_flow_matching(logps, old_logps, advantages, mask, cfg) -> Surrogate:
    return clip_loss(logps, old_logps, advantages, mask, cfg)


def _clip_on_both(logps, old_logps, advantages, mask, cfg) -> Surrogate:
    return clip_loss(logps, old_logps, advantages, mask, cfg)


def _nft_errors_only(logps, old_logps, advantages, mask, cfg, *, positive, negative, adv_max) -> Surrogate:
    return Surrogate(positive - negative)


@pytest.fixture(scope="module", autouse=True)
def plugins():
    # one function per name: register_loss marks the function itself with its name and requires
    register_loss("test_plugin_sde")(_clip_on_sde_steps)
    register_loss("test_plugin_fm", requires=("flow_matching_logps",))(_clip_on_flow_matching)
    register_loss("test_plugin_nft", requires=("nft_errors",))(_nft_errors_only)
    register_loss("test_plugin_both", requires=("logps", "flow_matching_logps"))(_clip_on_both)


def _step(path, loss_type, *extra):
    policy = policy_for(path, f"algo.loss_type={loss_type}", *extra)
    spy = Spy(policy)
    metrics = policy.train_step(rollout(policy), spy, num_tokens=24.0, num_seqs=6.0)
    return spy.calls, metrics


@pytest.mark.slow
def test_a_plugin_on_flow_matching_logps_gets_what_awm_gets(generator_dir):
    awm, awm_metrics = _step(generator_dir, "awm")
    plugin, plugin_metrics = _step(generator_dir, "test_plugin_fm")
    assert len(plugin) == len(awm) == 4
    for (logps, old, _), (logps_awm, old_awm, _) in zip(plugin, awm):
        assert torch.equal(logps, logps_awm) and torch.equal(old, old_awm)
    assert plugin_metrics == pytest.approx(awm_metrics)


@pytest.mark.slow
def test_a_plugin_on_nft_errors_gets_the_velocity_errors(generator_dir):
    calls, _ = _step(generator_dir, "test_plugin_nft")
    assert calls and all(logps is None and set(inputs) == {"positive", "negative", "adv_max"}
                         for logps, _, inputs in calls)


@pytest.mark.slow
def test_a_plugin_on_step_log_probs_gets_the_closed_form_kl(generator_dir):
    extra = ("model.lora.enabled=true", "model.lora.r=4", "algo.beta=0.1")
    _, clip_metrics = _step(generator_dir, "clip", *extra)
    _, plugin_metrics = _step(generator_dir, "test_plugin_sde", *extra)
    assert plugin_metrics["kl"] == 0.0  # LoRA B starts at zero: policy == reference
    assert plugin_metrics == pytest.approx(clip_metrics)


def test_a_loss_on_two_log_likelihoods_is_refused(generator_dir):
    with pytest.raises(ValueError, match="requires logps and flow_matching_logps"):
        policy_for(generator_dir, "algo.loss_type=test_plugin_both")


def test_the_objective_tells_a_generator_to_skip_the_reference_at_beta_zero(generator_dir):
    """The policy reads ``needs_reference`` of the objective it is given (a KL schedule may set
    beta to 0 for a step): no ``gaussians`` then, and no KL metric."""
    policy = policy_for(generator_dir, "model.lora.enabled=true", "model.lora.r=4", "algo.beta=0.1")
    metrics = policy.train_step(rollout(policy), Objective(ObjectiveConfig(beta=0.0)), 24.0, 6.0)
    assert "kl" not in metrics
