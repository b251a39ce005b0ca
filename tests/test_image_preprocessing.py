"""Image preprocessing through transformers' torchvision backend on the training device
(``vlm.image_processor_backend``): the same grids and tokens as the PIL backend, pixel values
within a stated tolerance, and PIL on a CPU unless asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import make_config
from mmrl.vlm.processing import VLMProcessor, choose_image_backend, torchvision_available

needs_torchvision = pytest.mark.skipif(not torchvision_available(), reason="needs torchvision (mmrl[video])")
TINY = "assets/tiny-qwen2.5-vl"
# Pixel values are normalised (about -1.8 .. 2.1); the two backends' bicubic resizes differ by
# at most this much on these images (PIL rounds its resize to uint8, torchvision keeps float).
CPU_TOLERANCE = 0.05
# On a GPU transformers' resize kernel differs a little more (0.38 measured on ~1 MP photos).
GPU_TOLERANCE = 0.5


def _odd_images():
    rng = np.random.default_rng(0)
    sizes = [(640, 427), (333, 500), (97, 61)]  # (width, height): odd sizes and aspect ratios
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _encode(processor):
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text", "text": "count"}]}])
    images = _odd_images()
    return processor([text] * len(images), [[im] for im in images])


def test_auto_is_pil_on_a_cpu_and_unknown_backends_are_refused():
    assert choose_image_backend("auto", torch.device("cpu")) == ("pil", None)
    assert choose_image_backend("pil", torch.device("cuda")) == ("pil", None)
    with pytest.raises(ValueError, match="vlm.image_processor_backend='opencv'"):
        choose_image_backend("opencv", torch.device("cpu"))


def test_torchvision_without_torchvision_is_a_clear_error(monkeypatch):
    import mmrl.vlm.processing as processing

    monkeypatch.setattr(processing, "torchvision_available", lambda: False)
    with pytest.raises(ValueError, match=r"needs torchvision.*\[video\]"):
        choose_image_backend("torchvision", torch.device("cpu"))
    assert choose_image_backend("auto", torch.device("cuda")) == ("pil", None)


@needs_torchvision
def test_torchvision_backend_matches_pil():
    pil = _encode(VLMProcessor.from_pretrained(TINY, backend="pil"))
    tv = _encode(VLMProcessor.from_pretrained(TINY, backend="torchvision", device=torch.device("cpu")))
    assert torch.equal(pil["image_grid_thw"], tv["image_grid_thw"])
    assert torch.equal(pil["input_ids"], tv["input_ids"])  # same number of image tokens per image
    assert pil["pixel_values"].shape == tv["pixel_values"].shape
    diff = (pil["pixel_values"] - tv["pixel_values"]).abs()
    assert 0 < diff.max() <= CPU_TOLERANCE, float(diff.max())  # really two resizes, and close


@needs_torchvision
def test_a_policy_preprocesses_with_the_configured_backend():
    from mmrl.vlm.policy import VLMPolicy

    tv = VLMPolicy(make_config("train.device=cpu", "vlm.image_processor_backend=torchvision"))
    assert type(tv.processor.image_processor).__name__ == "Qwen2VLImageProcessor"
    assert tv.processor.device == torch.device("cpu")
    pil = VLMPolicy(make_config("train.device=cpu"))
    assert type(pil.processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    prompt = [{"role": "user", "content": [{"type": "image", "image": _odd_images()[0]},
                                           {"type": "text", "text": "How many?"}]}]
    a, _ = pil.encode_prompts([prompt])
    b, _ = tv.encode_prompts([prompt])
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert (a["pixel_values"] - b["pixel_values"]).abs().max() <= CPU_TOLERANCE


@pytest.mark.gpu
@needs_torchvision
def test_preprocessing_on_the_gpu_matches_the_cpu():
    cpu = _encode(VLMProcessor.from_pretrained(TINY, backend="pil"))
    gpu = _encode(VLMProcessor.from_pretrained(TINY, backend="torchvision", device=torch.device("cuda")))
    assert gpu["pixel_values"].is_cuda
    assert torch.equal(cpu["image_grid_thw"], gpu["image_grid_thw"])
    assert (cpu["pixel_values"] - gpu["pixel_values"].cpu()).abs().max() <= GPU_TOLERANCE
