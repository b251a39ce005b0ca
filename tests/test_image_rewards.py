"""Image rewards: weight-free ones (rewards/image.py) and model-based ones (rewards/model_scorers.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.core.reward_computer import RewardComputer
from mmrl.data.shapes_t2i import COLORS, example
from mmrl.registry import REWARDS
from mmrl.rewards import model_scorers
from mmrl.vlm.judge import answer_token_ids
from mmrl.rewards.model_scorers import mlp_from_state_dict, register_scorer

HAS_OPEN_CLIP = importlib.util.find_spec("open_clip") is not None
needs_open_clip = pytest.mark.skipif(not HAS_OPEN_CLIP, reason="open_clip not installed (pip install 'mmrl[clip]')")


def image(pixels) -> Image.Image:
    return Image.fromarray(np.asarray(pixels, dtype=np.uint8))


def noise(seed=0, size=32) -> Image.Image:
    return image(np.random.default_rng(seed).integers(0, 256, (size, size, 3)))


# -- weight-free ----------------------------------------------------------------------------------

def test_jpeg_rewards_match_pil_and_order_images():
    flat, rand = Image.new("RGB", (32, 32), (120, 30, 200)), noise()
    comp, incomp = REWARDS.get("jpeg_compressibility"), REWARDS.get("jpeg_incompressibility")
    c = comp([flat, rand], [{}, {}])
    assert c[0] > c[1]  # flat is more compressible
    buffer = io.BytesIO()
    rand.save(buffer, format="JPEG", quality=95)
    assert c[1] == -buffer.tell() / 1000
    assert incomp([rand], [{}], scale=0.5) == [0.5 * buffer.tell() / 1000]
    assert comp(["text"], [{}]) == [None]


def test_brightness():
    im = image([[[0, 0, 0], [255, 255, 255]], [[255, 0, 0], [51, 51, 51]]])
    mean = (0 + 765 + 255 + 153) / 12 / 255  # = 0.38333...
    brightness = REWARDS.get("brightness")
    assert brightness([im], [{}]) == [pytest.approx(mean)]
    assert brightness([im], [{}], target=0.5) == [pytest.approx(1 - abs(mean - 0.5))]


def test_color_target_hand_computed():
    im = image([[[0, 0, 0], [255, 255, 255]], [[255, 0, 0], [0, 0, 0]]])
    reward = REWARDS.get("color_target")
    # Distances to black: 0, 255*sqrt(3), 255, 0 -> mean / (255 sqrt 3) = (1 + 1/sqrt 3) / 4.
    assert reward([im], [{}], color=[0, 0, 0]) == [pytest.approx(1 - (1 + 1 / math.sqrt(3)) / 4)]
    red = Image.new("RGB", (2, 2), COLORS["red"])
    assert reward([red], [{}], color="red") == [pytest.approx(1.0)]
    # The example's target_color wins over the kwarg; no colour at all is unscorable.
    assert reward([red, red], [{"target_color": [220, 40, 40]}, {}], color="blue")[0] == pytest.approx(1.0)
    assert reward([red], [{}]) == [None]
    with pytest.raises(ValueError, match="unknown colour"):
        reward([red], [{}], color="purple")


def test_reward_computer_scores_images():
    exs = [example(s, max_groups=2) for s in range(3)]
    computer = RewardComputer({"composition": 1.0, "brightness": 0.5})
    total, parts, stats = computer([ex["image"] for ex in exs], exs)
    assert torch.allclose(parts["composition"], torch.ones(3))
    assert torch.allclose(total, 1.0 + 0.5 * parts["brightness"])
    assert stats["reward/composition/unparsable_frac"] == 0


# -- CLIP -----------------------------------------------------------------------------------------

def test_clip_score_errors(tmp_path, monkeypatch):
    clip_score = REWARDS.get("clip_score")
    ims, exs = [noise()], [{"prompt": "a red circle"}]
    with pytest.raises(FileNotFoundError, match=r"task\.reward_kwargs\.clip_score\.pretrained.*downloads nothing"):
        clip_score(ims, exs, model="ViT-B-32")
    with pytest.raises(FileNotFoundError, match=r"task\.reward_kwargs\.clip_score\.pretrained"):
        clip_score(ims, exs, pretrained=str(tmp_path / "missing.pt"))
    ckpt = tmp_path / "clip.pt"
    ckpt.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "open_clip", None)
    with pytest.raises(ImportError, match=r"pip install 'mmrl\[clip\]'"):
        clip_score(ims, exs, pretrained=str(ckpt), device="cpu")


@pytest.mark.slow
@needs_open_clip
def test_clip_score_tiny_model(tiny_clip):
    name, ckpt = tiny_clip
    clip_score = REWARDS.get("clip_score")
    exs = [example(s, max_groups=2) for s in range(4)]
    ims = [ex["image"] for ex in exs]
    kw = dict(model=name, pretrained=str(ckpt), device="cpu")
    a = clip_score(ims + ["text"], exs + [{}], **kw)
    assert a[-1] is None
    assert all(math.isfinite(s) and -1 <= s <= 1 for s in a[:-1])
    model_scorers.clear_cache()  # a fresh load gives the same scores
    assert clip_score(ims, exs, **kw) == a[:-1]
    assert clip_score(ims, exs, scale=2.0, **kw) == [pytest.approx(2 * s) for s in a[:-1]]


# -- learned scorers ------------------------------------------------------------------------------

def test_image_scorer_registry(tmp_path):
    loads = []

    @register_scorer("test_redness")
    def load_redness(path, device):
        loads.append(path)
        return lambda images, prompts: [np.asarray(im, dtype=float)[..., 0].mean() / 255 for im in images]

    scorer = REWARDS.get("image_scorer")
    ims = [Image.new("RGB", (4, 4), (255, 0, 0)), Image.new("RGB", (4, 4), (51, 0, 0))]
    kw = dict(scorer="test_redness", path=str(tmp_path), device="cpu")
    assert scorer(ims + [None], [{}] * 3, **kw) == [pytest.approx(1.0), pytest.approx(0.2), None]
    assert scorer(ims, [{}] * 2, scale=2.0, **kw) == [pytest.approx(2.0), pytest.approx(0.4)]
    assert len(loads) == 1  # loaded once, then cached
    with pytest.raises(ValueError, match="aesthetic_mlp.*test_redness"):
        scorer(ims, [{}] * 2, scorer="nope", path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"task\.reward_kwargs\.image_scorer\.path"):
        scorer(ims, [{}] * 2, scorer="test_redness", path=str(tmp_path / "missing"))


class _LaionMLP(torch.nn.Module):
    """The LAION improved-aesthetic-predictor layout (state_dict keys ``layers.<i>.*``), smaller."""

    def __init__(self, dim=16):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(dim, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 4),
                                          torch.nn.Linear(4, 1))

    def forward(self, x):
        return self.layers(x)


def test_mlp_from_state_dict():
    torch.manual_seed(0)
    x = torch.randn(5, 16)
    laion = _LaionMLP().eval()
    head = mlp_from_state_dict(laion.state_dict())
    assert torch.allclose(head(x), laion(x))
    linear = torch.nn.Linear(16, 1)
    assert torch.allclose(mlp_from_state_dict(linear.state_dict())(x), linear(x))
    relu = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    assert torch.allclose(mlp_from_state_dict(relu.state_dict(), "relu")(x), relu(x))
    with pytest.raises(ValueError, match="Sequential"):
        mlp_from_state_dict({"encoder.weight": torch.zeros(2, 2), "head.0.weight": torch.zeros(1, 2)})


@pytest.mark.slow
@needs_open_clip
def test_aesthetic_mlp_scorer(tiny_clip, tmp_path):
    name, ckpt = tiny_clip
    torch.manual_seed(1)
    mlp = _LaionMLP().eval()
    torch.save(mlp.state_dict(), tmp_path / "head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"clip_model": name, "clip_pretrained": str(ckpt)}))
    ims = [ex["image"] for ex in (example(s) for s in range(3))]
    scores = REWARDS.get("image_scorer")(ims, [{}] * 3, scorer="aesthetic_mlp", path=str(tmp_path), device="cpu")
    clip = model_scorers.load_clip(name, ckpt, torch.device("cpu"))
    with torch.no_grad():
        expected = mlp(clip.embed_images(ims))[:, 0].tolist()
    assert scores == pytest.approx(expected)


# -- VLM judge ------------------------------------------------------------------------------------

def test_vlm_judge_tiny():
    judge = REWARDS.get("vlm_judge")
    exs = [example(s, max_groups=2) for s in range(3)]
    ims = [ex["image"] for ex in exs]
    a = judge(ims + ["text"], exs + [{}], path="tiny", device="cpu")
    assert len(a) == 4 and a[-1] is None
    assert all(math.isfinite(s) and 0 <= s <= 1 for s in a[:3])
    assert judge(ims, exs, path="tiny", device="cpu", batch_size=1) == pytest.approx(a[:3], abs=1e-5)
    assert judge(ims, exs, path="tiny", device="cpu") == a[:3]
    tokenizer = next(v for k, v in model_scorers._CACHE.items() if k[0] == "vlm_judge").processor.tokenizer
    yes, no = answer_token_ids(tokenizer, "yes"), answer_token_ids(tokenizer, "no")
    assert yes and no and not set(yes) & set(no)


def test_vlm_judge_missing_path(tmp_path):
    judge = REWARDS.get("vlm_judge")
    with pytest.raises(FileNotFoundError, match=r"task\.reward_kwargs\.vlm_judge\.path"):
        judge([noise()], [{}], path=None)
    with pytest.raises(FileNotFoundError, match=r"task\.reward_kwargs\.vlm_judge\.path"):
        judge([noise()], [{}], path=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"task\.reward_kwargs\.vlm_judge\.path.*config\.json"):
        judge([noise()], [{}], path=str(tmp_path))  # exists but is no checkpoint


def test_model_reward_misconfiguration_stops_the_run_at_setup(tmp_path):
    """A missing weights path is a config error when the RewardComputer is built, not a batch
    scored at the minimum on every step."""
    from mmrl.core.reward_computer import RewardComputer

    with pytest.raises(FileNotFoundError, match="task.reward_kwargs.clip_score.pretrained"):
        RewardComputer({"clip_score": 1.0}, {"clip_score": {"pretrained": str(tmp_path / "missing.bin")}})
    with pytest.raises(ValueError, match="unknown scorer"):
        RewardComputer({"image_scorer": 1.0}, {"image_scorer": {"scorer": "nope", "path": str(tmp_path)}})
    RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": {"path": "tiny"}})  # the shipped tiny VLM is fine
