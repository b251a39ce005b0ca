"""Qwen-Image (``QwenImagePipeline``) and Qwen-Image-Edit (``QwenImageEditPipeline``) through their adapters, on
tiny random pipelines built locally (tests/qwen_image_builders.py), against diffusers:

(a) mmrl's Euler loop over ``sigmas``/``velocity``/``decode`` gives the pipeline's own ``__call__`` output at
    the same latents (1e-4, float32): the dynamic-shift schedule, prompts of different lengths (padding mask),
    true CFG with its norm rescale; for the edit model, with the source image (its vision tokens in the prompt,
    its latents beside the noisy ones), also when the pipeline resizes it to another condition size;
(b) a sampled trajectory's SDE log-probs re-scored by the training path equal the sampling ones (1e-5);
(c) a LoRA RL step through ``mmrl train diffusion`` (Qwen-Image; the edit model's step through the policy);
(d) a checkpoint round trip: equal weights and equal velocity in a fresh policy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.adapters import load_pipeline
from mmrl.diffusion.adapters.qwen_image import QwenImageAdapter
from mmrl.diffusion.adapters.qwen_image_edit import QwenImageEditAdapter
from mmrl.registry import GENERATOR_FAMILIES
from mmrl.task import GenerationPrompt
from generator_checks import assert_rescored, euler, latent_noise, policy_for, train_rollout
from qwen_image_builders import build_tiny_qwen_image, build_tiny_qwen_image_edit
from test_diffusion_runs import cli, rows, t2i_overrides

PROMPTS = ["a red cat", "two dogs on grass"]
EDITS = ["make the square red", "add a yellow triangle"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipelines run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return build_tiny_qwen_image(tmp_path_factory.mktemp("tiny-qwen-image"))


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    return build_tiny_qwen_image_edit(tmp_path_factory.mktemp("tiny-qwen-image-edit"))


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    return load_pipeline(str(qwen_dir), "cpu", torch.float32)


def _images(batch, height, width, seed=0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(batch)]


def _tensor(images: list[Image.Image]) -> torch.Tensor:
    """The policy's condition images: (B, 3, H, W) in [0, 1] (mmrl.diffusion.conditions.condition_tensor)."""
    return torch.stack([torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1) for im in images])


def _pipeline(adapter, noise, prompts, guidance, steps=3, **kwargs):
    """The pipeline's ``__call__``: ``guidance > 1`` is its true CFG with the empty negative prompt."""
    height, width = (s * adapter.vae_scale_factor for s in noise.shape[-2:])
    negative = {"negative_prompt": [""] * len(prompts)} if guidance > 1 else {}
    b, c, h, w = noise.shape
    return adapter.pipe(prompt=prompts, true_cfg_scale=guidance, height=height, width=width,
                        num_inference_steps=steps, latents=adapter.pipe._pack_latents(noise, b, c, h, w),
                        output_type="pt", **negative, **kwargs).images


# -- structure -----------------------------------------------------------------------------------


def test_registered_and_shaped(qwen):
    assert GENERATOR_FAMILIES.get("QwenImagePipeline") == QwenImageAdapter.from_pretrained
    assert GENERATOR_FAMILIES.get("QwenImageEditPipeline") == QwenImageEditAdapter.from_pretrained
    assert type(qwen) is QwenImageAdapter and qwen.family == "qwen_image" and qwen.conditioning is None
    # VAE scale 4 x 2x2 patches: 32 x 48 px -> (z_dim 4, 8, 12), rounded down to whole patches
    assert qwen.latent_shape(32, 48) == (4, 8, 12) and qwen.latent_shape(36, 50) == (4, 8, 12)
    assert qwen.default_guidance_scale == 4.0 and qwen.default_height == qwen.default_width == 512
    frozen = [m for name, m in qwen.pipe.components.items() if isinstance(m, torch.nn.Module) and name != "transformer"]
    assert frozen and all(not p.requires_grad for m in frozen for p in m.parameters())
    names = [name for name, _ in qwen.transformer.named_modules()]
    for target in qwen.lora_targets:  # both streams' attention projections of every block
        assert sum(name.endswith(".attn." + target) for name in names) == 2, target


def test_prompt_embedding_is_the_text_after_the_template(qwen):
    """The tiny tokenizer cuts the template where Qwen's does: the embedding starts at the user's text."""
    tok = qwen.pipe.tokenizer
    template, drop = qwen.pipe.prompt_template_encode, qwen.pipe.prompt_template_encode_start_idx
    for prompt in PROMPTS + [""]:
        ids = tok(template.format(prompt))["input_ids"]
        assert tok.convert_ids_to_tokens(ids[drop - 2 : drop]) == ["user", "Ċ"]
        assert qwen.prompt_cache.get([prompt])["prompt_embeds"].shape == (1, len(ids) - drop, 16)


def test_packing_is_the_pipelines(qwen):
    x = latent_noise(qwen.latent_shape(32, 48))
    packed = qwen.pipe._pack_latents(x, 2, 4, 8, 12)
    v = torch.randn_like(packed)
    with torch.no_grad():  # velocity's own packing, seen through the transformer's input and output
        seen = []
        hook = qwen.transformer.register_forward_hook(
            lambda module, args, kwargs, out: seen.append(kwargs["hidden_states"]) or (v,), with_kwargs=True)
        try:
            out = qwen.velocity(x, torch.tensor([0.5, 0.5]), PROMPTS, 1.0)
        finally:
            hook.remove()
    assert torch.equal(seen[0], packed)
    assert torch.equal(out, qwen.pipe._unpack_latents(v, 32, 48, 4)[:, :, 0])


@pytest.mark.parametrize("steps,size", [(3, 32), (5, 64)])
def test_sigmas_are_the_pipelines(qwen, steps, size):
    """Qwen-Image's schedule: dynamic exponential shift by the packed token count, stretched to end at 0.02."""
    noise = latent_noise(qwen.latent_shape(size, size), batch=1)
    _pipeline(qwen, noise, PROMPTS[:1], 1.0, steps=steps)
    sigmas = qwen.sigmas(steps, tuple(noise.shape[1:]))
    assert sigmas.shape == (steps + 1,) and sigmas[-1] == 0.0 and sigmas[-2] == pytest.approx(0.02)
    assert torch.allclose(sigmas, qwen.pipe.scheduler.sigmas.float(), atol=1e-7)


def test_guidance_embedding_is_refused():
    from types import SimpleNamespace

    pipe = SimpleNamespace(transformer=SimpleNamespace(config={"guidance_embeds": True}))
    with pytest.raises(ValueError, match="transformer/config.json sets guidance_embeds=true"):
        QwenImageAdapter(pipe)


# -- (a) parity with the diffusers pipelines -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("height,width", [(32, 32), (32, 48)])
def test_matches_pipeline(qwen, height, width):
    lengths = {qwen.prompt_cache.get([p])["prompt_embeds"].shape[1] for p in PROMPTS + [""]}
    assert len(lengths) == 3  # the batch is padded and masked, as the pipeline's
    noise = latent_noise(qwen.latent_shape(height, width))
    for guidance in (1.0, 4.0):
        ref = _pipeline(qwen, noise, PROMPTS, guidance)
        image, sigmas = euler(qwen, noise, PROMPTS, guidance)
        assert torch.allclose(sigmas, qwen.pipe.scheduler.sigmas.float())
        assert image.shape == (2, 3, height, width) and image.dtype == torch.float32
        assert torch.allclose(image, ref, atol=1e-4, rtol=0), (guidance, (image - ref).abs().max())
    assert (image - euler(qwen, noise, PROMPTS, 1.0)[0]).abs().max() > 1e-3  # CFG was really exercised


def test_cfg_keeps_the_conditional_norm(qwen):
    """The guided velocity is rescaled per packed token to the conditional velocity's norm (the pipeline's
    ``comb_pred * (cond_norm / noise_norm)``): the norms are the conditional ones, the direction the guided one."""
    x, sigma = latent_noise(qwen.latent_shape(32, 32)), torch.tensor([0.9, 0.4])
    with torch.no_grad():
        cond = qwen.pipe._pack_latents(qwen.velocity(x, sigma, PROMPTS, 1.0), 2, 4, 8, 8)
        uncond = qwen.pipe._pack_latents(qwen.velocity(x, sigma, ["", ""], 1.0), 2, 4, 8, 8)
        guided = qwen.pipe._pack_latents(qwen.velocity(x, sigma, PROMPTS, 3.0), 2, 4, 8, 8)
    assert torch.allclose(guided.norm(dim=-1), cond.norm(dim=-1), atol=1e-5)
    plain = uncond + 3.0 * (cond - uncond)
    assert torch.allclose(torch.nn.functional.cosine_similarity(guided, plain, dim=-1), torch.ones(2, 16), atol=1e-5)


@pytest.fixture
def edit_at(edit_dir, monkeypatch):
    """The edit pipeline with its target area set to ``area`` (its ``__call__`` hard-codes 1024 x 1024 px, too
    big for a CPU test) and an adapter with the same ``condition_area``."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as module

    real = module.calculate_dimensions

    def make(area):
        monkeypatch.setattr(module, "calculate_dimensions", lambda target_area, ratio: real(area, ratio))
        return QwenImageEditAdapter.from_pretrained(str(edit_dir), "cpu", torch.float32, condition_area=area)

    return make


@pytest.mark.slow
def test_edit_matches_pipeline(edit_at):
    """Two edits at once, the source images already at the condition size (the pipeline's resize is the identity)."""
    edit = edit_at(32 * 32)
    assert edit.conditioning == "image" and edit.family == "qwen_image_edit" and edit.condition_size(32, 32) == (32, 32)
    noise, sources = latent_noise(edit.latent_shape(32, 32)), _images(2, 32, 32)
    for guidance in (1.0, 4.0):
        ref = _pipeline(edit, noise, EDITS, guidance, image=sources)
        image, _ = euler(edit, noise, EDITS, guidance, _tensor(sources))
        assert torch.allclose(image, ref, atol=1e-4, rtol=0), (guidance, (image - ref).abs().max())
    other, _ = euler(edit, noise, EDITS, guidance, _tensor(_images(2, 32, 32, seed=1)))
    assert (other - image).abs().max() > 1e-3  # the source image conditions the edit


@pytest.mark.slow
def test_edit_resizes_the_source_as_the_pipeline(edit_at):
    """A 32 x 48 image at a target area of 48 x 48 px conditions at 32 x 64 (calculate_dimensions' multiples of
    32): the pipeline resizes it (Lanczos) for the text encoder and the VAE, and the condition's 4 x 8 patch grid
    differs from the output's 4 x 6. One edit: with a list of images, diffusers' ``resize`` passes them through
    unresized to the text encoder (only its VAE input is resized); the adapter follows the one-image path."""
    edit = edit_at(48 * 48)
    assert edit.condition_size(32, 48) == (32, 64)
    noise, source = latent_noise(edit.latent_shape(32, 48), batch=1), _images(1, 32, 48)
    ref = _pipeline(edit, noise, EDITS[:1], 4.0, image=source[0])
    image, _ = euler(edit, noise, EDITS[:1], 4.0, _tensor(source))
    assert torch.allclose(image, ref, atol=1e-4, rtol=0), (image - ref).abs().max()
    assert edit.condition_cache.get(EDITS[:1], _tensor(source))["image_latents"].shape == (1, 4 * 8, 16)


def test_edit_needs_images(edit_at):
    edit = edit_at(32 * 32)
    with pytest.raises(ValueError, match="edits a source image.*none"):
        edit.velocity(latent_noise(edit.latent_shape(32, 32)), torch.tensor([0.5, 0.5]), EDITS, 1.0)


def test_condition_area_too_small_is_refused(edit_at):
    edit = edit_at(16 * 16)
    with pytest.raises(ValueError, match="condition_area=256 gives a 0x0 px condition.*None"):
        edit.condition_size(16, 16)
    edit.condition_area = None  # the output's size, rounded down to whole 2x2 patches of the VAE's latents
    assert edit.condition_size(16, 20) == (16, 16)


@pytest.mark.slow
def test_bfloat16_velocity_and_decode_are_float32(qwen_dir, edit_dir):
    qwen = load_pipeline(str(qwen_dir), "cpu", torch.bfloat16)
    edit = QwenImageEditAdapter.from_pretrained(str(edit_dir), "cpu", "bfloat16", condition_area=None)
    assert qwen.dtype == edit.dtype == torch.bfloat16
    x, sigma = latent_noise(qwen.latent_shape(16, 16)), torch.tensor([0.9, 0.4])
    with torch.no_grad():
        for v in (qwen.velocity(x, sigma, PROMPTS, 4.0),
                  edit.velocity(x, sigma, EDITS, 4.0, _tensor(_images(2, 16, 16)))):
            assert v.dtype == torch.float32 and v.shape == x.shape and torch.isfinite(v).all()
        image = qwen.decode(x)
    assert image.dtype == torch.float32 and image.shape == (2, 3, 16, 16)


# -- (b), (d): the policy over the adapter --------------------------------------------------------


@pytest.fixture
def small_conditions(monkeypatch):
    """``model.path`` loads the edit adapter with 32 x 32 px conditions (the tiny model's, not 1024 x 1024)."""
    from functools import partial

    monkeypatch.setitem(GENERATOR_FAMILIES._items, "QwenImageEditPipeline",
                        partial(QwenImageEditAdapter.from_pretrained, condition_area=32 * 32))


def _edits(seed=0) -> list[GenerationPrompt]:
    return [GenerationPrompt(text, image) for text, image in zip(EDITS, _images(2, 16, 16, seed))]


def test_rescored_log_probs_equal_the_sampling_ones(qwen_dir):
    """At the checkpoint's guidance (true CFG 4, the norm rescale inside the re-scored velocity)."""
    policy = policy_for(qwen_dir)
    assert policy.guidance(eval_mode=False) == 4.0
    batch = train_rollout(policy, PROMPTS)
    assert batch.payload["latents"].shape == (4, 4, 4, 4, 4)  # (samples, steps + 1, latent shape)
    assert batch.action_mask.sum() == 12
    assert_rescored(policy, batch, steps=3)


@pytest.mark.slow
def test_edit_rescored_log_probs_equal_the_sampling_ones(edit_dir, small_conditions):
    policy = policy_for(edit_dir, task="image_edit")
    batch = train_rollout(policy, _edits())
    assert batch.payload["condition_images"].shape == (4, 3, 16, 16)
    assert batch.action_mask.sum() == 12
    assert_rescored(policy, batch, steps=3)
    # the same noise with other source images: other samples (the log-probs were of the edits)
    other = train_rollout(policy_for(edit_dir, task="image_edit"), _edits(seed=1))
    assert not torch.allclose(other.payload["latents"][:, -1], batch.payload["latents"][:, -1], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip(qwen_dir, tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.r=4"] if lora else []
    policy = policy_for(qwen_dir, *extra)
    policy.train_step(train_rollout(policy, PROMPTS), Objective(ObjectiveConfig()), 12.0, 4.0)
    policy.save(tmp_path / "ckpt")
    restored = policy_for(qwen_dir, *extra)
    restored.load(tmp_path / "ckpt")
    trained = policy.transformer.state_dict()
    fresh = policy_for(qwen_dir, *extra).transformer.state_dict()
    assert any(not torch.equal(trained[k], fresh[k]) for k in trained)  # the step changed something
    for name, value in restored.transformer.state_dict().items():
        assert torch.equal(value, trained[name]), name
    x, sigma = latent_noise(policy.latent_shape()), torch.tensor([0.8, 0.3])
    with torch.no_grad():
        assert torch.equal(restored.velocity(x, sigma, PROMPTS, 4.0), policy.velocity(x, sigma, PROMPTS, 4.0))


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_lora_step(qwen_dir, monkeypatch):
    """The recipe's ``train.gradient_checkpointing``: the dual-stream blocks are recomputed in the backward pass
    (diffusers' checkpointing, through mmrl's checkpoint function) and the LoRA step is the same."""
    import mmrl.core.activation_checkpointing as ac

    calls = []
    real = ac.checkpoint
    monkeypatch.setattr(ac, "checkpoint", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    lora = ["model.lora.enabled=true", "model.lora.r=4"]
    plain = policy_for(qwen_dir, *lora)
    batch = train_rollout(plain, PROMPTS)
    plain.train_step(batch, Objective(ObjectiveConfig()), 12.0, 4.0)
    assert not calls
    checkpointed = policy_for(qwen_dir, *lora, "train.gradient_checkpointing=true")
    checkpointed.train_step(batch, Objective(ObjectiveConfig()), 12.0, 4.0)
    assert len(calls) >= 2 * 3  # both blocks, every trained step
    trained = plain.transformer.state_dict()
    for name, value in checkpointed.transformer.state_dict().items():
        assert torch.allclose(value, trained[name], atol=1e-6, rtol=0), name


# -- (c) through the command line ------------------------------------------------------------------


def _trained_lora_layers(run_dir) -> set[str]:
    from safetensors.torch import load_file

    from mmrl.runs.checkpoint import CheckpointManager

    adapters = load_file(str(CheckpointManager(run_dir / "checkpoints").latest() / "policy"
                             / "adapter_model.safetensors"))
    return {k.split(".attn.")[1].split(".lora_B")[0] for k, v in adapters.items() if "lora_B" in k and v.any()}


@pytest.mark.slow
def test_lora_step_through_the_cli(qwen_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\ntwo dogs on grass\nblue sky at night\n")
    cli("train", "diffusion", *t2i_overrides(qwen_dir, prompts, tmp_path, "qwen", 1, "model.lora.enabled=true",
                                             "model.lora.r=4"))
    train = [r for r in rows(tmp_path / "qwen") if "reward" in r]
    assert [r["step"] for r in train] == [1]
    assert 0 < train[0]["reward/brightness"] < 1 and train[0]["grad_norm"] > 0
    assert _trained_lora_layers(tmp_path / "qwen") == set(QwenImageAdapter.lora_targets)  # both streams' attention


@pytest.mark.slow
def test_edit_lora_step_through_the_cli(edit_dir, tmp_path, small_conditions):
    """``mmrl train diffusion`` with the image_edit task (its synthetic 16 px edits): every sample scored."""
    cli("train", "diffusion", f"model.path={edit_dir}", "task.name=image_edit", "task.options.train_size=8",
        "task.options.eval_size=2", "train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=2",
        "diffusion.num_steps=2", "diffusion.eval_num_steps=2", "diffusion.height=16", "diffusion.width=16",
        "eval.num_examples=2", "eval.every=0", "train.learning_rate=1e-3", "train.threads=1",
        f"log.output_dir={tmp_path}", "log.run_name=edit", "log.progress=false", "log.tensorboard=false",
        "log.save_rollouts_every=0", "model.lora.enabled=true", "model.lora.r=4")
    train = [r for r in rows(tmp_path / "edit") if "reward" in r]
    assert [r["step"] for r in train] == [1] and train[0]["grad_norm"] > 0
    for name in ("edit_score", "edit_preservation"):
        assert train[0][f"reward/{name}/unparsable_frac"] == 0.0
    assert 0 < train[0]["reward/edit_preservation"] < 1
    assert _trained_lora_layers(tmp_path / "edit") == set(QwenImageAdapter.lora_targets)
