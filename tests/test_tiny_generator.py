"""The tiny generator's own pieces: x-prediction, caption noise, EMA, and a pretraining round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.data.shapes_t2i import COUNT_WORDS, caption_noise_rates, example, mislabel, sample_spec
from mmrl.diffusion.pretrain import pretrain_tiny_generator, update_ema
from mmrl.diffusion.tiny import MARKER, SIGMA_FLOOR, TinyFlowPipeline, new_tiny_models, tiny_configs


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Tiny models: one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def x_pipe():
    models = new_tiny_models(seed=0, width=32, layers=1, image_size=16, patch_size=2)
    return TinyFlowPipeline(*models, {"prediction": "sample", "height": 16, "width": 16})


def _embeds(pipe, n):
    return {k: v.detach() for k, v in pipe.encode_text(["a red circle"] * n).items()}


@torch.no_grad()
def test_x_prediction_velocity_is_x_minus_x0_over_sigma(x_pipe):
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.3, 0.01])  # the last one is clipped to SIGMA_FLOOR
    embeds = _embeds(x_pipe, 3)
    x0 = x_pipe.transformer(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=embeds["hidden"],
                            pooled_projections=embeds["pooled"], return_dict=False)[0]
    v = x_pipe.velocity_from_embeds(x, sigma, embeds)
    denom = torch.tensor([0.9, 0.3, SIGMA_FLOOR]).view(-1, 1, 1, 1)
    torch.testing.assert_close(v, (x - x0) / denom)
    # One Euler step to sigma 0 lands exactly on the predicted clean image (hand identity:
    # x + (0 - s) (x - x0) / s = x0).
    step = x[:2] + (0 - sigma[:2].view(-1, 1, 1, 1)) * v[:2]
    torch.testing.assert_close(step, x0[:2])


def test_unknown_prediction_is_refused():
    with pytest.raises(ValueError, match="prediction"):
        TinyFlowPipeline(*new_tiny_models(seed=0, width=32, layers=1), {"prediction": "epsilon"})
    with pytest.raises(ValueError, match="multiple of patch_size"):
        tiny_configs(image_size=18, patch_size=4)


def test_mislabel_changes_exactly_the_claims_it_draws():
    rng = np.random.default_rng(0)
    for _ in range(200):
        spec = sample_spec(rng, max_groups=2)
        assert mislabel(spec, rng) == spec  # no noise: the truth
        said = mislabel(spec, rng, count_prob=1.0, position_prob=1.0)
        for g, s in zip(spec, said):
            assert s["count"] != g["count"] and s["count"] in COUNT_WORDS
            assert s["color"] == g["color"] and s["shape"] == g["shape"]
        sides = [s["position"] for s in said if s["position"] is not None]
        assert len(sides) == len(set(sides))  # two groups never claim the same side
        if len(spec) == 1:
            assert said[0]["position"] != spec[0]["position"]


@pytest.mark.slow
def test_caption_noise_rate_and_image_truth():
    noisy = [example(np.random.default_rng([7, i]), size=16, caption_noise=0.5) for i in range(400)]
    clean = [example(np.random.default_rng([7, i]), size=16) for i in range(400)]
    # the image and its true spec do not depend on the caption noise
    assert all(n["spec"] == c["spec"] and np.array_equal(np.array(n["image"]), np.array(c["image"]))
               for n, c in zip(noisy, clean))
    wrong_count = np.mean([COUNT_WORDS[n["spec"][0]["count"]] not in n["prompt"].split()
                           and not (n["spec"][0]["count"] == 1 and n["prompt"].startswith("a "))
                           for n in noisy])
    assert 0.4 < wrong_count < 0.6


def test_colour_mislabel_keeps_groups_distinct_and_rate():
    rng = np.random.default_rng(1)
    for _ in range(200):
        spec = sample_spec(rng, max_groups=2)
        said = mislabel(spec, rng, color_prob=1.0)
        for g, s in zip(spec, said):
            assert s["color"] != g["color"]
            assert (s["count"], s["shape"], s["position"]) == (g["count"], g["shape"], g["position"])
        assert len({s["color"] for s in said}) == len(said)  # the checker counts objects per colour
    noisy = [example(np.random.default_rng([3, i]), size=16, caption_noise={"color": 0.5}) for i in range(400)]
    wrong = np.mean([n["spec"][0]["color"] not in n["prompt"].split() for n in noisy])
    assert 0.4 < wrong < 0.6
    # a number keeps its old meaning (count and side); a mapping names attributes
    assert caption_noise_rates(0.3) == {"count": 0.3, "position": 0.3, "color": 0.0}
    with pytest.raises(ValueError, match="unknown attribute"):
        caption_noise_rates({"colour": 0.5})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        caption_noise_rates({"color": 1.5})


def test_update_ema_hand_value():
    ema, params = [torch.tensor([1.0, 0.0])], [torch.tensor([3.0, 10.0])]
    update_ema(ema, params, 0.9)
    torch.testing.assert_close(ema[0], torch.tensor([1.2, 1.0]))  # 0.9 * 1 + 0.1 * 3; 0.1 * 10


def test_pretrain_round_trip_records_the_recipe(tmp_path):
    torch.manual_seed(0)
    out = pretrain_tiny_generator(tmp_path / "g", steps=3, batch_size=4, dataset_size=8, log_every=0, width=32,
                                  layers=1, image_size=16, patch_size=2, prediction="sample", caption_noise=0.5,
                                  ema_decay=0.99)
    info = json.loads((out / MARKER).read_text())
    assert (info["height"], info["width"], info["prediction"]) == (16, 16, "sample")
    assert info["pretrain"]["caption_noise"] == 0.5 and info["pretrain"]["ema_decay"] == 0.99
    pipe = TinyFlowPipeline.from_pretrained(out)
    assert pipe.prediction == "sample" and pipe.latent_shape(16, 16) == (3, 16, 16)


def _json(path):
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if k not in ("_diffusers_version", "transformers_version", "_name_or_path")}


def _loaded_config(auto, path):
    return {k: v for k, v in auto.from_pretrained(str(path)).to_dict().items()
            if k not in ("transformers_version", "_name_or_path")}


# (build-tiny modality, shipped asset, the recipe's name in mmrl.diffusion.pretrain, the builder there)
SHIPPED = {"diffusion": ("tiny-flow-shapes", "TINY_GENERATOR_RECIPE", "pretrain_tiny_generator"),
           "video-gen": ("tiny-wan-motion", "TINY_VIDEO_GENERATOR_RECIPE", "pretrain_tiny_video_generator")}


@pytest.mark.parametrize("modality", sorted(SHIPPED))
def test_shipped_generator_is_what_build_tiny_makes(modality, tmp_path, monkeypatch):
    """``mmrl build-tiny diffusion`` (``video-gen``) builds what the shipped asset is: the same
    recorded recipe, the same model configs, tokenizer and scheduler, and weights of the same names
    and shapes. So a rebuild reproduces what training starts from (and the recipe constant is the
    recipe the asset was built with). The real builder runs, shrunk to 2 steps of 4 samples drawn
    from 16 (the assets: thousands of steps of 64 from 20,000); everything else comes from the command."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from mmrl.assets import asset_path
    from mmrl.cli import app
    from mmrl.diffusion import pretrain

    asset, recipe_name, builder = SHIPPED[modality]
    recipe = getattr(pretrain, recipe_name)
    real = getattr(pretrain, builder)
    small = {"batch_size": 4, "dataset_size": 16}
    monkeypatch.setattr(pretrain, builder, lambda out, **kw: real(out, **{**kw, **small}))
    shipped = asset_path(asset)
    result = CliRunner().invoke(app, ["build-tiny", modality, "--out", str(tmp_path), "--steps", "2"])
    assert result.exit_code == 0, (result.output, result.exception)
    info, built = json.loads((shipped / MARKER).read_text()), json.loads((tmp_path / MARKER).read_text())
    recorded = {**info["pretrain"], "prediction": info["prediction"]}  # prediction is top-level: the pipeline reads it
    assert {k: recorded[k] for k in recipe} == recipe
    assert built["pretrain"] == {**info["pretrain"], "steps": 2, **small}
    assert {k: v for k, v in built.items() if k != "pretrain"} == {k: v for k, v in info.items() if k != "pretrain"}
    for part in ("transformer/config.json", "tokenizer/tokenizer.json", "scheduler/scheduler_config.json"):
        assert _json(tmp_path / part) == _json(shipped / part), part
    # the text encoder's config as transformers reads it: a key a newer transformers writes with its
    # default (5.24's scale_decoder_outputs) is not a difference of the rebuild
    from transformers import AutoConfig

    assert _loaded_config(AutoConfig, tmp_path / "text_encoder") == _loaded_config(AutoConfig, shipped / "text_encoder")
    for weights in ("transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"):
        a, b = load_file(str(tmp_path / weights)), load_file(str(shipped / weights))
        assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}, weights
