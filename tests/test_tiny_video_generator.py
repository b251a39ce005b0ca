"""The tiny Wan-architecture video generator: its pixel layout, x-prediction on clips, the pretraining
data, loading by ``model.path``, and RL on clips through the diffusion policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import make_config
from mmrl.data.motion_t2v import DIRECTIONS, motion_prompt
from mmrl.diffusion.loading import load_generator
from mmrl.diffusion.policy import DiffusionPolicy
from mmrl.diffusion.pretrain import motion_dataset, pretrain_tiny_video_generator
from mmrl.diffusion.tiny import MARKER, SIGMA_FLOOR, TinyFlowPipeline
from mmrl.diffusion.tiny_video import FAMILY, TinyWanPipeline, new_tiny_video_models, save_tiny_video

SMALL = {"heads": 1, "head_dim": 32, "layers": 1}


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Tiny models: one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory):
    models = new_tiny_video_models(seed=0, **SMALL)
    return save_tiny_video(tmp_path_factory.mktemp("tiny-wan"), *models, {"prediction": "sample"})


@pytest.fixture(scope="module")
def pipe(video_dir):
    return load_generator(str(video_dir), "cpu", torch.float32)


def test_loads_as_the_wan_architecture_in_pixel_space(pipe, video_dir):
    from diffusers import WanTransformer3DModel
    from transformers import UMT5EncoderModel

    assert isinstance(pipe, TinyWanPipeline) and pipe.family == FAMILY and pipe.is_video
    assert isinstance(pipe.transformer, WanTransformer3DModel) and isinstance(pipe.text_encoder, UMT5EncoderModel)
    assert json.loads((video_dir / MARKER).read_text())["family"] == FAMILY
    assert pipe.latent_shape(16, 16) == (3, 4, 16, 16)  # (channels, frames, H, W): Wan's layout
    assert pipe.latent_shape(16, 8, num_frames=6) == (3, 6, 16, 8)


def test_decode_is_the_inverse_of_encode_and_gives_frames_first(pipe):
    clips = torch.rand(2, 4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    latents = pipe.encode_images(clips)
    assert latents.shape == (2, 3, 4, 16, 16)
    torch.testing.assert_close(latents[1, :, 2], clips[1, 2] * 2 - 1)  # frame 2 of clip 1
    torch.testing.assert_close(pipe.decode(latents), clips)


@torch.no_grad()
def test_x_prediction_velocity_on_clips(pipe):
    x = torch.randn(3, 3, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.9, 0.3, 0.01])  # the last is clipped to SIGMA_FLOOR
    embeds = {k: v.detach() for k, v in pipe.encode_text(["a red circle moving left"] * 3).items()}
    assert set(embeds) == {"hidden"}  # Wan conditions on the text sequence only (no pooled vector)
    x0 = pipe.transformer(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=embeds["hidden"],
                          return_dict=False)[0]
    v = pipe.velocity_from_embeds(x, sigma, embeds)
    torch.testing.assert_close(v, (x - x0) / torch.tensor([0.9, 0.3, SIGMA_FLOOR]).view(-1, 1, 1, 1, 1))
    # classifier-free guidance: uncond + g (cond - uncond), the unconditional branch the empty prompt
    prompts = ["a red circle moving left", "a blue square moving up"]
    s = torch.tensor([0.5, 0.5])
    cond, uncond = pipe.velocity(x[:2], s, prompts), pipe.velocity(x[:2], s, ["", ""])
    torch.testing.assert_close(pipe.velocity(x[:2], s, prompts, guidance_scale=3.0), uncond + 3.0 * (cond - uncond))


@pytest.mark.slow
def test_motion_dataset_is_deterministic_and_its_captions_lie_at_the_stated_rate():
    a, pa = motion_dataset(400, seed=3, direction_noise=0.5)
    b, pb = motion_dataset(400, seed=3, direction_noise=0.5)
    assert a.shape == (400, 4, 3, 16, 16) and a.dtype == torch.uint8
    assert torch.equal(a, b) and pa == pb
    clean, pc = motion_dataset(400, seed=3)
    assert torch.equal(clean, a)  # the same clips; only some captions differ
    assert all(p.split()[-1] in DIRECTIONS for p in pa)
    wrong = np.mean([x != y for x, y in zip(pa, pc)])
    assert 0.4 < wrong < 0.6, wrong


def test_pretrain_round_trip_records_the_recipe(tmp_path):
    out = pretrain_tiny_video_generator(tmp_path / "g", steps=2, batch_size=2, dataset_size=4, log_every=0,
                                        direction_noise=0.5, ema_decay=0.9, **SMALL)
    info = json.loads((out / MARKER).read_text())
    assert (info["family"], info["height"], info["num_frames"], info["prediction"]) == (FAMILY, 16, 4, "sample")
    assert info["pretrain"]["direction_noise"] == 0.5 and info["pretrain"]["layers"] == 1
    assert isinstance(load_generator(str(out), "cpu", torch.float32), TinyWanPipeline)


def test_the_image_generator_still_loads_as_itself(tiny_flow_dir):
    assert type(load_generator(str(tiny_flow_dir), "cpu", torch.float32)) is TinyFlowPipeline


def test_rl_step_on_clips_with_the_motion_reward(video_dir):
    """A train rollout gives clips (lists of frames) with a log-prob per denoising step, the motion
    reward scores them, and an AWM update changes the Wan transformer."""
    from mmrl.core.losses import Objective, ObjectiveConfig
    from mmrl.registry import REWARDS

    cfg = make_config(f"model.path={video_dir}", "train.device=cpu", "task.name=motion_t2v", "diffusion.num_steps=3",
                      "diffusion.guidance_scale=1.0", "algo.loss_type=awm", "train.learning_rate=1e-3")
    policy = DiffusionPolicy(cfg)
    policy.configure_optimizer(cfg.train, 10)
    policy.begin_step(1)
    spec = {"color": "red", "shape": "circle", "direction": "left"}
    examples = [{"prompt": motion_prompt(spec), "spec": spec, "_index": 0}]
    batch = policy.rollout(examples, [examples[0]["prompt"]], 4, "train", need_old_logps=True, need_ref_logps=False)
    assert len(batch.completions) == 4 and all(len(c) == 4 and c[0].size == (16, 16) for c in batch.completions)
    assert torch.isfinite(batch.old_logps).all() and batch.action_mask.shape == (4, 3)
    scores = REWARDS.get("motion")(batch.completions, batch.examples)
    assert all(0.0 <= s <= 1.0 for s in scores)
    batch.advantages = torch.linspace(-1, 1, 4)
    before = [p.detach().clone() for p in policy.transformer.parameters()]
    metrics = policy.train_step(batch, Objective(ObjectiveConfig.from_algo(cfg.algo)),
                                num_tokens=float(batch.action_mask.sum()), num_seqs=4.0)
    assert all(np.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.transformer.parameters()))
