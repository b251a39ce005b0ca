"""FLUX.1-Kontext (``FluxKontextPipeline``, image editing) through its adapter, on tiny random pipelines
built locally (tests/flux2_builders.py), against diffusers: mmrl's Euler loop with the source images
equals the pipeline's ``__call__`` (``_auto_resize=False``, the images at the output size; 1e-4, float32),
with the guidance embedding (Kontext-dev) and with true CFG (the unconditional branch keeps the image);
the SDE log-probs of a rollout re-scored equal (1e-5); a LoRA policy step, its checkpoint round trip and
its export;
a LoRA step through ``mmrl train diffusion`` on the image_edit task."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from flux2_builders import build_tiny_flux_kontext
from generator_checks import assert_rescored, euler, latent_noise, policy_for, train_rollout
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.adapters import load_pipeline
from mmrl.diffusion.adapters.flux_kontext import FluxKontextAdapter
from mmrl.registry import GENERATOR_FAMILIES
from mmrl.task import GenerationPrompt

PROMPTS = ["make the cat blue", "add a dog on the grass"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipelines run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def kontext_dir(tmp_path_factory):
    return build_tiny_flux_kontext(tmp_path_factory.mktemp("tiny-kontext"))


@pytest.fixture(scope="module")
def kontext(kontext_dir):
    return load_pipeline(str(kontext_dir), "cpu", torch.float32)


def sources(height=16, width=16, seed=0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in PROMPTS]


def as_tensor(images) -> torch.Tensor:
    """PIL -> (B, 3, H, W) in [0, 1], as the policy hands a conditioned pipeline its images."""
    return torch.stack([torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1) for im in images])


def _euler(adapter, noise, images, guidance):
    """mmrl's Euler loop (generator_checks.euler) on PROMPTS with these source images."""
    return euler(adapter, noise, PROMPTS, guidance, as_tensor(images))[0]


def _edits(images) -> list[GenerationPrompt]:
    return [GenerationPrompt(text, image) for text, image in zip(PROMPTS, images)]


def _pipeline(adapter, noise, images, height=16, width=16, **kwargs):
    return adapter.pipe(image=images, prompt=PROMPTS, height=height, width=width, max_area=height * width,
                        num_inference_steps=3, latents=adapter.pack(noise), _auto_resize=False,
                        generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs).images


@pytest.mark.slow
def test_registered_as_an_editing_model(kontext):
    assert GENERATOR_FAMILIES.get("FluxKontextPipeline") == FluxKontextAdapter.from_pretrained
    assert type(kontext) is FluxKontextAdapter and kontext.conditioning == "image" and kontext.family == "flux_kontext"
    assert kontext.latent_shape(16, 32) == (1, 8, 16) and kontext.default_guidance_scale == 3.5


@pytest.mark.parametrize("height,width", [(16, 16), (16, 32)])
def test_matches_pipeline_with_the_source_image(kontext, height, width):
    noise = latent_noise(kontext.latent_shape(height, width))
    images = sources(height, width)
    ref = _pipeline(kontext, noise, images, height, width, guidance_scale=3.5)
    image = _euler(kontext, noise, images, 3.5)
    assert image.shape == (2, 3, height, width)
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    other = _euler(kontext, noise, sources(height, width, seed=1), 3.5)
    assert (other - ref).abs().max() > 1e-4  # the source image reached the transformer


@pytest.mark.slow
def test_true_cfg_keeps_the_image(tmp_path):
    adapter = load_pipeline(str(build_tiny_flux_kontext(tmp_path, schnell=True)), "cpu", torch.float32)
    assert not adapter.guidance_embeds and adapter.default_guidance_scale == 1.0
    noise, images = latent_noise(adapter.latent_shape(16, 16)), sources()
    ref = _pipeline(adapter, noise, images, negative_prompt=["", ""], true_cfg_scale=2.0)
    image = _euler(adapter, noise, images, 2.0)
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    assert (_euler(adapter, noise, images, 1.0) - ref).abs().max() > 1e-4


def test_condition_cache_encodes_each_text_once(kontext):
    kontext.condition_cache.clear()
    kontext.prompt_cache.clear()
    texts, pairs, hits = kontext.prompt_cache.misses, kontext.condition_cache.misses, kontext.condition_cache.hits
    x, sigma = latent_noise(kontext.latent_shape(16, 16)), torch.tensor([0.7, 0.3])
    with torch.no_grad():
        first = kontext.velocity(x, sigma, PROMPTS, 3.5, as_tensor(sources()))
        kontext.velocity(x, sigma, PROMPTS, 3.5, as_tensor(sources(seed=1)))  # same texts, new images
        again = kontext.velocity(x, sigma, PROMPTS, 3.5, as_tensor(sources()))
    assert kontext.prompt_cache.misses - texts == 2 and kontext.condition_cache.misses - pairs == 4
    assert kontext.condition_cache.hits - hits == 2 and torch.equal(first, again)


def test_errors_say_what_to_give(kontext):
    x, sigma = latent_noise(kontext.latent_shape(16, 16)), torch.tensor([0.5, 0.5])
    with pytest.raises(ValueError, match="GenerationPrompt"):
        kontext.velocity(x, sigma, PROMPTS, 3.5)
    with pytest.raises(ValueError, match="diffusion.height and diffusion.width to multiples of 4"):
        kontext.velocity(x, sigma, PROMPTS, 3.5, torch.rand(2, 3, 18, 16))


# -- the policy over the adapter --------------------------------------------------------------------


@pytest.mark.slow
def test_rescored_log_probs_equal_the_sampling_ones(kontext_dir):
    policy = policy_for(kontext_dir)
    batch = train_rollout(policy, _edits(sources()))
    assert batch.payload["condition_images"].shape == (4, 3, 16, 16)
    assert batch.action_mask.sum() == 12 and torch.isfinite(batch.old_logps).all()
    assert_rescored(policy, batch, steps=3)
    # the same noise with other source images: other samples (the log-probs were of the edits)
    other = train_rollout(policy_for(kontext_dir), _edits(sources(seed=1)))
    assert not torch.allclose(other.payload["latents"][:, -1], batch.payload["latents"][:, -1], atol=1e-4)


@pytest.mark.slow
def test_lora_policy_step_trains_round_trips_and_exports(kontext_dir, tmp_path):
    lora = ["model.lora.enabled=true", "model.lora.r=4"]
    policy = policy_for(kontext_dir, *lora)
    metrics = policy.train_step(train_rollout(policy, _edits(sources())), Objective(ObjectiveConfig()), 12.0, 4.0)
    assert metrics["grad_norm"] > 0
    lora_b = {k: v for k, v in policy.transformer.state_dict().items() if "lora_B" in k}
    assert lora_b and sum(int(v.count_nonzero()) for v in lora_b.values()) > 0  # peft starts lora_B at zero
    policy.save(tmp_path / "ckpt")
    restored = policy_for(kontext_dir, *lora)
    restored.load(tmp_path / "ckpt")
    for name, value in restored.transformer.state_dict().items():
        assert torch.equal(value, policy.transformer.state_dict()[name]), name
    x, sigma, images = latent_noise(policy.latent_shape()), torch.tensor([0.8, 0.3]), as_tensor(sources())
    with torch.no_grad():
        trained = policy.velocity(x, sigma, PROMPTS, 3.5, images)
        assert torch.equal(restored.velocity(x, sigma, PROMPTS, 3.5, images), trained)
    policy.export_pretrained(tmp_path / "export")  # mmrl export: the adapters merged, a Kontext pipeline again
    exported = load_pipeline(str(tmp_path / "export"), "cpu", torch.float32)
    assert type(exported) is FluxKontextAdapter
    with torch.no_grad():
        assert torch.allclose(exported.velocity(x, sigma, PROMPTS, 3.5, images), trained, atol=1e-5)


@pytest.mark.slow
def test_lora_step_through_the_cli(kontext_dir, tmp_path):
    """``mmrl train diffusion`` with the image_edit task (its synthetic 16 px edits): every sample scored."""
    from safetensors.torch import load_file

    from mmrl.runs.checkpoint import CheckpointManager
    from test_diffusion_runs import cli, rows

    cli("train", "diffusion", f"model.path={kontext_dir}", "task.name=image_edit", "task.options.train_size=8",
        "task.options.eval_size=2", "train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=2",
        "diffusion.num_steps=2", "diffusion.eval_num_steps=2", "diffusion.height=16", "diffusion.width=16",
        "eval.num_examples=2", "eval.every=0", "train.learning_rate=1e-3", "train.threads=1",
        f"log.output_dir={tmp_path}", "log.run_name=kontext", "log.progress=false", "log.tensorboard=false",
        "log.save_rollouts_every=0", "model.lora.enabled=true", "model.lora.r=4")
    train = [r for r in rows(tmp_path / "kontext") if "reward" in r]
    assert [r["step"] for r in train] == [1] and train[0]["grad_norm"] > 0
    for name in ("edit_score", "edit_preservation"):
        assert train[0][f"reward/{name}/unparsable_frac"] == 0.0
    assert 0 < train[0]["reward/edit_preservation"] < 1
    adapters = load_file(str(CheckpointManager(tmp_path / "kontext" / "checkpoints").latest() / "policy"
                             / "adapter_model.safetensors"))
    assert any(v.any() for k, v in adapters.items() if "lora_B" in k)
