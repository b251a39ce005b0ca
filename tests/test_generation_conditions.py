"""Conditioned generation's contract (image editing, image-to-video): a task's ``GenerationPrompt``
carries an input image; the diffusion policy hands a conditioned pipeline the images at the output
size, one per sample, in every velocity call (sampling, the re-scored log-probs of training), and
refuses a model and a task that do not fit; ``ConditionCache`` encodes each (text, image) pair once.
The real conditioned families are tested in their own files (tests/test_*_generator.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import make_config
from mmrl import GenerationPrompt
from mmrl.diffusion.base import ConditionCache, FlowPipeline
from mmrl.diffusion.conditions import condition_tensor
from mmrl.diffusion.policy import DiffusionPolicy
from mmrl.diffusion.tiny import TinyFlowPipeline, new_tiny_models, save_tiny
from test_diffusion_policy import Spy

SIZE = 16


class ImageConditioned(FlowPipeline):
    """A text-only tiny generator made to depend on an input image (its velocity at the latents
    moved half way towards the image), recording the images it is given."""

    conditioning = "image"

    def __init__(self, inner: TinyFlowPipeline):
        self.inner, self.transformer, self.seen = inner, inner.transformer, []

    def __getattr__(self, name):  # the rest (sigmas, decode, defaults) is the inner generator's
        return getattr(self.__dict__["inner"], name)

    def latent_shape(self, height, width, num_frames=None):
        return self.inner.latent_shape(height, width, num_frames)

    def sigmas(self, num_steps, latent_shape):
        return self.inner.sigmas(num_steps, latent_shape)

    def decode(self, latents):
        return self.inner.decode(latents)

    def velocity(self, latents, sigma, prompts, guidance_scale=1.0, images=None):
        assert images is not None and images.shape == (len(latents), 3, SIZE, SIZE)
        self.seen.append(images.detach().clone())
        return self.inner.velocity(0.5 * (latents + images * 2 - 1), sigma, prompts, guidance_scale)


@pytest.fixture(scope="module")
def generator_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-conditioned")
    return save_tiny(path, *new_tiny_models(seed=0, width=32, layers=1, image_size=SIZE, patch_size=2))


def _image(color, size=20) -> Image.Image:
    return Image.new("RGB", (size, size), color)


def _policy(path, pipe=None, *overrides) -> DiffusionPolicy:
    cfg = make_config(f"model.path={path}", "train.device=cpu", "task.name=composition", "diffusion.num_steps=3",
                      f"diffusion.height={SIZE}", f"diffusion.width={SIZE}", "train.learning_rate=1e-3", *overrides)
    policy = DiffusionPolicy(cfg, pipeline=pipe)
    policy.configure_optimizer(cfg.train, 10)
    policy.begin_step(1)
    return policy


def test_condition_tensor_resizes_to_the_output():
    image = _image((255, 0, 0), size=20)
    t = condition_tensor(image, SIZE, 12)
    assert t.shape == (3, SIZE, 12) and t.dtype == torch.float32
    assert torch.allclose(t[0], torch.ones(SIZE, 12)) and t[1:].abs().max() == 0
    exact = Image.fromarray(np.arange(SIZE * SIZE * 3, dtype=np.uint8).reshape(SIZE, SIZE, 3))
    assert torch.equal(condition_tensor(exact, SIZE, SIZE) * 255, torch.from_numpy(np.asarray(exact, np.float32)).permute(2, 0, 1))


def test_each_sample_gets_its_prompts_image_and_training_rescores_exactly(generator_dir):
    pipe = ImageConditioned(TinyFlowPipeline.from_pretrained(generator_dir))
    policy = _policy(generator_dir, pipe)
    prompts = [GenerationPrompt("a red circle", _image((255, 0, 0))), GenerationPrompt("a red circle", _image((0, 0, 255)))]
    examples = [{"_index": 0}, {"_index": 1}]
    batch = policy.rollout(examples, prompts, 2, "train", need_old_logps=True)
    images = batch.payload["condition_images"]
    assert images.shape == (4, 3, SIZE, SIZE)
    assert torch.equal(images[0], images[1]) and images[0, 0].min() == 1 and images[2, 2].min() == 1
    assert batch.payload["prompts"] == ["a red circle"] * 4
    assert pipe.seen and all(torch.equal(seen, images) for seen in pipe.seen)  # every sampling step
    # the same text with another image is another sample distribution
    assert (batch.payload["latents"][0, -1] - batch.payload["latents"][2, -1]).abs().max() > 1e-3
    pipe.seen.clear()
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    spy = Spy(policy)
    policy.train_step(batch, spy, num_tokens=float(batch.action_mask.sum()), num_seqs=4.0)
    assert spy.calls and pipe.seen  # training re-scored the steps with the images
    for logps, old, _ in spy.calls:
        assert torch.allclose(logps, old, atol=1e-5), (logps - old).abs().max()
    evaluated = policy.rollout(examples, prompts, 1, "eval")
    assert len(evaluated.completions) == 2 and evaluated.completions[0].size == (SIZE, SIZE)


def test_a_model_and_a_task_that_do_not_fit_are_refused(generator_dir):
    text_only = _policy(generator_dir)
    with pytest.raises(ValueError, match=r"generates from text alone.*task 'composition'.*editing or image-to-video"):
        text_only.rollout([{"_index": 0}], [GenerationPrompt("a red circle", _image((255, 0, 0)))], 1, "train")
    text_only.rollout([{"_index": 0}], [GenerationPrompt("a red circle")], 1, "eval")  # no image: text to image
    conditioned = _policy(generator_dir, ImageConditioned(TinyFlowPipeline.from_pretrained(generator_dir)))
    with pytest.raises(ValueError, match=r"needs a source image with every prompt.*task 'composition'"):
        conditioned.rollout([{"_index": 0}], ["a red circle"], 1, "train")


def test_condition_cache_encodes_each_text_and_image_pair_once():
    calls = []

    def encode(texts, images):
        calls.append((list(texts), len(images)))
        return [{"text": torch.tensor([[float(len(t))]]), "image": img.mean().reshape(1, 1)} for t, img in zip(texts, images)]

    cache = ConditionCache(encode)
    red, blue = condition_tensor(_image((255, 0, 0)), 4, 4), condition_tensor(_image((0, 0, 255)), 4, 4)
    out = cache.get(["ab", "ab", "abc"], torch.stack([red, blue, red]))
    assert [c[0] for c in calls] == [["ab"], ["ab"], ["abc"]]  # one pair at a time: never batch-dependent
    assert out["text"].flatten().tolist() == [2.0, 2.0, 3.0] and out["image"].shape == (3, 1)
    again = cache.get(["abc", "ab"], torch.stack([red, blue]))
    assert len(calls) == 3 and cache.hits == 2 and cache.misses == 3
    assert torch.equal(again["text"].flatten(), torch.tensor([3.0, 2.0]))
    with pytest.raises(ValueError, match="2 prompts for 1 condition images"):
        cache.get(["a", "b"], red[None])
