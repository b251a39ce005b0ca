"""Wan 2.2 A14B's two noise-level experts (``WanAdapter`` + ``WanExperts``) against a tiny random two-expert
``WanPipeline`` built locally (tests/wan22_builders.py): mmrl's Euler loop equals the pipeline's ``__call__`` with
both experts running (and ``guidance_scale_2``); a mixed batch goes sample by sample to its expert; SDE
log-probs re-scored equal; an SDE window across the switch trains both experts' LoRA, one before it only the
high-noise expert's; a LoRA step through ``mmrl train diffusion``; checkpoint round trips; the export is a
two-expert pipeline directory diffusers loads."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from generator_checks import assert_rescored, policy_for, train_rollout
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.adapters import WanAdapter, load_pipeline
from mmrl.diffusion.adapters.wan_experts import WanExperts
from mmrl.diffusion.loading import export_generator
from mmrl.runs.checkpoint import CheckpointManager
from test_diffusion_runs import cli, prompt_file, rows, t2i_overrides  # noqa: F401  (prompt_file: a fixture)
from wan22_builders import BOUNDARY_RATIO, wan22_dir  # noqa: F401  (wan22_dir: a fixture)

PROMPTS = ["a red cat", "two dogs on grass"]
FRAMES = 9  # 16x16 pixels, 9 frames -> latents (16, 3, 2, 2)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipeline runs on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def wan22(wan22_dir):
    return load_pipeline(str(wan22_dir), "cpu", torch.float32)


def _noise(adapter, seed=0):
    return torch.randn(2, *adapter.latent_shape(16, 16, FRAMES), generator=torch.Generator().manual_seed(seed))


def _lora(module, expert: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" in n and n.startswith(expert + ".")}


def test_loaded_with_both_experts(wan22):
    assert isinstance(wan22, WanAdapter) and isinstance(wan22.transformer, WanExperts)
    experts = wan22.transformer
    assert experts.transformer is wan22.pipe.transformer and experts.transformer_2 is wan22.pipe.transformer_2
    assert wan22.boundary_timestep == experts.boundary_timestep == BOUNDARY_RATIO * 1000
    # the contract the policy relies on: every trained parameter is one of the two experts'
    names = {n.split(".")[0] for n, _ in experts.named_parameters()}
    assert names == {"transformer", "transformer_2"}


@pytest.mark.slow
@pytest.mark.parametrize("steps,guidance,guidance_2", [(3, 4.0, None), (4, 4.0, 3.0), (4, 1.0, None)])
def test_euler_loop_equals_the_pipeline(wan22, steps, guidance, guidance_2):
    """Step 0 (t = 1000) is the high-noise expert's, the rest (t < 875) the low-noise one's."""
    noise = _noise(wan22)
    adapter = WanAdapter(wan22.pipe, guidance_scale_2=guidance_2)
    ref = adapter.pipe(prompt=list(PROMPTS), negative_prompt="", height=16, width=16, num_frames=FRAMES,
                       num_inference_steps=steps, guidance_scale=guidance, guidance_scale_2=guidance_2,
                       latents=noise.clone(), output_type="pt").frames
    sigmas = adapter.sigmas(steps, tuple(noise.shape[1:]))
    assert torch.allclose(sigmas, adapter.pipe.scheduler.sigmas.float())
    high = (sigmas[:-1] * 1000 >= adapter.boundary_timestep).tolist()
    assert high[0] and not any(high[1:])  # both experts run

    def loop(velocity):
        x = noise.clone()
        with torch.no_grad():
            for i in range(steps):
                x = x + (sigmas[i + 1] - sigmas[i]) * velocity(x, sigmas[i].expand(2), PROMPTS, guidance)
            return adapter.decode(x)

    video = loop(adapter.velocity)
    assert video.shape == (2, FRAMES, 3, 16, 16)
    assert torch.allclose(video, ref, atol=1e-4, rtol=0), (video - ref).abs().max()
    # the equality needs the switch: the high-noise expert alone gives another clip
    adapter.transformer = adapter.pipe.transformer
    assert (loop(adapter.velocity) - ref).abs().max() > 1e-3


def test_a_mixed_batch_goes_to_each_samples_expert(wan22):
    experts = wan22.transformer
    x = _noise(wan22)
    text = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    timestep = torch.tensor([900.0, 500.0])  # one on each side of the boundary (875)
    with torch.no_grad():
        both = experts(hidden_states=x, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
        high = experts.transformer(hidden_states=x[:1], timestep=timestep[:1], encoder_hidden_states=text[:1],
                                   return_dict=False)[0]
        low = experts.transformer_2(hidden_states=x[1:], timestep=timestep[1:], encoder_hidden_states=text[1:],
                                    return_dict=False)[0]
    assert torch.allclose(both, torch.cat([high, low]), atol=1e-6)


def test_module_calls_reach_both_experts(wan22_dir):
    """What the policy calls on its trained module besides LoRA: gradient checkpointing for both experts, and
    ``from_config`` + ``load_state_dict`` (how a sharded run's gathered weights are written) rebuilding the pair."""
    experts = load_pipeline(str(wan22_dir), "cpu", torch.float32).transformer
    experts.enable_gradient_checkpointing()
    assert experts.transformer.is_gradient_checkpointing and experts.transformer_2.is_gradient_checkpointing
    copy = WanExperts.from_config(experts.config)
    copy.load_state_dict(experts.state_dict())
    assert copy.boundary_timestep == experts.boundary_timestep
    assert [type(e) for e in copy.experts] == [type(e) for e in experts.experts]
    x, text = _noise(load_pipeline(str(wan22_dir), "cpu", torch.float32)), torch.randn(2, 8, 32)
    timestep = torch.tensor([900.0, 500.0])
    with torch.no_grad():  # a model built from its config differs from a loaded one in float rounding only (~2e-7)
        rebuilt = copy(hidden_states=x, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
        original = experts(hidden_states=x, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
    assert torch.allclose(rebuilt, original, atol=1e-6)


def _policy(path, *overrides, steps=4):
    return policy_for(path, f"diffusion.num_steps={steps}", f"diffusion.eval_num_steps={steps}",
                      f"diffusion.num_frames={FRAMES}", "diffusion.guidance_scale=4.0", *overrides)


@pytest.mark.slow
def test_rescored_log_probs_equal_the_sampling_ones(wan22_dir):
    policy = _policy(wan22_dir)
    policy.pipe.guidance_scale_2 = 3.0
    batch = train_rollout(policy, PROMPTS)
    assert batch.old_logps.shape == (4, 4) and torch.isfinite(batch.old_logps).all()
    assert_rescored(policy, batch, steps=4)  # steps 0 (high-noise expert) and 1-3 (low-noise expert)


@pytest.mark.slow
@pytest.mark.parametrize("window,trained", [(2, {"transformer", "transformer_2"}), (1, {"transformer"})])
def test_sde_window_trains_the_experts_it_covers(wan22_dir, window, trained):
    """A window at steps 0-1 straddles the switch (t = 1000 high, 857 low): LoRA gradients reach both
    experts. A window at step 0 alone is wholly before it: only the high-noise expert learns (Adam moves a
    parameter exactly when its gradient is non-zero)."""
    policy = _policy(wan22_dir, "model.lora.enabled=true", "model.lora.r=4", f"diffusion.sde_window_size={window}",
                        "diffusion.sde_window_range=[0,0]")
    before = {e: _lora(policy.transformer, e) for e in ("transformer", "transformer_2")}
    assert all(before.values())
    batch = train_rollout(policy, PROMPTS)
    assert batch.action_mask[:, :window].all() and not batch.action_mask[:, window:].any()
    policy.train_step(batch, Objective(ObjectiveConfig.from_algo(policy.cfg.algo)), float(batch.action_mask.sum()), 4.0)
    after = {e: _lora(policy.transformer, e) for e in before}
    moved = {e for e in before if any(not torch.equal(before[e][n], after[e][n]) for n in before[e])}
    assert moved == trained


@pytest.mark.slow
def test_disabled_adapters_are_both_base_experts(wan22_dir):
    """The KL's reference under LoRA (``algo.beta``): the trained module with its adapters disabled is the
    base pipeline on both sides of the switch."""
    base = load_pipeline(str(wan22_dir), "cpu", torch.float32)
    policy = _policy(wan22_dir, "model.lora.enabled=true", "model.lora.r=4", "algo.beta=0.01")
    policy.train_step(train_rollout(policy, PROMPTS), Objective(ObjectiveConfig.from_algo(policy.cfg.algo)), 16.0, 4.0)
    noise, sigma = _noise(base), torch.tensor([0.95, 0.5])  # one sample per expert
    with torch.no_grad():
        expected = base.velocity(noise, sigma, PROMPTS, 4.0)
        trained = policy.pipe.velocity(noise, sigma, PROMPTS, 4.0)
        with policy.adapters_disabled():
            disabled = policy.pipe.velocity(noise, sigma, PROMPTS, 4.0)
    assert torch.allclose(disabled, expected, atol=1e-6)
    assert ((trained - expected).flatten(1).abs().amax(dim=1) > 1e-6).all()  # each expert's LoRA moved


@pytest.mark.slow
def test_lora_step_through_the_cli(wan22_dir, prompt_file, tmp_path):  # noqa: F811
    """2 steps: t = 1000 (high-noise expert) and t = 3 (low-noise): both experts' adapters are trained and saved
    (with gradient checkpointing, which WanExperts switches on in both)."""
    cli("train", "diffusion", *t2i_overrides(wan22_dir, prompt_file, tmp_path, "wan22", 1, "model.lora.enabled=true",
                                             "model.lora.r=4", "train.gradient_checkpointing=true"))
    run = tmp_path / "wan22"
    step = [r for r in rows(run) if "reward" in r][0]
    assert step["step"] == 1 and step["grad_norm"] > 0 and step["reward/brightness/unparsable_frac"] == 0.0
    adapters = load_file(str(CheckpointManager(run / "checkpoints").latest() / "policy" / "adapter_model.safetensors"))
    for expert in ("transformer.", "transformer_2."):
        lora_b = [v for k, v in adapters.items() if k.startswith(expert) and "lora_B" in k]
        assert lora_b and sum(int((v != 0).sum()) for v in lora_b) > 0.5 * sum(v.numel() for v in lora_b), expert


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip(wan22_dir, tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.r=4"] if lora else []
    policy = _policy(wan22_dir, *extra)
    policy.train_step(train_rollout(policy, PROMPTS), Objective(ObjectiveConfig()), 16.0, 4.0)
    policy.save(tmp_path / "ckpt")
    if not lora:  # the pipeline's own layout: the experts in transformer/ and transformer_2/
        assert {p.name for p in (tmp_path / "ckpt").iterdir()} >= {"transformer", "transformer_2"}
    restored = _policy(wan22_dir, *extra)
    untrained = {k: v.clone() for k, v in restored.transformer.state_dict().items()}
    restored.load(tmp_path / "ckpt")
    state = restored.transformer.state_dict()
    for name, value in policy.transformer.state_dict().items():
        assert torch.equal(value, state[name]), name
    for expert in ("transformer.", "transformer_2."):  # both experts were trained, and both loaded
        assert any(not torch.equal(v, untrained[k]) for k, v in state.items() if k.startswith(expert)), expert
    noise, sigma = _noise(policy.pipe), torch.tensor([0.95, 0.5])  # one sample per expert
    with torch.no_grad():
        assert torch.equal(policy.pipe.velocity(noise, sigma, PROMPTS, 4.0),
                           restored.pipe.velocity(noise, sigma, PROMPTS, 4.0))


@pytest.mark.slow
def test_export_is_a_two_expert_pipeline(wan22_dir, tmp_path):
    """``mmrl export``'s writer: LoRA fused into both experts, which land in transformer/ and transformer_2/
    of a directory diffusers' WanPipeline loads."""
    from diffusers import WanPipeline

    policy = _policy(wan22_dir, "model.lora.enabled=true", "model.lora.r=4", steps=2)
    policy.train_step(train_rollout(policy, PROMPTS), Objective(ObjectiveConfig()), 8.0, 4.0)
    export_generator(policy, tmp_path / "out")
    exported = WanPipeline.from_pretrained(tmp_path / "out")
    base = WanPipeline.from_pretrained(wan22_dir)
    for name in ("transformer", "transformer_2"):
        trained = getattr(policy.transformer, name).state_dict()
        saved, original = getattr(exported, name).state_dict(), getattr(base, name).state_dict()
        assert saved.keys() == original.keys() and all(torch.equal(v, trained[k]) for k, v in saved.items()), name
        assert any(not torch.equal(v, original[k]) for k, v in saved.items()), name  # the fused LoRA
    assert exported.config.boundary_ratio == BOUNDARY_RATIO
