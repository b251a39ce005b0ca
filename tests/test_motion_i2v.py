"""Image-to-video on the tiny video generator (``model.path=tiny-i2v``: the tiny text-to-video weights given
the first frame as Wan 2.2 TI2V conditions) and the ``motion_i2v`` task (examples, prompts, gallery)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import make_config
from mmrl import GenerationPrompt, make_task
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.data.motion_t2v import render_clip
from mmrl.diffusion.conditions import condition_tensor
from mmrl.diffusion.loading import export_generator, load_generator
from mmrl.diffusion.policy import DiffusionPolicy
from mmrl.diffusion.tiny import MARKER
from mmrl.diffusion.tiny_video import new_tiny_video_models, save_tiny_video
from mmrl.measures.motion import GIVEN

SMALL = {"heads": 1, "head_dim": 32, "layers": 1, "patch_size": 4}


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Tiny models: one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def i2v_dir(tmp_path_factory):
    models = new_tiny_video_models(seed=0, **SMALL)
    return save_tiny_video(tmp_path_factory.mktemp("tiny-wan-i2v"), *models,
                           {"prediction": "sample", "conditioning": "first_frame"})


@pytest.fixture(scope="module")
def task():
    return make_task("motion_i2v", train_size=16, eval_size=8)


def _frames(task, n=2):
    examples = [task.examples("train")[i] for i in range(n)]
    return examples, torch.stack([condition_tensor(ex["first_frame"], 16, 16) for ex in examples])


def test_tiny_i2v_is_the_shipped_video_generator_given_first_frames():
    t2v, i2v = load_generator("tiny-t2v", "cpu", torch.float32), load_generator("tiny-i2v", "cpu", torch.float32)
    assert t2v.conditioning is None and i2v.conditioning == "first_frame"
    for (name, a), b in zip(t2v.transformer.state_dict().items(), i2v.transformer.state_dict().values()):
        assert torch.equal(a, b), name
    x = torch.zeros(1, *t2v.latent_shape(16, 16))
    with pytest.raises(ValueError, match="takes no images"):
        t2v.velocity(x, torch.tensor([0.5]), ["a red circle moving left"], 1.0, torch.zeros(1, 3, 16, 16))
    with pytest.raises(ValueError, match="needs"):
        i2v.velocity(x, torch.tensor([0.5]), ["a red circle moving left"], 1.0)


@torch.no_grad()
def test_the_transformer_sees_the_clean_first_frame_at_timestep_0_and_the_clip_ends_on_it(i2v_dir, task):
    pipe = load_generator(str(i2v_dir), "cpu", torch.float32)
    examples, images = _frames(task)
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["hidden_states"].clone(), kwargs["timestep"].clone())),
        with_kwargs=True)
    shape = pipe.latent_shape(16, 16)
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    sigmas = pipe.sigmas(6, shape)
    try:
        for i in range(6):
            x = x + (sigmas[i + 1] - sigmas[i]) * pipe.velocity(x, sigmas[i].expand(2), [e["prompt"] for e in examples],
                                                                2.0, images)
    finally:
        hook.remove()
    hidden, timestep = seen[0]
    assert hidden.shape[0] == 4  # guidance batches [unconditional, conditional], both with the frame
    torch.testing.assert_close(hidden[:, :, 0], (images * 2 - 1).repeat(2, 1, 1, 1))
    tokens_per_frame = (16 // 4) ** 2
    assert timestep.shape == (4, 4 * tokens_per_frame)
    assert (timestep[:, :tokens_per_frame] == 0).all()
    assert torch.allclose(timestep[:, tokens_per_frame:], torch.tensor(float(sigmas[0]) * 1000))
    clips = pipe.decode(x)
    assert (clips[:, 0] - images).abs().max() < 1e-5  # the first frame lands on the given one
    assert (clips[:, 1:] - images[:, None]).abs().max() > 0.1  # the rest is generated


def test_motion_i2v_examples_prompts_and_gallery(task):
    ex = task.examples("eval")[3]
    again = make_task("motion_i2v", train_size=16, eval_size=8).examples("eval")[3]
    clip = render_clip(ex["spec"], np.random.default_rng([32, 3]))
    assert ex["prompt"] == again["prompt"]
    assert np.array_equal(np.asarray(ex["first_frame"]), np.asarray(again["first_frame"]))
    assert np.array_equal(np.asarray(ex["first_frame"]), np.asarray(clip[0]))
    prompt = task.prompt(ex)
    assert isinstance(prompt, GenerationPrompt) and str(prompt) == ex["prompt"] and prompt.image is ex["first_frame"]
    eval_prompts = {e["prompt"] for e in task.examples("eval")}
    assert not eval_prompts & {e["prompt"] for e in task.examples("train")}  # held-out combinations
    assert task.metrics([clip], [ex])["motion_accuracy"] == 1.0
    strip = task.visualize(ex, clip)
    assert strip.getpixel((1, 40)) == GIVEN and strip.getpixel((102, 40)) != GIVEN  # only the given frame is framed


def test_rl_step_exports_and_reloads_as_image_to_video(i2v_dir, task, tmp_path):
    cfg = make_config(f"model.path={i2v_dir}", "train.device=cpu", "task.name=motion_i2v", "diffusion.num_steps=3",
                      "diffusion.eval_num_steps=3", "rollout.batch_size=64", "train.learning_rate=1e-3")
    policy = DiffusionPolicy(cfg)
    policy.configure_optimizer(cfg.train, 10)
    policy.begin_step(1)
    examples = [{**task.examples("train")[i], "_index": i} for i in range(2)]
    prompts = [task.prompt(ex) for ex in examples]
    # Evaluation samples by the ODE: the first frame comes back as given (to the 8-bit rounding of a PNG).
    evaluated = policy.rollout(examples, prompts, 1, "eval")
    for clip, ex in zip(evaluated.completions, examples):
        assert np.abs(np.asarray(clip[0], dtype=np.int16) - np.asarray(ex["first_frame"], dtype=np.int16)).max() <= 1
    # SDE rollouts: the last step's noise lands on the first frame as on every frame (the trajectory the
    # log-probs score keeps it); the clip is decoded with the given frame put back, as diffusers' TI2V does
    batch = policy.rollout(examples, prompts, 2, "train", need_old_logps=True)
    given = torch.stack([condition_tensor(ex["first_frame"], 16, 16) for ex in examples]).repeat_interleave(2, 0)
    assert (batch.payload["latents"][:, -1, :, 0] - (given * 2 - 1)).abs().max() > 1e-2
    for clip, ex in zip(batch.completions, [ex for ex in examples for _ in range(2)]):
        assert np.abs(np.asarray(clip[0], dtype=np.int16) - np.asarray(ex["first_frame"], dtype=np.int16)).max() <= 1
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    assert batch.payload["condition_images"].shape == (4, 3, 16, 16)
    before = {k: v.clone() for k, v in policy.transformer.state_dict().items()}
    metrics = policy.train_step(batch, Objective(ObjectiveConfig.from_algo(policy.cfg.algo)), 12.0, 4.0)
    assert np.isfinite(metrics["loss"])
    assert any(not torch.equal(before[k], v) for k, v in policy.transformer.state_dict().items())
    export_generator(policy, tmp_path / "export")
    assert json.loads((tmp_path / "export" / MARKER).read_text())["conditioning"] == "first_frame"
    assert load_generator(str(tmp_path / "export"), "cpu", torch.float32).conditioning == "first_frame"
