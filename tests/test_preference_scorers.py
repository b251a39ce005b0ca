"""PickScore and HPSv2 as ``image_scorer``s (rewards/preference_scorers.py): tiny random versions of
each architecture saved in the reference's local layout, loaded by the scorer; the preprocessing
against the reference's own transform on the same image, the score against the paper's formula
worked on the tiny model's embeddings."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.registry import REWARDS
from mmrl.rewards import model_scorers
from mmrl.rewards.preference_scorers import OPENAI_MEAN, OPENAI_STD, hps_preprocess

PROMPTS = ["a red square", "two cats", "a cat on a mat"]


def images():
    """Non-square images, so resizing, cropping and padding all matter."""
    rng = np.random.default_rng(0)
    sizes = [(48, 40), (30, 50), (64, 64)]  # (width, height)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def score(scorer, path, ims=None, prompts=PROMPTS):
    model_scorers.clear_cache()
    return REWARDS.get("image_scorer")(ims or images(), [{"prompt": p} for p in prompts], scorer=scorer,
                                       path=str(path), device="cpu")


# -- PickScore --------------------------------------------------------------------------------------

def bytes_to_unicode() -> list[str]:
    """GPT-2/CLIP's byte-to-character table (its printable characters stand for themselves)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


@pytest.fixture(scope="module")
def tiny_pickscore(tmp_path_factory):
    """A random tiny transformers CLIPModel saved as a PickScore_v1 snapshot, its processor (a
    character-level CLIP tokenizer; the laion image processor's settings at 32 px) in processor/."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    folder = tmp_path_factory.mktemp("pickscore")
    chars = bytes_to_unicode()
    vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                         resample=3, image_mean=list(OPENAI_MEAN), image_std=list(OPENAI_STD))
    image_processor.save_pretrained(folder / "processor")  # the hub's layout: preprocessor_config.json,
    tokenizer.save_pretrained(folder / "processor")  # tokenizer files beside it
    eos = vocab["<|endoftext|>"]
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=eos, pad_token_id=eos),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                           num_attention_heads=2),
        projection_dim=16, logit_scale_init_value=2.5)
    torch.manual_seed(0)
    CLIPModel(config).eval().save_pretrained(folder)
    return folder


def test_pickscore_matches_the_formula_on_the_processors_inputs(tiny_pickscore):
    """The reference (PickScore's README): pixels and tokens from CLIPProcessor (texts padded and
    truncated to 77), unit-norm embeddings, ``logit_scale.exp() * text_emb @ image_emb.T``; here
    each image with its own prompt, the diagonal."""
    from transformers import CLIPModel, CLIPProcessor

    processor = CLIPProcessor.from_pretrained(tiny_pickscore / "processor")
    model = CLIPModel.from_pretrained(tiny_pickscore).eval()
    ims = images()
    pixels = processor(images=ims, return_tensors="pt")["pixel_values"]
    assert pixels.shape == (3, 3, 32, 32)
    # the laion processor's transform written out: shortest side to 32 (bicubic), centre crop, OpenAI norm
    w, h = ims[0].size  # 48 x 40 -> 38 x 32 (transformers rounds the long side), crop columns 3..35
    resized = np.asarray(ims[0].resize((38, 32), Image.BICUBIC), dtype=np.float32)[:, 3:35] / 255
    by_hand = (resized - np.array(OPENAI_MEAN, dtype=np.float32)) / np.array(OPENAI_STD, dtype=np.float32)
    assert pixels[0].permute(1, 2, 0).numpy() == pytest.approx(by_hand, abs=2e-2)  # PIL vs transformers' resize

    text = processor(text=PROMPTS, padding=True, truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        img = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
        txt = model.get_text_features(**text).pooler_output.numpy()
    scale = float(np.exp(2.5))  # logit_scale_init_value, saved with the model
    expected = [scale * float(i @ t) / float(np.linalg.norm(i) * np.linalg.norm(t)) for i, t in zip(img, txt)]
    assert score("pickscore", tiny_pickscore) == pytest.approx(expected, rel=1e-5)
    assert len(set(np.round(expected, 6))) == 3  # the tiny model tells the pairs apart


def test_pickscore_layout_errors(tiny_pickscore, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json.*PickScore_v1"):
        score("pickscore", tmp_path)
    (tmp_path / "config.json").write_text((tiny_pickscore / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"preprocessor_config.json.*processor.*image_scorer\.path"):
        score("pickscore", tmp_path)


# -- HPSv2 ------------------------------------------------------------------------------------------

def hpsv2_reference_transform(image, size):
    """HPSv2's preprocess_val written out (the hpsv2 package is not installed): its open_clip fork's
    ``image_transform(size, is_train=False, resize_longest_max=True)`` = convert RGB, ToTensor,
    ``ResizeMaxSize(size, fill=0)``, Normalize(OpenAI mean, std); ResizeMaxSize's forward as in
    tgxs002/HPSv2 hpsv2/src/open_clip/transform.py."""
    from torchvision.transforms import Compose, InterpolationMode, Normalize, ToTensor
    from torchvision.transforms import functional as F

    def resize_max_size(img):
        height, width = img.shape[1:]
        scale = size / float(max(height, width))
        if scale != 1.0:
            new_size = tuple(round(dim * scale) for dim in (height, width))
            img = F.resize(img, new_size, InterpolationMode.BICUBIC)
            pad_h = size - new_size[0]
            pad_w = size - new_size[1]
            img = F.pad(img, padding=[pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
        return img

    return Compose([lambda im: im.convert("RGB"), ToTensor(), resize_max_size,
                    Normalize(mean=OPENAI_MEAN, std=OPENAI_STD)])(image)


def test_hps_preprocess_is_hpsv2s_transform():
    pytest.importorskip("torchvision")  # an optional dependency (open_clip brings it)
    for im in images():
        assert torch.equal(hps_preprocess(im, 32), hpsv2_reference_transform(im, 32))
    # 48 x 40 -> 32 x 27 (round(40 * 32 / 48) = 27): rows 0..1 and 29..31 are the zero padding, normalised
    x = hps_preprocess(images()[0], 32)
    pad = (-torch.tensor(OPENAI_MEAN) / torch.tensor(OPENAI_STD))[:, None]
    assert torch.allclose(x[:, 0, :], pad.expand(3, 32)) and torch.allclose(x[:, 31, :], pad.expand(3, 32))
    assert not torch.allclose(x[:, 2, :], pad.expand(3, 32))
    # a square image already at the size is only normalised
    im = Image.new("RGB", (32, 32), (255, 0, 0))
    assert hps_preprocess(im, 32)[:, 5, 5].tolist() == pytest.approx(
        [(1 - OPENAI_MEAN[0]) / OPENAI_STD[0], -OPENAI_MEAN[1] / OPENAI_STD[1], -OPENAI_MEAN[2] / OPENAI_STD[2]])


@pytest.fixture
def tiny_hps(tiny_clip, tmp_path):
    """The tiny open_clip model's weights saved as xswu/HPSv2 publishes them (``{"state_dict": ...}``
    in HPS_v2.1_compressed.pt), config.json naming the tiny architecture."""
    name, ckpt = tiny_clip
    torch.save({"state_dict": torch.load(ckpt, weights_only=True)}, tmp_path / "HPS_v2.1_compressed.pt")
    (tmp_path / "config.json").write_text(json.dumps({"clip_model": name}))
    return name, tmp_path


@pytest.mark.slow
def test_hpsv2_is_the_cosine_of_the_reference_embeddings(tiny_hps):
    """The reference (img_score.py): ``model(image, text)`` with output_dict gives unit-norm
    features; the score is ``diag(image_features @ text_features.T)``."""
    import open_clip

    name, folder = tiny_hps
    model = open_clip.create_model(name)
    model.load_state_dict(torch.load(folder / "HPS_v2.1_compressed.pt", weights_only=True)["state_dict"])
    model.eval()
    ims = images()
    pixels = torch.stack([hpsv2_reference_transform(im, 32) for im in ims])
    with torch.no_grad():
        img = model.encode_image(pixels).numpy()
        txt = model.encode_text(open_clip.get_tokenizer(name)(PROMPTS)).numpy()
    expected = [float(i @ t) / float(np.linalg.norm(i) * np.linalg.norm(t)) for i, t in zip(img, txt)]
    assert score("hpsv2", folder) == pytest.approx(expected, abs=1e-5)
    assert score("hpsv2", folder / "HPS_v2.1_compressed.pt") == pytest.approx(expected, abs=1e-5)  # the file itself
    assert len(set(np.round(expected, 6))) == 3


@pytest.mark.slow
def test_hpsv2_layout_errors(tiny_hps):
    _, folder = tiny_hps
    (folder / "HPS_v2_compressed.pt").write_bytes((folder / "HPS_v2.1_compressed.pt").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"one HPS_v2\*\.pt.*HPS_v2.1_compressed.pt.*image_scorer\.path"):
        score("hpsv2", folder)


# -- ImageReward -----------------------------------------------------------------------------------

TINY_VIT = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64}
TINY_MED = {"hidden_act": "gelu", "hidden_size": 24, "intermediate_size": 48, "layer_norm_eps": 1e-12,
            "max_position_embeddings": 40, "num_attention_heads": 2, "num_hidden_layers": 2, "pad_token_id": 0,
            "vocab_size": 40, "encoder_width": 32, "add_cross_attention": True}
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "square", "two", "cats", "cat", "on", "mat"]


def reference_state_dict(seed=0) -> dict:
    """Random weights under ImageReward.pt's names and shapes (BLIP_Pretrain's visual_encoder, a
    med.py BertModel with cross-attention, ImageReward's MLP), the tiny sizes above."""
    g = torch.Generator().manual_seed(seed)
    D, V, H, F = TINY_VIT["hidden_size"], TINY_MED["hidden_size"], TINY_MED["intermediate_size"], 64
    n = (32 // 8) ** 2 + 1
    shapes = {"blip.visual_encoder.cls_token": (1, 1, D), "blip.visual_encoder.pos_embed": (1, n, D),
              "blip.visual_encoder.patch_embed.proj.weight": (D, 3, 8, 8),
              "blip.visual_encoder.patch_embed.proj.bias": (D,),
              "blip.visual_encoder.norm.weight": (D,), "blip.visual_encoder.norm.bias": (D,),
              "blip.text_encoder.embeddings.word_embeddings.weight": (40, V),
              "blip.text_encoder.embeddings.position_embeddings.weight": (40, V),
              "blip.text_encoder.embeddings.LayerNorm.weight": (V,),
              "blip.text_encoder.embeddings.LayerNorm.bias": (V,),
              "blip.vision_proj.weight": (8, D), "blip.vision_proj.bias": (8,),
              "blip.text_proj.weight": (8, V), "blip.text_proj.bias": (8,)}
    for i in range(2):
        b = f"blip.visual_encoder.blocks.{i}."
        shapes.update({b + "norm1.weight": (D,), b + "norm1.bias": (D,), b + "attn.qkv.weight": (3 * D, D),
                       b + "attn.qkv.bias": (3 * D,), b + "attn.proj.weight": (D, D), b + "attn.proj.bias": (D,),
                       b + "norm2.weight": (D,), b + "norm2.bias": (D,), b + "mlp.fc1.weight": (F, D),
                       b + "mlp.fc1.bias": (F,), b + "mlp.fc2.weight": (D, F), b + "mlp.fc2.bias": (D,)})
        t = f"blip.text_encoder.encoder.layer.{i}."
        for att, width in (("attention", V), ("crossattention", D)):
            shapes.update({t + f"{att}.self.query.weight": (V, V), t + f"{att}.self.query.bias": (V,),
                           t + f"{att}.self.key.weight": (V, width), t + f"{att}.self.key.bias": (V,),
                           t + f"{att}.self.value.weight": (V, width), t + f"{att}.self.value.bias": (V,),
                           t + f"{att}.output.dense.weight": (V, V), t + f"{att}.output.dense.bias": (V,),
                           t + f"{att}.output.LayerNorm.weight": (V,), t + f"{att}.output.LayerNorm.bias": (V,)})
        shapes.update({t + "intermediate.dense.weight": (H, V), t + "intermediate.dense.bias": (H,),
                       t + "output.dense.weight": (V, H), t + "output.dense.bias": (V,),
                       t + "output.LayerNorm.weight": (V,), t + "output.LayerNorm.bias": (V,)})
    # ImageReward's MLP(input): Linears at 0, 2, 4, 6, 7, Dropouts at 1, 3, 5
    for i, (o, k) in zip((0, 2, 4, 6, 7), ((16, V), (8, 16), (4, 8), (2, 4), (1, 2))):
        shapes.update({f"mlp.layers.{i}.weight": (o, k), f"mlp.layers.{i}.bias": (o,)})
    state = {k: 0.3 * torch.randn(s, generator=g) for k, s in shapes.items()}
    for k in state:
        if re.search(r"(norm\d?|LayerNorm)\.weight$", k):
            state[k] = 1 + 0.1 * state[k]
    state["blip.text_encoder.embeddings.position_ids"] = torch.arange(40)[None]  # a buffer older checkpoints hold
    return state


@pytest.fixture
def tiny_image_reward(tmp_path):
    pytest.importorskip("torchvision")
    from transformers import BertTokenizer

    torch.save(reference_state_dict(), tmp_path / "ImageReward.pt")
    (tmp_path / "med_config.json").write_text(json.dumps(TINY_MED))
    (tmp_path / "vision_config.json").write_text(json.dumps(TINY_VIT))
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path / "tokenizer")
    return tmp_path


def reference_image_reward(state, pixels, ids, mask):
    """ImageReward.score's forward written out from THUDM/ImageReward (the package is not installed):
    BLIP's ViT (models/BLIP/vit.py: pre-norm blocks, LayerNorm eps 1e-6), its BertModel (med.py:
    post-norm layers, self-attention with the -10000 extended mask, cross-attention to every image
    state), the [CLS] state through the MLP, standardised."""
    import torch.nn.functional as F

    def ln(x, prefix, eps):
        return F.layer_norm(x, x.shape[-1:], state[prefix + ".weight"], state[prefix + ".bias"], eps)

    def lin(x, prefix):
        return F.linear(x, state[prefix + ".weight"], state[prefix + ".bias"])

    def heads(x, h=2):
        return x.reshape(x.shape[0], x.shape[1], h, -1).transpose(1, 2)

    v = "blip.visual_encoder."
    x = F.conv2d(pixels, state[v + "patch_embed.proj.weight"], state[v + "patch_embed.proj.bias"], stride=8)
    x = torch.cat([state[v + "cls_token"].expand(len(pixels), 1, -1), x.flatten(2).transpose(1, 2)], 1)
    x = x + state[v + "pos_embed"]
    for i in range(2):
        b = f"{v}blocks.{i}."
        B, N, C = x.shape
        qkv = lin(ln(x, b + "norm1", 1e-6), b + "attn.qkv").reshape(B, N, 3, 2, C // 2).permute(2, 0, 3, 1, 4)
        attn = ((qkv[0] @ qkv[1].transpose(-2, -1)) * (C // 2) ** -0.5).softmax(-1)
        x = x + lin((attn @ qkv[2]).transpose(1, 2).reshape(B, N, C), b + "attn.proj")
        x = x + lin(F.gelu(lin(ln(x, b + "norm2", 1e-6), b + "mlp.fc1")), b + "mlp.fc2")
    image = ln(x, v + "norm", 1e-6)

    t = "blip.text_encoder."
    h = state[t + "embeddings.word_embeddings.weight"][ids] + state[t + "embeddings.position_embeddings.weight"][
        torch.arange(ids.shape[1])]
    h = ln(h, t + "embeddings.LayerNorm", 1e-12)
    extended = (1.0 - mask[:, None, None, :].float()) * -10000.0
    for i in range(2):
        L = f"{t}encoder.layer.{i}."
        for att, source, bias in (("attention", h, extended), ("crossattention", image, 0.0)):
            q, k, val = (heads(lin(s, f"{L}{att}.self.{n}")) for n, s in (("query", h), ("key", source),
                                                                          ("value", source)))
            probs = ((q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5) + bias).softmax(-1)
            ctx = (probs @ val).transpose(1, 2).reshape(h.shape)
            h = ln(lin(ctx, f"{L}{att}.output.dense") + h, f"{L}{att}.output.LayerNorm", 1e-12)
        h = ln(lin(F.gelu(lin(h, L + "intermediate.dense")), L + "output.dense") + h, L + "output.LayerNorm", 1e-12)
    r = h[:, 0]
    for i in (0, 2, 4, 6, 7):
        r = lin(r, f"mlp.layers.{i}")
    return ((r[:, 0] - 0.16717362830052426) / 1.0333394966054072).tolist()


def test_image_reward_transform_is_the_references():
    pytest.importorskip("torchvision")
    """ImageReward.py's _transform(n_px) written out: shortest side to 32 (torchvision's Resize on a
    PIL image: the long side int(32 * long / short), PIL bicubic), centre crop, RGB, [0, 1], OpenAI norm."""
    from mmrl.rewards.image_reward import image_reward_transform

    im = images()[0]  # 48 x 40 -> 38 x 32, crop columns round((38 - 32) / 2) = 3 .. 35
    by_hand = np.asarray(im.resize((38, 32), Image.BICUBIC), dtype=np.float32)[:, 3:35] / 255
    by_hand = (by_hand - np.array(OPENAI_MEAN, dtype=np.float32)) / np.array(OPENAI_STD, dtype=np.float32)
    assert image_reward_transform(32)(im).permute(1, 2, 0).numpy() == pytest.approx(by_hand, abs=1e-6)


def test_image_reward_matches_the_reference_forward(tiny_image_reward):
    from transformers import BertTokenizer

    from mmrl.rewards.image_reward import image_reward_transform

    tokenizer = BertTokenizer.from_pretrained(tiny_image_reward / "tokenizer")
    tokens = tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert tokens["input_ids"].shape == (3, 35)
    assert tokens["input_ids"][0, :4].tolist() == [2, 5, 6, 7]  # [CLS] a red square
    pixels = torch.stack([image_reward_transform(32)(im) for im in images()])
    expected = reference_image_reward(torch.load(tiny_image_reward / "ImageReward.pt", weights_only=True), pixels,
                                      tokens["input_ids"], tokens["attention_mask"])
    assert score("image_reward", tiny_image_reward) == pytest.approx(expected, abs=1e-5)
    assert len(set(np.round(expected, 6))) == 3
    same_prompt = score("image_reward", tiny_image_reward, prompts=[PROMPTS[0]] * 3)  # the images matter too
    assert len(set(np.round(same_prompt, 6))) == 3


def test_image_reward_layout_errors(tiny_image_reward):
    (tiny_image_reward / "med_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"med_config.json.*image_scorer\.path.*bert-base-uncased"):
        score("image_reward", tiny_image_reward)
