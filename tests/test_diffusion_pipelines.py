"""The diffusers adapters (SD3, FLUX, Wan) against tiny locally built pipelines: our own Euler loop over
``sigmas``/``velocity``/``decode`` reproduces the diffusers pipeline's ``__call__`` output; prompt caching,
classifier-free guidance, gradients and LoRA; ``load_pipeline`` errors."""

from __future__ import annotations

import json

import pytest
import torch

from generator_checks import euler, latent_noise
from mmrl.diffusion.base import FlowPipeline
from mmrl.diffusion.adapters import FluxAdapter, SD3Adapter, WanAdapter, load_pipeline
from mmrl.registry import GENERATOR_FAMILIES

PROMPTS = ["a red cat", "two dogs on grass"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipelines run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def sd3(sd3_dir):
    return load_pipeline(str(sd3_dir), "cpu", torch.float32)


@pytest.fixture(scope="module")
def flux(flux_dir):
    return load_pipeline(str(flux_dir), "cpu", torch.float32)


@pytest.fixture(scope="module")
def schnell(schnell_dir):
    return load_pipeline(str(schnell_dir), "cpu", torch.float32)


@pytest.fixture(scope="module")
def wan(wan_dir):
    return load_pipeline(str(wan_dir), "cpu", torch.float32)


def _gen():
    return torch.Generator().manual_seed(0)


# -- load_pipeline -------------------------------------------------------------------------------


def test_load_pipeline_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="local diffusers pipeline directory.*nothing is downloaded"):
        load_pipeline(str(tmp_path / "missing"), "cpu", torch.float32)
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        load_pipeline(str(tmp_path), "cpu", torch.float32)  # exists, but is no pipeline
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(ValueError, match="StableDiffusionPipeline") as err:
        load_pipeline(str(tmp_path), "cpu", torch.float32)
    for supported in ("StableDiffusion3Pipeline", "FluxPipeline", "WanPipeline"):
        assert supported in str(err.value)


def test_adapters_registry_is_the_hook(tmp_path, monkeypatch):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "MyPipeline"}))
    seen = []

    def loader(path, device, dtype):
        seen.append((path, device, dtype))
        return FlowPipeline()

    monkeypatch.setitem(GENERATOR_FAMILIES._items, "MyPipeline", loader)  # registered for this test only
    assert isinstance(load_pipeline(str(tmp_path), "cpu", "bfloat16"), FlowPipeline)
    assert seen == [(str(tmp_path), "cpu", torch.bfloat16)]


# -- structure -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_adapter_attributes(sd3, flux, schnell, wan):
    assert isinstance(sd3, SD3Adapter) and sd3.family == "sd3" and not sd3.is_video
    assert sd3.latent_shape(16, 24) == (4, 8, 12)  # VAE scale factor 2, 4 latent channels
    assert sd3.default_guidance_scale == 4.5 and sd3.default_height == sd3.default_width == 16  # sample 8 * 2
    assert isinstance(flux, FluxAdapter) and flux.family == "flux"
    assert flux.latent_shape(16, 24) == (1, 8, 12)  # unpacked: in_channels 4 // 4 = 1 channel
    assert flux.latent_shape(18, 30) == (1, 8, 14)  # rounded down to whole 2x2 patches
    assert flux.default_guidance_scale == 3.5 and schnell.default_guidance_scale == 1.0
    assert isinstance(wan, WanAdapter) and wan.family == "wan" and wan.is_video
    assert wan.latent_shape(16, 32, num_frames=9) == (16, 3, 2, 4)  # (9 - 1) // 4 + 1 latent frames
    assert wan.default_guidance_scale == 5.0
    for adapter in (sd3, flux, wan):
        assert adapter.dtype == torch.float32 and adapter.device.type == "cpu"
        components = adapter.pipe.components.items()
        frozen = [m for name, m in components if isinstance(m, torch.nn.Module) and name != "transformer"]
        assert frozen and all(not p.requires_grad for m in frozen for p in m.parameters())
        assert all(not m.training for m in frozen)
        assert adapter.trainable_parameters() == list(adapter.transformer.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd3", "flux", "schnell", "wan"])
def test_sigmas(name, request):
    adapter = request.getfixturevalue(name)
    shape = adapter.latent_shape(16, 16, 9) if adapter.is_video else adapter.latent_shape(16, 16)
    sigmas = adapter.sigmas(4, shape)
    assert sigmas.dtype == torch.float32 and sigmas.device.type == "cpu" and sigmas.shape == (5,)
    assert sigmas[0] == pytest.approx(1.0, abs=1e-3) and sigmas[-1] == 0.0
    assert (sigmas[1:] < sigmas[:-1]).all()
    assert torch.equal(adapter.sigmas(4, shape), sigmas)  # the pipeline's scheduler is not stepped
    if name == "flux":  # dynamic shifting: a longer image sequence shifts the schedule towards noise
        assert (flux_big := adapter.sigmas(4, adapter.latent_shape(64, 64)))[1] > sigmas[1], flux_big


def test_flux_pack_unpack_roundtrip(flux):
    x = latent_noise(flux.latent_shape(16, 24))
    packed = flux.pack(x)
    assert packed.shape == (2, 4 * 6, 4)
    assert torch.equal(flux.unpack(packed, 8, 12), x)


# -- parity with the diffusers pipelines ---------------------------------------------------------


def test_sd3_matches_pipeline(sd3):
    noise = latent_noise(sd3.latent_shape(16, 16))
    ref = sd3.pipe(prompt=PROMPTS, height=16, width=16, num_inference_steps=3, guidance_scale=2.0,
                   latents=noise.clone(), generator=_gen(), output_type="pt").images
    image, sigmas = euler(sd3, noise, PROMPTS, 2.0)
    assert torch.allclose(sigmas, sd3.pipe.scheduler.sigmas.float())
    assert image.shape == (2, 3, 16, 16) and image.dtype == torch.float32
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    unguided, _ = euler(sd3, noise, PROMPTS, 1.0)
    assert (unguided - ref).abs().max() > 1e-3  # the guidance mattered: CFG was really exercised


def test_sd3_dynamic_shifting_matches_pipeline(sd3):
    from diffusers import FlowMatchEulerDiscreteScheduler

    original = sd3.pipe.scheduler
    static = sd3.sigmas(3, sd3.latent_shape(16, 16))
    sd3.pipe.scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_image_seq_len=4,
                                                         max_image_seq_len=64, base_shift=0.5, max_shift=1.5)
    try:
        noise = latent_noise(sd3.latent_shape(16, 16))
        ref = sd3.pipe(prompt=PROMPTS, height=16, width=16, num_inference_steps=3, guidance_scale=2.0,
                       latents=noise.clone(), generator=_gen(), output_type="pt").images
        image, sigmas = euler(sd3, noise, PROMPTS, 2.0)
        assert torch.allclose(sigmas, sd3.pipe.scheduler.sigmas.float())
        assert (sigmas - static).abs().max() > 1e-2  # mu from the latent size, not the static shift
        assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    finally:
        sd3.pipe.scheduler = original


def test_flux_dev_matches_pipeline(flux):
    noise = latent_noise(flux.latent_shape(16, 16))
    ref = flux.pipe(prompt=PROMPTS, height=16, width=16, num_inference_steps=3, guidance_scale=3.5,
                    latents=flux.pack(noise), generator=_gen(), output_type="pt").images
    image, sigmas = euler(flux, noise, PROMPTS, 3.5)
    assert torch.allclose(sigmas, flux.pipe.scheduler.sigmas.float())
    assert image.shape == (2, 3, 16, 16)
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    other, _ = euler(flux, noise, PROMPTS, 1.0)
    assert (other - ref).abs().max() > 1e-5  # the guidance scale reached the guidance embedding


@pytest.mark.slow
def test_flux_schnell_true_cfg_matches_pipeline(schnell):
    noise = latent_noise(schnell.latent_shape(16, 16))
    ref = schnell.pipe(prompt=PROMPTS, negative_prompt=["", ""], true_cfg_scale=2.0, height=16, width=16,
                       num_inference_steps=3, latents=schnell.pack(noise), generator=_gen(), output_type="pt").images
    image, _ = euler(schnell, noise, PROMPTS, 2.0)
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    unguided, _ = euler(schnell, noise, PROMPTS, 1.0)
    assert (unguided - ref).abs().max() > 1e-5


@pytest.mark.slow
def test_wan_matches_pipeline(wan):
    noise = latent_noise(wan.latent_shape(16, 16, num_frames=9))
    assert noise.shape == (2, 16, 3, 2, 2)
    ref = wan.pipe(prompt=PROMPTS, negative_prompt="", height=16, width=16, num_frames=9, num_inference_steps=3,
                   guidance_scale=2.0, latents=noise.clone(), generator=_gen(), output_type="pt").frames
    video, sigmas = euler(wan, noise, PROMPTS, 2.0)
    assert torch.allclose(sigmas, wan.pipe.scheduler.sigmas.float())
    assert video.shape == (2, 9, 3, 16, 16) and video.dtype == torch.float32
    assert torch.isfinite(video).all() and video.min() >= 0 and video.max() <= 1
    assert torch.allclose(video, ref, atol=1e-4, rtol=0), (video - ref).abs().max()


# -- guidance, prompt cache, gradients, LoRA -----------------------------------------------------


@pytest.mark.parametrize("name", ["sd3", "schnell", "wan"])
def test_cfg_is_uncond_plus_scaled_difference(name, request):
    adapter = request.getfixturevalue(name)
    shape = adapter.latent_shape(16, 16, 9) if adapter.is_video else adapter.latent_shape(16, 16)
    x, sigma = latent_noise(shape), torch.tensor([0.9, 0.4])
    with torch.no_grad():
        cond = adapter.velocity(x, sigma, PROMPTS, 1.0)
        uncond = adapter.velocity(x, sigma, ["", ""], 1.0)
        guided = adapter.velocity(x, sigma, PROMPTS, 3.0)
    assert guided.shape == x.shape and guided.dtype == torch.float32 and torch.isfinite(guided).all()
    assert torch.allclose(guided, uncond + 3.0 * (cond - uncond), atol=1e-5)
    assert (cond - uncond).abs().max() > 1e-6


def test_flux_dev_guidance_is_embedded_not_batched(flux):
    batches = []
    hook = flux.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["hidden_states"].shape[0]), with_kwargs=True
    )
    try:
        x = latent_noise(flux.latent_shape(16, 16))
        with torch.no_grad():
            a = flux.velocity(x, torch.tensor([0.5, 0.5]), PROMPTS, 1.0)
            b = flux.velocity(x, torch.tensor([0.5, 0.5]), PROMPTS, 4.0)
    finally:
        hook.remove()
    assert batches == [2, 2]  # no unconditional half
    assert a.shape == x.shape and (a - b).abs().max() > 1e-6


def test_prompt_cache_encodes_each_prompt_once(sd3, monkeypatch):
    calls = []
    encode = sd3.pipe.encode_prompt

    def counting(*args, **kwargs):
        calls.append(list(kwargs["prompt"]))
        return encode(*args, **kwargs)

    monkeypatch.setattr(sd3.pipe, "encode_prompt", counting)
    sd3.prompt_cache.clear()
    assert sd3.prompt_cache.hits == sd3.prompt_cache.misses == 0  # the counters describe what is stored
    x, sigma = latent_noise(sd3.latent_shape(16, 16)), torch.tensor([0.7, 0.3])
    with torch.no_grad():
        first = sd3.velocity(x, sigma, PROMPTS, 2.0)
        # one call per missing prompt, the negative "" included: an embedding never depends on its batch
        assert calls == [[""], [PROMPTS[0]], [PROMPTS[1]]]
        again = sd3.velocity(x, sigma, PROMPTS, 2.0)
        assert len(calls) == 3 and (sd3.prompt_cache.hits, sd3.prompt_cache.misses) == (4, 3)
        assert torch.equal(first, again)
        swapped = sd3.velocity(x.flip(0), sigma.flip(0), PROMPTS[::-1], 2.0)
        assert len(calls) == 3
    assert torch.allclose(swapped, first.flip(0), atol=1e-6)
    forward, backward = sd3.prompt_cache.get(PROMPTS), sd3.prompt_cache.get(PROMPTS[::-1])
    assert forward["prompt_embeds"].shape[0] == 2 and forward["pooled_prompt_embeds"].shape == (2, 64)
    assert torch.equal(forward["prompt_embeds"], backward["prompt_embeds"].flip(0))
    direct, _, pooled, _ = encode(prompt=PROMPTS[1], prompt_2=PROMPTS[1], prompt_3=PROMPTS[1],
                                  do_classifier_free_guidance=False, device="cpu")
    assert torch.allclose(forward["prompt_embeds"][1:], direct, atol=1e-5)
    assert torch.allclose(forward["pooled_prompt_embeds"][1:], pooled, atol=1e-5)


def test_velocity_gives_transformer_gradients(sd3):
    x, sigma = latent_noise(sd3.latent_shape(16, 16)), torch.tensor([0.8, 0.2])
    sd3.transformer.zero_grad(set_to_none=True)
    sd3.velocity(x, sigma, PROMPTS, 2.0).square().mean().backward()
    grads = [p.grad for p in sd3.transformer.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    sd3.transformer.zero_grad(set_to_none=True)


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["sd3_dir", "flux_dir", "wan_dir"])
def test_lora_only_trains_adapters_and_can_be_disabled(builder, request):
    from peft import LoraConfig, get_peft_model

    adapter = load_pipeline(str(request.getfixturevalue(builder)), "cpu", torch.float32)  # fresh: peft mutates it
    shape = adapter.latent_shape(16, 16, 9) if adapter.is_video else adapter.latent_shape(16, 16)
    x, sigma = latent_noise(shape), torch.tensor([0.8, 0.3])
    guidance = 2.0
    with torch.no_grad():
        base = adapter.velocity(x, sigma, PROMPTS, guidance)
    model = get_peft_model(adapter.transformer, LoraConfig(r=4, lora_alpha=8, target_modules=adapter.lora_targets))
    with torch.no_grad():  # LoRA starts as the identity (B = 0): perturb it so that it matters
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    adapter.transformer = model
    lora_params = {name for name, p in model.named_parameters() if p.requires_grad}
    assert lora_params and all("lora_" in name for name in lora_params)
    trainable = {id(p) for n, p in model.named_parameters() if n in lora_params}
    assert {id(p) for p in adapter.trainable_parameters()} == trainable
    out = adapter.velocity(x, sigma, PROMPTS, guidance)
    out.square().mean().backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (name in lora_params), name
    assert any(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora_A" in n)
    assert (out.detach() - base).abs().max() > 1e-4
    with torch.no_grad(), model.disable_adapter():
        disabled = adapter.velocity(x, sigma, PROMPTS, guidance)
    assert torch.allclose(disabled, base, atol=1e-6)


def test_bfloat16_velocity_and_decode_are_float32(sd3_dir):
    adapter = load_pipeline(str(sd3_dir), "cpu", "bfloat16")
    assert adapter.dtype == torch.bfloat16 and adapter.vae.dtype == torch.bfloat16
    x = latent_noise(adapter.latent_shape(16, 16))
    with torch.no_grad():
        v = adapter.velocity(x, torch.tensor([0.5, 0.5]), PROMPTS, 2.0)
        image = adapter.decode(x)
    assert v.dtype == torch.float32 and torch.isfinite(v).all()
    assert image.dtype == torch.float32 and image.shape == (2, 3, 16, 16)
