"""FLUX.2 (``Flux2Pipeline``) and FLUX.2 [klein] (``Flux2KleinPipeline``) through their adapters, on tiny
random pipelines built locally (tests/flux2_builders.py), against diffusers:

(a) mmrl's Euler loop over ``sigmas``/``velocity``/``decode`` gives the pipeline's own ``__call__`` output at
    the same latents (1e-4, float32), the schedule included (FLUX.2's empirical mu);
(b) a sampled trajectory's SDE log-probs re-scored by the training path equal the sampling ones (1e-5);
(c) a LoRA RL step through ``mmrl train diffusion``;
(d) a checkpoint round trip: equal weights and equal velocity in a fresh policy; an export (adapters merged)
    loads back as FLUX.2 with the trained velocity.
"""

from __future__ import annotations

import pytest
import torch

from flux2_builders import build_tiny_flux2, build_tiny_flux2_klein
from generator_checks import assert_rescored, euler, latent_noise, policy_for, train_rollout
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.adapters import load_pipeline
from mmrl.diffusion.adapters.flux2 import Flux2Adapter, Flux2KleinAdapter
from mmrl.registry import GENERATOR_FAMILIES
from test_diffusion_runs import cli, rows, t2i_overrides

PROMPTS = ["a red cat", "two dogs on grass"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipelines run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def flux2_dir(tmp_path_factory):
    return build_tiny_flux2(tmp_path_factory.mktemp("tiny-flux2"))


@pytest.fixture(scope="module")
def klein_dir(tmp_path_factory):
    return build_tiny_flux2_klein(tmp_path_factory.mktemp("tiny-flux2-klein"))


@pytest.fixture(scope="module")
def flux2(flux2_dir):
    return load_pipeline(str(flux2_dir), "cpu", torch.float32)


@pytest.fixture(scope="module")
def klein(klein_dir):
    return load_pipeline(str(klein_dir), "cpu", torch.float32)


def _pipeline(adapter, noise, prompts, guidance, steps=3, size=16):
    return adapter.pipe(prompt=prompts, height=size, width=size, num_inference_steps=steps, guidance_scale=guidance,
                        latents=noise.clone(), generator=torch.Generator().manual_seed(0), output_type="pt").images


# -- structure -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_registered_and_shaped(flux2, klein):
    assert GENERATOR_FAMILIES.get("Flux2Pipeline") == Flux2Adapter.from_pretrained
    assert GENERATOR_FAMILIES.get("Flux2KleinPipeline") == Flux2KleinAdapter.from_pretrained
    assert type(flux2) is Flux2Adapter and flux2.family == "flux2" and flux2.conditioning is None
    assert type(klein) is Flux2KleinAdapter and klein.family == "flux2_klein"
    # VAE scale 2 x 2x2 patches: 16 x 24 px -> (in_channels 8, 4, 6), rounded down to whole patches
    assert flux2.latent_shape(16, 24) == (8, 4, 6) and flux2.latent_shape(18, 30) == (8, 4, 7)
    assert flux2.default_guidance_scale == klein.default_guidance_scale == 4.0
    assert flux2.text_encoder_out_layers == (10, 20, 30) and klein.text_encoder_out_layers == (9, 18, 27)
    for adapter in (flux2, klein):
        frozen = [m for name, m in adapter.pipe.components.items() if isinstance(m, torch.nn.Module)
                  and name != "transformer"]
        assert frozen and all(not p.requires_grad for m in frozen for p in m.parameters())
        names = [name for name, _ in adapter.transformer.named_modules()]
        for target in adapter.lora_targets:  # every LoRA target names a layer of both stream kinds' blocks
            assert any(name.endswith("." + target) for name in names), target
        # three hidden-state layers of the width-16 encoders, stacked: 48 wide; the prompt is not cut away
        emb = adapter.prompt_cache.get(PROMPTS)["prompt_embeds"]
        assert emb.shape == (2, 512, 48) and (emb[0] - emb[1]).abs().max() > 1e-4


@pytest.mark.slow
def test_too_shallow_text_encoder_is_refused(flux2):
    with pytest.raises(ValueError, match=r"hidden states \(10, 20, 31\).*30 layers.*text_encoder"):
        Flux2Adapter(flux2.pipe, text_encoder_out_layers=(10, 20, 31))


@pytest.mark.parametrize("steps,size", [(4, 16), (7, 32)])
def test_sigmas_are_the_pipelines(flux2, steps, size):
    """FLUX.2's mu depends on the token count and the number of steps (compute_empirical_mu)."""
    noise = latent_noise(flux2.latent_shape(size, size), batch=1)
    flux2.pipe(prompt=PROMPTS[:1], height=size, width=size, num_inference_steps=steps, latents=noise.clone(),
               output_type="latent")
    sigmas = flux2.sigmas(steps, tuple(noise.shape[1:]))
    assert sigmas.shape == (steps + 1,) and sigmas[-1] == 0.0
    assert torch.allclose(sigmas, flux2.pipe.scheduler.sigmas.float(), atol=1e-7)


# -- (a) parity with the diffusers pipelines -----------------------------------------------------


@pytest.mark.slow
def test_flux2_matches_pipeline(flux2):
    noise = latent_noise(flux2.latent_shape(16, 16))
    ref = _pipeline(flux2, noise, PROMPTS, 3.0)
    image, sigmas = euler(flux2, noise, PROMPTS, 3.0)
    assert torch.allclose(sigmas, flux2.pipe.scheduler.sigmas.float())
    assert image.shape == (2, 3, 16, 16) and image.dtype == torch.float32
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    other, _ = euler(flux2, noise, PROMPTS, 1.0)
    assert (other - ref).abs().max() > 1e-4  # the scale reached the guidance embedding


def test_flux2_guidance_is_embedded_not_batched(flux2):
    batches = []
    hook = flux2.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["hidden_states"].shape[0]), with_kwargs=True)
    try:
        with torch.no_grad():
            flux2.velocity(latent_noise(flux2.latent_shape(16, 16)), torch.tensor([0.5, 0.5]), PROMPTS, 4.0)
    finally:
        hook.remove()
    assert batches == [2]


@pytest.mark.slow
def test_klein_true_cfg_matches_pipeline(klein):
    noise = latent_noise(klein.latent_shape(16, 16))
    ref = _pipeline(klein, noise, PROMPTS, 3.0)
    image, _ = euler(klein, noise, PROMPTS, 3.0)
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    unguided, _ = euler(klein, noise, PROMPTS, 1.0)
    assert (unguided - ref).abs().max() > 1e-4  # CFG with the empty prompt was really exercised
    assert torch.allclose(unguided, _pipeline(klein, noise, PROMPTS, 1.0), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_distilled_klein_ignores_guidance(klein):
    """A step-distilled klein (``is_distilled``) takes no CFG: the pipeline ignores the scale, so does mmrl."""
    from diffusers import Flux2KleinPipeline

    components = {k: v for k, v in klein.pipe.components.items()}
    distilled = Flux2KleinAdapter(Flux2KleinPipeline(**components, is_distilled=True))
    assert distilled.default_guidance_scale == 1.0 and not distilled.true_cfg
    noise = latent_noise(distilled.latent_shape(16, 16))
    ref = _pipeline(distilled, noise, PROMPTS, 3.0)
    image, _ = euler(distilled, noise, PROMPTS, 3.0)
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    assert torch.allclose(image, euler(distilled, noise, PROMPTS, 1.0)[0], atol=1e-6)


# -- (b), (d): the policy over the adapter --------------------------------------------------------


@pytest.mark.slow
def test_rescored_log_probs_equal_the_sampling_ones(flux2_dir):
    policy = policy_for(flux2_dir)
    batch = train_rollout(policy, PROMPTS)
    assert batch.payload["latents"].shape == (4, 4, 8, 4, 4)  # (samples, steps + 1, latent shape)
    assert batch.action_mask.sum() == 12 and torch.isfinite(batch.old_logps).all()
    assert_rescored(policy, batch, steps=3)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip(flux2_dir, tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.r=4"] if lora else []
    policy = policy_for(flux2_dir, *extra)
    policy.train_step(train_rollout(policy, PROMPTS), Objective(ObjectiveConfig()), 12.0, 4.0)
    policy.save(tmp_path / "ckpt")
    restored = policy_for(flux2_dir, *extra)
    restored.load(tmp_path / "ckpt")
    trained = policy.transformer.state_dict()
    fresh = policy_for(flux2_dir, *extra).transformer.state_dict()
    assert any(not torch.equal(trained[k], fresh[k]) for k in trained)  # the step changed something
    for name, value in restored.transformer.state_dict().items():
        assert torch.equal(value, trained[name]), name
    x, sigma = latent_noise(policy.latent_shape()), torch.tensor([0.8, 0.3])
    with torch.no_grad():
        assert torch.equal(restored.velocity(x, sigma, PROMPTS, 4.0), policy.velocity(x, sigma, PROMPTS, 4.0))


@pytest.mark.slow
def test_lora_export_loads_as_a_flux2_pipeline(flux2_dir, tmp_path):
    """``mmrl export`` of a LoRA policy: the pipeline directory with the adapters merged loads back as
    FLUX.2 and gives the trained velocity."""
    policy = policy_for(flux2_dir, "model.lora.enabled=true", "model.lora.r=4")
    policy.train_step(train_rollout(policy, PROMPTS), Objective(ObjectiveConfig()), 12.0, 4.0)
    x, sigma = latent_noise(policy.latent_shape()), torch.tensor([0.8, 0.3])
    with torch.no_grad():
        trained = policy.velocity(x, sigma, PROMPTS, 4.0)
    policy.export_pretrained(tmp_path / "export")
    exported = load_pipeline(str(tmp_path / "export"), "cpu", torch.float32)
    assert type(exported) is Flux2Adapter and not any("lora" in k for k in exported.transformer.state_dict())
    with torch.no_grad():
        assert torch.allclose(exported.velocity(x, sigma, PROMPTS, 4.0), trained, atol=1e-5)


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_gradients(flux2_dir):
    """The recipes' train.gradient_checkpointing=true on FLUX.2's blocks: the same LoRA gradients."""
    grads = []
    for extra in ((), ("train.gradient_checkpointing=true",)):
        policy = policy_for(flux2_dir, "model.lora.enabled=true", "model.lora.r=4", "train.learning_rate=0", *extra)
        assert policy.transformer.gradient_checkpointing == bool(extra)
        batch = train_rollout(policy, PROMPTS)
        for _loss, _ in policy.loss_terms(batch, Objective(ObjectiveConfig()), 12.0, 4.0):
            _loss.backward()
        grads.append({n: p.grad.clone() for n, p in policy.transformer.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(g.abs().max() > 0 for g in grads[0].values())
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-6), name


# -- (c) through the command line ------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("a red cat\ntwo dogs on grass\nblue sky at night\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("family", ["flux2", "klein"])
def test_lora_step_through_the_cli(family, request, prompt_file, tmp_path):
    from mmrl.runs.checkpoint import CheckpointManager
    from safetensors.torch import load_file

    model_dir = request.getfixturevalue(f"{family}_dir")
    cli("train", "diffusion", *t2i_overrides(model_dir, prompt_file, tmp_path, family, 1, "model.lora.enabled=true",
                                             "model.lora.r=4", "diffusion.guidance_scale=2.0"))
    train = [r for r in rows(tmp_path / family) if "reward" in r]
    assert [r["step"] for r in train] == [1]
    assert 0 < train[0]["reward/brightness"] < 1 and train[0]["grad_norm"] > 0
    adapters = load_file(str(CheckpointManager(tmp_path / family / "checkpoints").latest() / "policy"
                             / "adapter_model.safetensors"))
    trained = {k.split(".lora_B")[0].rsplit(".", 1)[-1] for k, v in adapters.items() if "lora_B" in k and v.any()}
    assert {"to_qkv_mlp_proj", "to_q"} <= trained  # both stream kinds' blocks were trained
