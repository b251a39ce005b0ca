"""The Wan image-to-video adapter (``WanImageToVideoPipeline``) on tiny pipelines built from diffusers'
dummy configs (tests/wan_i2v_builders.py): mmrl's Euler loop equals the pipeline's ``__call__`` given the
first frame (Wan 2.1 I2V with CLIP features and CFG; Wan 2.2 TI2V's expand_timesteps), the conditions are
encoded once per frame, a sampled trajectory's log-probs re-score equal, a LoRA step through
``mmrl train diffusion`` on ``motion_i2v``, and a checkpoint round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl import GenerationPrompt
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.adapters import load_pipeline
from mmrl.diffusion.adapters.wan_i2v import WanI2VAdapter
from mmrl.diffusion.conditions import condition_tensor
from generator_checks import euler, policy_for, train_rollout
from wan_i2v_builders import build_tiny_wan21_i2v, build_tiny_wan22_i2v_a14b, build_tiny_wan22_ti2v

pytestmark = pytest.mark.slow  # every test here takes over half a second on the 2-core CPU

PROMPTS = ["a red cat", "two dogs on grass"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipelines run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def wan21_dir(tmp_path_factory):
    return build_tiny_wan21_i2v(tmp_path_factory.mktemp("tiny-wan21-i2v"))


@pytest.fixture(scope="module")
def ti2v_dir(tmp_path_factory):
    return build_tiny_wan22_ti2v(tmp_path_factory.mktemp("tiny-wan22-ti2v"))


@pytest.fixture(scope="module")
def a14b_dir(tmp_path_factory):
    return build_tiny_wan22_i2v_a14b(tmp_path_factory.mktemp("tiny-wan22-i2v-a14b"))


def _frame(size: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("which, size, guidance", [("wan21", 16, 2.0), ("wan21", 16, 1.0), ("ti2v", 32, 2.0),
                                                   ("a14b", 16, 2.0)])
def test_euler_loop_equals_the_pipeline_given_the_first_frame(which, size, guidance, request):
    adapter = load_pipeline(str(request.getfixturevalue(f"{which}_dir")), "cpu", torch.float32)
    assert isinstance(adapter, WanI2VAdapter) and adapter.conditioning == "first_frame"
    assert adapter.expand_timesteps == (which == "ti2v")
    if which == "a14b":  # both experts take steps: timesteps 1000 (high noise), 857 and 600 (low) at the boundary 875
        t = adapter.sigmas(3, adapter.latent_shape(size, size, 9))[:3] * 1000
        assert adapter.boundary_timestep == 875.0 and (t >= 875).tolist() == [True, False, False]
    frame = _frame(size)  # at the output size: the pipeline's resize is the identity
    shape = adapter.latent_shape(size, size, num_frames=9)
    assert shape == ((48, 3, 2, 2) if which == "ti2v" else (16, 3, 2, 2))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    ref = adapter.pipe(image=frame, prompt=PROMPTS, negative_prompt="", height=size, width=size, num_frames=9,
                       num_inference_steps=3, guidance_scale=guidance, latents=noise.clone(),
                       generator=torch.Generator().manual_seed(0), output_type="pt").frames
    images = condition_tensor(frame, size, size)[None].expand(2, -1, -1, -1)
    video = euler(adapter, noise, PROMPTS, guidance, images)[0]
    assert video.shape == (2, 9, 3, size, size)
    assert torch.allclose(video, ref, atol=1e-4, rtol=0), (video - ref).abs().max()
    other_frame = condition_tensor(_frame(size, 1), size, size)[None].expand(2, -1, -1, -1)
    other = euler(adapter, noise, PROMPTS, guidance, other_frame)[0]
    assert (other - ref).abs().max() > 1e-5  # the frame conditions the clip (little, at random tiny weights)


def test_conditions_are_encoded_once_per_frame(wan21_dir, monkeypatch):
    adapter = load_pipeline(str(wan21_dir), "cpu", torch.float32)
    calls = []
    encode_image = adapter.pipe.encode_image
    monkeypatch.setattr(adapter.pipe, "encode_image", lambda *a, **k: calls.append(1) or encode_image(*a, **k))
    a, b = condition_tensor(_frame(16, 0), 16, 16), condition_tensor(_frame(16, 1), 16, 16)
    x = torch.randn(3, *adapter.latent_shape(16, 16, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = adapter.velocity(x, torch.tensor([0.9, 0.5, 0.2]), PROMPTS + PROMPTS[:1], 2.0, torch.stack([a, b, a]))
        again = adapter.velocity(x, torch.tensor([0.9, 0.5, 0.2]), PROMPTS + PROMPTS[:1], 2.0, torch.stack([a, b, a]))
    assert len(calls) == 2 and adapter.condition_cache.misses == 2  # frames a and b, once each
    assert torch.equal(first, again)
    with pytest.raises(ValueError, match="first frame"):
        adapter.velocity(x, torch.tensor([0.5] * 3), PROMPTS + PROMPTS[:1], 2.0)


def test_ti2v_puts_the_given_frame_back_before_decoding(ti2v_dir, wan21_dir):
    """``WanImageToVideoPipeline`` with ``expand_timesteps`` writes the frame's latent over the first latent
    frame after the loop; ``final_latents`` does the same (an SDE last step leaves noise there), and Wan 2.1
    I2V, which conditions through channels, leaves the latents as sampled."""
    ti2v = load_pipeline(str(ti2v_dir), "cpu", torch.float32)
    images = torch.stack([condition_tensor(_frame(32, i), 32, 32) for i in range(2)])
    x = torch.randn(2, *ti2v.latent_shape(32, 32, 9), generator=torch.Generator().manual_seed(0))
    out = ti2v.final_latents(x, images)
    first = ti2v.condition_cache.get(["frames=9"] * 2, images)["first"]
    assert torch.equal(out[:, :, 1:], x[:, :, 1:]) and torch.allclose(out[:, :, :1], first)
    assert (x[:, :, :1] - first).abs().max() > 0.1
    wan21 = load_pipeline(str(wan21_dir), "cpu", torch.float32)
    y = torch.randn(2, *wan21.latent_shape(16, 16, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(wan21.final_latents(y, torch.stack([condition_tensor(_frame(16), 16, 16)] * 2)), y)


# -- through the policy and the command line ----------------------------------------------------------

def _examples(n=2):
    return [{"prompt": PROMPTS[i], "first_frame": _frame(16, i), "_index": i} for i in range(n)]


def _policy(path, *overrides):
    return policy_for(path, "diffusion.eval_num_steps=3", "diffusion.num_frames=9", "diffusion.guidance_scale=2.0",
                      *overrides, task="motion_i2v")


def _rollout(policy):
    examples = _examples()
    prompts = [GenerationPrompt(ex["prompt"], ex["first_frame"]) for ex in examples]
    return train_rollout(policy, prompts, examples=examples)


def test_sampled_log_probs_re_score_equal(wan21_dir):
    policy = _policy(wan21_dir, "model.lora.enabled=true", "model.lora.r=4")
    batch = _rollout(policy)
    assert batch.payload["condition_images"].shape == (4, 3, 16, 16)
    latents, sigmas = batch.payload["latents"], batch.payload["sigmas"][0]
    images = batch.payload["condition_images"]
    with torch.no_grad():
        for t in range(3):
            sigma = torch.full((4,), float(sigmas[t]))
            v = policy.velocity(latents[:, t], sigma, batch.payload["prompts"], 2.0, images)
            logp = policy._step(v, latents[:, t], sigmas, t, prev_sample=latents[:, t + 1]).log_prob
            assert torch.allclose(logp, batch.old_logps[:, t], atol=1e-5), (logp - batch.old_logps[:, t])


def test_checkpoint_round_trip(wan21_dir, tmp_path):
    lora = ("model.lora.enabled=true", "model.lora.r=4")
    policy = _policy(wan21_dir, *lora)
    policy.train_step(_rollout(policy), Objective(ObjectiveConfig()), 12.0, 4.0)
    policy.save(tmp_path / "ckpt")
    restored = _policy(wan21_dir, *lora)
    restored.load(tmp_path / "ckpt")
    for (name, a), b in zip(policy.transformer.state_dict().items(), restored.transformer.state_dict().values()):
        assert torch.equal(a, b), name
    x = torch.randn(2, 16, 3, 2, 2, generator=torch.Generator().manual_seed(3))
    images = torch.stack([condition_tensor(ex["first_frame"], 16, 16) for ex in _examples()])
    with torch.no_grad():
        assert torch.equal(policy.velocity(x, torch.tensor([0.7, 0.3]), PROMPTS, 2.0, images),
                           restored.velocity(x, torch.tensor([0.7, 0.3]), PROMPTS, 2.0, images))


def test_lora_step_through_the_cli_on_motion_i2v(wan21_dir, tmp_path):
    from typer.testing import CliRunner

    from mmrl.cli import app

    args = [f"model.path={wan21_dir}", "task.name=motion_i2v", "task.options.eval_size=2", "task.rewards.motion=1.0",
            "task.rewards.brightness=1.0", "train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=2",
            "diffusion.num_steps=2", "diffusion.eval_num_steps=2", "diffusion.height=16", "diffusion.width=16",
            "diffusion.num_frames=9", "eval.num_examples=2", "eval.every=0", "train.learning_rate=1e-3",
            "train.threads=1", f"log.output_dir={tmp_path}", "log.run_name=wan-i2v", "log.progress=false",
            "log.tensorboard=false", "log.save_rollouts_every=0", "model.lora.enabled=true", "model.lora.r=4"]
    result = CliRunner().invoke(app, ["train", "diffusion", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    rows = [json.loads(line) for line in (tmp_path / "wan-i2v" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if "reward" in r][0]
    assert step["step"] == 1 and step["reward/brightness/unparsable_frac"] == 0.0
    assert step["reward_std"] > 0 and math.isfinite(step["loss"]) and step["grad_norm"] > 0
    assert [r["step"] for r in rows if "eval/reward" in r] == [0, 1]
    assert (tmp_path / "wan-i2v" / "samples_after.png").stat().st_size > 200
