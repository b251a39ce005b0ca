"""DiffusionPolicy on a randomly initialised tiny generator: the checks flow_grpo users ask for
(ratio exactly 1 at equal parameters, shared noise, seeding), step plans, objectives, checkpoints."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from generator_checks import Spy, assert_rescored
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.policy import DiffusionPolicy
from mmrl.diffusion.tiny import new_tiny_models, save_tiny

PROMPTS = ["a red circle", "two blue squares on the left"]
EXAMPLES = [{"prompt": p, "_index": i} for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def generator_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-generator")
    return save_tiny(path, *new_tiny_models(seed=0, width=32, layers=1))


def policy_for(path, *overrides) -> DiffusionPolicy:
    cfg = make_config(f"model.path={path}", "train.device=cpu", "task.name=composition", "diffusion.num_steps=4",
                      "diffusion.eval_num_steps=5", "rollout.batch_size=64", "train.learning_rate=1e-3", *overrides)
    policy = DiffusionPolicy(cfg)
    policy.configure_optimizer(cfg.train, 10)
    policy.begin_step(1)
    return policy


def rollout(policy, n=3, old=True):
    batch = policy.rollout(EXAMPLES, PROMPTS, n, "train", need_old_logps=old, need_ref_logps=False)
    batch.advantages = torch.linspace(-1, 1, len(batch))
    return batch


def test_recomputed_log_probs_equal_the_sampling_ones(generator_dir):
    """Importance ratio exactly 1 (to float error) when old and new parameters coincide."""
    policy = policy_for(generator_dir)
    batch = rollout(policy)
    assert batch.old_logps.shape == (6, 4) and torch.isfinite(batch.old_logps).all()
    assert_rescored(policy, batch, steps=4)


def test_shared_noise_groups_differ_only_through_sde_noise(generator_dir):
    shared = rollout(policy_for(generator_dir, "diffusion.shared_noise=true"))
    x0 = shared.payload["latents"][:, 0]
    assert torch.equal(x0[0], x0[1]) and torch.equal(x0[0], x0[2]) and not torch.equal(x0[0], x0[3])
    assert not torch.equal(shared.payload["latents"][0, -1], shared.payload["latents"][1, -1])
    ode = rollout(policy_for(generator_dir, "diffusion.shared_noise=true", "diffusion.noise_level=0.0"))
    final = ode.payload["latents"][:, -1]
    assert torch.allclose(final[0], final[1]) and torch.allclose(final[0], final[2])
    independent = rollout(policy_for(generator_dir))
    assert not torch.equal(independent.payload["latents"][0, 0], independent.payload["latents"][1, 0])


@pytest.mark.slow
def test_noise_is_seeded_by_sample_identity_not_batch_position(generator_dir):
    a = rollout(policy_for(generator_dir, "rollout.batch_size=64"))
    b = rollout(policy_for(generator_dir, "rollout.batch_size=2"))
    assert torch.allclose(a.payload["latents"], b.payload["latents"], atol=1e-5)
    # A worker that gets only the second prompt draws exactly that prompt's noise.
    policy = policy_for(generator_dir)
    alone = policy.rollout(EXAMPLES[1:], PROMPTS[1:], 3, "train", need_old_logps=False, need_ref_logps=False)
    assert torch.allclose(alone.payload["latents"][:, 0], a.payload["latents"][3:, 0])
    other_step = policy_for(generator_dir)
    other_step.begin_step(2)
    c = other_step.rollout(EXAMPLES, PROMPTS, 3, "train", need_old_logps=False, need_ref_logps=False)
    assert not torch.allclose(c.payload["latents"][:, 0], a.payload["latents"][:, 0])


def test_sde_window_trains_only_its_steps_and_is_ode_elsewhere(generator_dir):
    policy = policy_for(generator_dir, "diffusion.sde_window_size=2", "diffusion.sde_window_range=[1,2]")
    batch = rollout(policy)
    mask = batch.action_mask
    start = int(mask[0].nonzero()[0])
    assert start in (1, 2) and mask.sum(1).tolist() == [2.0] * 6
    assert (mask == mask[0]).all()  # one window for the whole batch
    outside = [t for t in range(4) if mask[0, t] == 0]
    assert (batch.old_logps[:, outside] == 0).all() and (batch.old_logps[:, mask[0] > 0] != 0).all()
    sliding = policy_for(generator_dir, "diffusion.sde_window_size=2", "diffusion.sde_window_mode=sliding",
                         "diffusion.sde_window_shift_every=1")
    starts = []
    for step in (1, 2, 3, 4):
        sliding.begin_step(step)
        starts.append(int(rollout(sliding).action_mask[0].nonzero()[0]))
    assert starts == [0, 1, 2, 0]


def test_timestep_fraction_and_prefix(generator_dir):
    batch = rollout(policy_for(generator_dir, "diffusion.timestep_fraction=0.5"))
    assert batch.action_mask.sum(1).tolist() == [2.0] * 6
    assert len({tuple(row.tolist()) for row in batch.action_mask}) > 1  # a random subset per sample
    prefix = rollout(policy_for(generator_dir, "diffusion.train_steps_prefix=3"))
    assert prefix.action_mask.tolist() == [[1.0, 1.0, 1.0, 0.0]] * 6


def test_eval_rollouts_are_deterministic_ode_with_more_steps(generator_dir):
    policy = policy_for(generator_dir)

    eval_cfg = "eval"
    a = policy.rollout(EXAMPLES, PROMPTS, 2, eval_cfg, need_old_logps=False, need_ref_logps=False)
    policy.begin_step(7)
    b = policy.rollout(EXAMPLES, PROMPTS, 2, eval_cfg, need_old_logps=False, need_ref_logps=False)
    assert a.action_mask.shape == (4, 5) and a.action_mask.sum() == 0
    assert [list(im.getdata()) for im in a.completions] == [list(im.getdata()) for im in b.completions]


@pytest.mark.parametrize("loss_type", ["clip", "awm", "nft"])
def test_each_objective_updates_the_transformer(generator_dir, loss_type):
    policy = policy_for(generator_dir, f"algo.loss_type={loss_type}")
    before = [p.detach().clone() for p in policy.transformer.parameters()]
    batch = rollout(policy)
    spy = Spy(policy)
    metrics = policy.train_step(batch, spy, num_tokens=float(batch.action_mask.sum()), num_seqs=6.0)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.transformer.parameters()))
    if loss_type == "awm":  # AWM's flow-matching log-likelihood: ratio 1 at equal parameters too
        for logps, old, _ in spy.calls:
            assert torch.allclose(logps, old, atol=1e-5)
    if loss_type == "nft":  # likelihood-free, through the same objective: velocity errors, no log-probs
        assert spy.calls and all(logps is None and set(inputs) == {"positive", "negative", "adv_max"}
                                 for logps, _, inputs in spy.calls)
        assert metrics["pg_loss"] > 0


def test_kl_to_the_lora_disabled_reference_starts_at_zero_then_grows(generator_dir):
    policy = policy_for(generator_dir, "model.lora.enabled=true", "model.lora.r=4", "algo.beta=0.1",
                        "train.learning_rate=5e-2")
    trainable = [n for n, p in policy.transformer.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    objective = Objective(ObjectiveConfig.from_algo(policy.cfg.algo))
    first = policy.train_step(rollout(policy), objective, num_tokens=24.0, num_seqs=6.0)
    assert first["kl"] == 0.0  # LoRA B starts at zero: policy == reference
    second = policy.train_step(rollout(policy), objective, num_tokens=24.0, num_seqs=6.0)
    assert second["kl"] > 0


def test_grpo_guard_ratio_is_one_at_equal_parameters(generator_dir):
    policy = policy_for(generator_dir, "diffusion.grpo_guard=true")
    batch = rollout(policy)
    batch.old_logps = None  # one iteration: old = current
    metrics = policy.train_step(batch, Objective(ObjectiveConfig.from_algo(policy.cfg.algo)), 24.0, 6.0)
    assert abs(metrics["ratio_mean"] - 1.0) < 1e-6


@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip(generator_dir, tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.r=4"] if lora else []
    policy = policy_for(generator_dir, *extra)
    policy.train_step(rollout(policy), Objective(ObjectiveConfig()), 24.0, 6.0)
    policy.save(tmp_path / "ckpt")
    restored = policy_for(generator_dir, *extra)
    restored.load(tmp_path / "ckpt")
    for (name, a), b in zip(policy.transformer.state_dict().items(), restored.transformer.state_dict().values()):
        assert torch.equal(a, b), name
    assert restored.optimizer.state_dict()["state"]


def test_config_errors_name_the_key(generator_dir):
    with pytest.raises(ValueError, match="diffusion.sampler"):
        policy_for(generator_dir, "diffusion.sampler=euler")
    with pytest.raises(ValueError, match="algo.loss_type"):
        policy_for(generator_dir, "algo.loss_type=gspo")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        policy_for(generator_dir, "algo.loss_agg_mode=seq_mean_token_mean")
    with pytest.raises(FileNotFoundError):
        policy_for("/nonexistent/generator")
