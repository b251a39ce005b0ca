"""Z-Image (``ZImageAdapter``) against a tiny random ``ZImagePipeline`` built locally (tests/z_image_builders.py):
mmrl's Euler loop equals the pipeline's ``__call__`` (its guidance options and a dynamic-shift schedule
included); a sampled trajectory's SDE log-probs re-scored equal; a LoRA step through ``mmrl train diffusion``;
a checkpoint round trip."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from generator_checks import assert_rescored, euler, policy_for, train_rollout
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.adapters import load_pipeline
from mmrl.diffusion.adapters.z_image import ZImageAdapter
from mmrl.runs.checkpoint import CheckpointManager
from test_diffusion_runs import cli, prompt_file, rows, t2i_overrides  # noqa: F401  (prompt_file: a fixture)
from z_image_builders import z_image_dir  # noqa: F401  (a fixture)

PROMPTS = ["a red cat", "two dogs on grass"]
SIZE = 32  # pixels: latents (16, 16, 16), 64 tokens of 2x2 patches


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipeline runs on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def z_image(z_image_dir):
    return load_pipeline(str(z_image_dir), "cpu", torch.float32)


def _noise(adapter, seed=0):
    return torch.randn(2, *adapter.latent_shape(SIZE, SIZE), generator=torch.Generator().manual_seed(seed))


def _pipeline(adapter, noise, guidance, steps=3, **options):
    """The pipeline's own ``__call__`` (its guidance_scale is mmrl's minus 1; it rewrites a prompt list it
    is given in place, so it gets a copy)."""
    return adapter.pipe(prompt=list(PROMPTS), height=SIZE, width=SIZE, num_inference_steps=steps,
                        guidance_scale=guidance - 1, latents=noise.clone(), output_type="pt", **options).images


def test_loaded_as_z_image(z_image):
    assert isinstance(z_image, ZImageAdapter) and z_image.family == "z_image" and not z_image.is_video
    assert z_image.latent_shape(SIZE, SIZE) == (16, 16, 16)
    with pytest.raises(ValueError, match="diffusion.height"):
        z_image.latent_shape(30, SIZE)  # the pipeline's own multiple-of-(VAE x patch) rule


@pytest.mark.slow
@pytest.mark.parametrize("guidance,options", [
    (1.0, {}),  # mmrl's 1 = the pipeline's 0: no CFG (Z-Image-Turbo)
    (3.0, {}),  # CFG: the pipeline's cond + 2 (cond - uncond)
    (3.0, {"cfg_normalization": 1.0}),  # the guided norm capped at the conditional one's
    (3.0, {"cfg_truncation": 0.3}),  # no guidance where (1000 - t) / 1000 > 0.3 (the last of the 3 steps)
])
def test_euler_loop_equals_the_pipeline(z_image, guidance, options):
    noise = _noise(z_image)
    adapter = ZImageAdapter(z_image.pipe, **options)
    ref = _pipeline(z_image, noise, guidance, **options)
    image, sigmas = euler(adapter, noise, PROMPTS, guidance)
    assert torch.allclose(sigmas, z_image.pipe.scheduler.sigmas.float())
    assert image.shape == (2, 3, SIZE, SIZE) and image.dtype == torch.float32
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    if options:  # the option changes the image: the equality above is not the plain CFG's
        assert (ref - _pipeline(z_image, noise, guidance)).abs().max() > 1e-3


def test_dynamic_shift_schedule_equals_the_pipeline(z_image_dir):
    """A scheduler with ``use_dynamic_shifting``: the shift is ``mu`` of the token count, as the pipeline's."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    adapter = load_pipeline(str(z_image_dir), "cpu", torch.float32)
    adapter.pipe.scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_image_seq_len=16,
                                                             max_image_seq_len=256, base_shift=0.5, max_shift=1.15)
    noise = _noise(adapter)
    ref = _pipeline(adapter, noise, 2.0)
    image, sigmas = euler(adapter, noise, PROMPTS, 2.0)
    assert torch.allclose(sigmas, adapter.pipe.scheduler.sigmas.float())
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()


def test_prompts_are_variable_length_and_cached(z_image_dir):
    adapter = load_pipeline(str(z_image_dir), "cpu", torch.float32)
    expected, _ = adapter.pipe.encode_prompt(list(PROMPTS), device="cpu", do_classifier_free_guidance=False)
    captions = adapter.captions(PROMPTS)
    assert [c.shape[0] for c in captions] == [e.shape[0] for e in expected] and len({c.shape[0] for c in captions}) == 2
    assert all(torch.equal(c, e) for c, e in zip(captions, expected))
    noise = _noise(adapter)
    with torch.no_grad():
        adapter.velocity(noise, torch.tensor([0.9, 0.4]), PROMPTS, 3.0)
        adapter.velocity(noise, torch.tensor([0.5, 0.5]), PROMPTS, 3.0)
    assert adapter.prompt_cache.misses == 3  # the two prompts and the empty one, each encoded once


def test_each_sample_is_guided_at_its_own_noise_level(z_image_dir):
    """Per-sample sigmas: a batch where one sample is past ``cfg_truncation`` and one is not gives each the
    velocity it gets alone (the guided and unguided samples share one transformer call)."""
    adapter = ZImageAdapter(load_pipeline(str(z_image_dir), "cpu", torch.float32).pipe, cfg_truncation=0.3,
                            cfg_normalization=1.2)
    noise, sigma = _noise(adapter), torch.tensor([0.9, 0.4])  # time 1 - sigma: 0.1 guided, 0.6 not
    assert adapter.guidance_scales(sigma, 3.0).tolist() == [2.0, 0.0]
    with torch.no_grad():
        both = adapter.velocity(noise, sigma, PROMPTS, 3.0)
        alone = torch.cat([adapter.velocity(noise[i:i + 1], sigma[i:i + 1], PROMPTS[i:i + 1], 3.0) for i in range(2)])
    assert torch.allclose(both, alone, atol=1e-5), (both - alone).abs().max()


def test_bfloat16_velocity_and_decode_are_float32(z_image_dir):
    adapter = load_pipeline(str(z_image_dir), "cpu", "bfloat16")
    assert adapter.dtype == torch.bfloat16
    with torch.no_grad():
        v = adapter.velocity(_noise(adapter), torch.tensor([0.9, 0.4]), PROMPTS, 3.0)
        image = adapter.decode(_noise(adapter))
    assert v.dtype == image.dtype == torch.float32 and torch.isfinite(v).all() and torch.isfinite(image).all()


def _policy(path, *overrides):
    return policy_for(path, "diffusion.eval_num_steps=3", f"diffusion.height={SIZE}", f"diffusion.width={SIZE}",
                      "diffusion.guidance_scale=3.0", *overrides)


@pytest.mark.slow
def test_rescored_log_probs_equal_the_sampling_ones(z_image_dir):
    policy = _policy(z_image_dir)
    batch = train_rollout(policy, PROMPTS)
    assert batch.old_logps.shape == (4, 3)
    assert_rescored(policy, batch, steps=3)  # each step re-scored from the stored latents


@pytest.mark.slow
def test_lora_step_through_the_cli(z_image_dir, prompt_file, tmp_path):  # noqa: F811
    cli("train", "diffusion", *t2i_overrides(z_image_dir, prompt_file, tmp_path, "z_image", 1,
                                             "model.lora.enabled=true", "model.lora.r=4",
                                             "diffusion.guidance_scale=2.0", "train.gradient_checkpointing=true"))
    run = tmp_path / "z_image"
    step = [r for r in rows(run) if "reward" in r][0]
    assert step["step"] == 1 and step["grad_norm"] > 0 and step["reward/brightness/unparsable_frac"] == 0.0
    ckpt = CheckpointManager(run / "checkpoints").latest() / "policy"
    adapters = load_file(str(ckpt / "adapter_model.safetensors"))
    lora_b = [v for k, v in adapters.items() if "lora_B" in k]
    assert lora_b and sum(int((v != 0).sum()) for v in lora_b) > 0.5 * sum(v.numel() for v in lora_b)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip(z_image_dir, tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.r=4"] if lora else []
    policy = _policy(z_image_dir, *extra)
    batch = train_rollout(policy, PROMPTS)
    policy.train_step(batch, Objective(ObjectiveConfig()), 12.0, 4.0)
    policy.save(tmp_path / "ckpt")
    restored = _policy(z_image_dir, *extra)
    untrained = {k: v.clone() for k, v in restored.transformer.state_dict().items()}
    restored.load(tmp_path / "ckpt")
    for (name, a), b in zip(policy.transformer.state_dict().items(), restored.transformer.state_dict().values()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(v, untrained[k]) for k, v in restored.transformer.state_dict().items())  # it loaded
    noise = _noise(policy.pipe)
    with torch.no_grad():
        v = policy.pipe.velocity(noise, torch.tensor([0.8, 0.3]), PROMPTS, 3.0)
        assert torch.equal(v, restored.pipe.velocity(noise, torch.tensor([0.8, 0.3]), PROMPTS, 3.0))
