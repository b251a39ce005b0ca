"""Human-preference scorers for ``image_scorer``: ``pickscore`` and ``hpsv2``, each with its paper's
preprocessing and score formula, loaded from a LOCAL directory (mmrl downloads nothing).

- ``pickscore``: "Pick-a-Pic: An Open Dataset of User Preferences for Text-to-Image Generation"
  (Kirstain et al., 2023); the reference is yuvalkirstain/PickScore's README: a transformers
  ``CLIPModel`` and ``CLIPProcessor``, score ``logit_scale.exp() * cos(text_emb, image_emb)``.
- ``hpsv2``: "Human Preference Score v2: A Solid Benchmark for Evaluating Human Preferences of
  Text-to-Image Synthesis" (Wu et al., 2023); the reference is tgxs002/HPSv2's ``img_score.py``: an
  open_clip ViT-H-14 with the HPS checkpoint, HPSv2's validation transform, score ``cos``.

Both register with :func:`rewards.model_scorers.register_scorer`, so a config names them as
``image_scorer`` options: ``{name: image_scorer, scorer: pickscore, path: /ckpt/pickscore}``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._scorers import OPENAI_MEAN, OPENAI_STD, load_clip, register_scorer  # OPENAI_*: HPSv2's for ViT-H-14


def _pooled(out):
    """transformers >= 5 returns a model output from ``get_*_features``; earlier versions a tensor."""
    import torch

    return out if isinstance(out, torch.Tensor) else out.pooler_output


# -- PickScore ---------------------------------------------------------------------------------------

def pickscore_processor_dir(folder: Path) -> Path:
    """Where the CLIPProcessor's files are: ``folder`` itself when it holds a
    ``preprocessor_config.json``, else ``folder/processor`` (the reference loads its processor from
    laion/CLIP-ViT-H-14-laion2B-s32B-b79K, a separate hub repository)."""
    for where in (folder, folder / "processor"):
        if any((where / name).exists() for name in ("preprocessor_config.json", "processor_config.json")):
            return where  # the hub's layout; transformers >= 5 saves processor_config.json
    raise FileNotFoundError(
        f"pickscore: no preprocessor_config.json in {folder} or {folder / 'processor'}. Put the files of "
        "laion/CLIP-ViT-H-14-laion2B-s32B-b79K's processor (preprocessor_config.json, tokenizer files) in "
        f"{folder / 'processor'} (task.reward_kwargs.image_scorer.path)."
    )


@register_scorer("pickscore")
def load_pickscore(path: str, device):
    """PickScore from ``path``: a snapshot of yuvalkirstain/PickScore_v1 (``config.json`` and
    ``model.safetensors`` or ``pytorch_model.bin``: a transformers CLIPModel) with the processor of
    laion/CLIP-ViT-H-14-laion2B-s32B-b79K beside it or in ``processor/``.

    As the reference: images through ``CLIPProcessor`` (shortest side to 224 bicubic, centre crop,
    OpenAI normalisation), prompts padded and truncated to 77 tokens; the score is
    ``logit_scale.exp() * cos(text_emb, image_emb)`` (about 20-23 for the released model), per
    (image, its prompt) pair. The reference's softmax over one prompt's images is a comparison,
    not a reward, and is left out."""
    import torch
    from transformers import CLIPModel, CLIPProcessor

    folder = Path(path)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"pickscore: {folder / 'config.json'} is missing; task.reward_kwargs.image_scorer"
                                ".path must be a local snapshot of yuvalkirstain/PickScore_v1")
    processor = CLIPProcessor.from_pretrained(str(pickscore_processor_dir(folder)))
    model = CLIPModel.from_pretrained(str(folder)).to(device).eval()

    def score(images, prompts):
        pixels = processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
        text = processor(text=list(prompts), padding=True, truncation=True, max_length=77, return_tensors="pt")
        with torch.no_grad():
            image_emb = _pooled(model.get_image_features(pixel_values=pixels["pixel_values"].to(device)))
            text_emb = _pooled(model.get_text_features(input_ids=text["input_ids"].to(device),
                                                       attention_mask=text["attention_mask"].to(device)))
            image_emb = image_emb / image_emb.norm(dim=-1, keepdim=True)
            text_emb = text_emb / text_emb.norm(dim=-1, keepdim=True)
            return (model.logit_scale.exp() * (image_emb * text_emb).sum(-1)).float().tolist()

    return score


# -- HPSv2 -------------------------------------------------------------------------------------------

def hps_preprocess(image, size: int):
    """HPSv2's validation transform (its open_clip fork's ``image_transform(..., is_train=False,
    resize_longest_max=True)``): to a [0, 1] tensor, the longest side resized to ``size``
    (``torchvision.transforms.functional.resize`` on the tensor, bicubic, torchvision's default
    antialiasing as the reference calls it), zero-padded to a centred square, then OpenAI
    normalisation. RGBA images stay RGBA in the reference (a 4-channel mask path of its training);
    here every image is RGB. One difference: the reference skips the padding when the longest side
    is already ``size``, which only changes a non-square image that its ViT could not take anyway."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    x = F.to_tensor(image.convert("RGB"))
    height, width = x.shape[1:]
    scale = size / float(max(height, width))
    if scale != 1.0:
        x = F.resize(x, [round(height * scale), round(width * scale)], InterpolationMode.BICUBIC)
    pad_h, pad_w = size - x.shape[1], size - x.shape[2]
    x = F.pad(x, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    return F.normalize(x, OPENAI_MEAN, OPENAI_STD)


def hps_checkpoint(folder: Path) -> Path:
    """The HPS checkpoint in ``folder``: xswu/HPSv2 publishes ``HPS_v2_compressed.pt`` and
    ``HPS_v2.1_compressed.pt`` (``{"state_dict": ...}`` of an open_clip ViT-H-14); exactly one."""
    if folder.is_file():
        return folder
    found = sorted(folder.glob("HPS_v2*.pt"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"hpsv2: expected one HPS_v2*.pt checkpoint in {folder}, found {[p.name for p in found]}; set "
            "task.reward_kwargs.image_scorer.path to the checkpoint file itself or to a folder holding only one")
    return found[0]


@register_scorer("hpsv2")
def load_hpsv2(path: str, device):
    """HPSv2 (or v2.1) from ``path``: the checkpoint file, or a directory holding one
    ``HPS_v2*.pt``, with an optional ``config.json`` ``{"clip_model": "ViT-H-14"}`` naming another
    open_clip architecture (tests use a tiny one). The text goes through open_clip's tokenizer of
    that architecture (77 tokens for ViT-H-14); the score is ``cos(image_emb, text_emb)`` (about
    0.2-0.3 for the released model). The reference runs under CUDA autocast; here in float32."""
    import torch

    where = Path(path)
    config = where / "config.json" if where.is_dir() else where.with_name("config.json")
    arch = json.loads(config.read_text()).get("clip_model", "ViT-H-14") if config.exists() else "ViT-H-14"
    clip = load_clip(arch, hps_checkpoint(where), device)
    size = clip.model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else int(size)

    def score(images, prompts):
        pixels = torch.stack([hps_preprocess(im, size) for im in images]).to(clip.device)
        with torch.no_grad():
            image_emb = torch.nn.functional.normalize(clip.model.encode_image(pixels).float(), dim=-1)
        text_emb = clip.embed_texts(list(prompts))
        return (image_emb * text_emb).sum(-1).tolist()

    return score
