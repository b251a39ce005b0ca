"""ImageReward as an ``image_scorer`` (``scorer: image_reward``): "ImageReward: Learning and
Evaluating Human Preferences for Text-to-Image Generation" (Xu et al., 2023), as THUDM/ImageReward's
``ImageReward.score`` computes it, from a LOCAL directory (mmrl downloads nothing).

The reference is BLIP's ViT (timm layout: ``visual_encoder.blocks.N.attn.qkv``...) feeding a BERT
with cross-attention (BLIP's ``med.py``), its [CLS] state into an MLP, the output standardised. The
same modules exist in transformers (``BlipVisionModel``, and ``BlipTextModel`` which was ported from
``med.py`` with the same parameter names), so the checkpoint's vision keys are renamed once at load
and the rest loads as it is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ._scorers import OPENAI_MEAN, OPENAI_STD, mlp_from_state_dict, register_scorer

# ImageReward.py: ``rewards = (rewards - self.mean) / self.std``
REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
MAX_PROMPT_TOKENS = 35  # ImageReward.score: padding="max_length", truncation=True, max_length=35
# the reference's BLIP_Pretrain(image_size=224, vit="large"): ViT-L/16, LayerNorm eps 1e-6
VIT_LARGE = {"image_size": 224, "patch_size": 16, "hidden_size": 1024, "num_hidden_layers": 24,
             "num_attention_heads": 16, "intermediate_size": 4096}

_VISION_RENAMES = [  # BLIP's timm ViT -> transformers' BlipVisionModel
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.", r"encoder.layers.\1.mlp."),
    (r"^norm\.", "post_layernorm."),
]


def blip_vision_state_dict(state: dict) -> dict:
    """BLIP's ``visual_encoder`` state_dict (prefix removed) under BlipVisionModel's names."""
    out = {}
    for key, value in state.items():
        for pattern, repl in _VISION_RENAMES:
            new, n = re.subn(pattern, repl, key)
            if n:
                out[new] = value
                break
        else:
            raise ValueError(f"image_reward: unexpected vision weight {key!r} in the checkpoint")
    return out


def image_reward_transform(size: int):
    """ImageReward.py's ``_transform(n_px)``: shortest side to ``size`` (bicubic, on the PIL
    image), centre crop, RGB, to [0, 1], OpenAI CLIP normalisation."""
    try:
        from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Normalize, Resize, ToTensor
    except ImportError as exc:
        raise ImportError("the image_reward scorer needs torchvision: pip install 'mmrl[clip]' (open_clip brings "
                          "it) or pip install torchvision") from exc

    return Compose([Resize(size, interpolation=InterpolationMode.BICUBIC), CenterCrop(size),
                    lambda im: im.convert("RGB"), ToTensor(), Normalize(OPENAI_MEAN, OPENAI_STD)])


def _required(folder: Path, name: str, what: str) -> Path:
    if not (folder / name).exists():
        raise FileNotFoundError(f"image_reward: {folder / name} is missing ({what}); task.reward_kwargs.image_scorer"
                                ".path must hold ImageReward.pt, med_config.json (THUDM/ImageReward) and tokenizer/ "
                                "(a bert-base-uncased snapshot)")
    return folder / name


def _split(state: dict) -> tuple[dict, dict, dict]:
    """The checkpoint's vision, text and MLP weights (the contrastive projections are unused)."""
    parts: tuple[dict, dict, dict] = ({}, {}, {})
    for key, value in state.items():
        for part, prefix in zip(parts, ("blip.visual_encoder.", "blip.text_encoder.", "mlp.")):
            if key.startswith(prefix):
                part[key[len(prefix):]] = value
    parts[1].pop("embeddings.position_ids", None)  # a buffer, rebuilt by the model
    return parts


@register_scorer("image_reward")
def load_image_reward(path: str, device):
    """ImageReward from ``path``: ``ImageReward.pt`` (the state_dict), ``med_config.json`` (the BERT's
    config) as THUDM/ImageReward publishes them, and ``tokenizer/``: bert-base-uncased's tokenizer
    files (the reference downloads that tokenizer; here it is local), optionally
    ``vision_config.json`` for a ViT other than the reference's ViT-L/16 at 224 px (tests).

    Per (image, prompt): the prompt tokenised to 35 tokens (padded, truncated; [DEC] and [ENC] added
    to the vocabulary as BLIP does), the image through :func:`image_reward_transform`, the BERT's
    [CLS] state attending to the ViT's states, the MLP, then ``(r - 0.16717) / 1.03334``."""
    import torch
    from transformers import BertTokenizer, BlipTextConfig, BlipVisionConfig, BlipVisionModel
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    folder = Path(path)
    state = torch.load(_required(folder, "ImageReward.pt", "the reward model's state_dict"), map_location="cpu",
                       weights_only=True)
    med = json.loads(_required(folder, "med_config.json", "the text encoder's config").read_text())
    tokenizer = BertTokenizer.from_pretrained(str(_required(folder, "tokenizer", "bert-base-uncased's tokenizer")))
    tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    vit = dict(VIT_LARGE)
    if (folder / "vision_config.json").exists():
        vit.update(json.loads((folder / "vision_config.json").read_text()))
    vision_state, text_state, mlp_state = _split(state)

    vision = BlipVisionModel(BlipVisionConfig(**vit, layer_norm_eps=1e-6, hidden_act="gelu"))
    vision.load_state_dict(blip_vision_state_dict(vision_state))
    text = BlipTextModel(BlipTextConfig(
        vocab_size=med["vocab_size"], hidden_size=med["hidden_size"], num_hidden_layers=med["num_hidden_layers"],
        num_attention_heads=med["num_attention_heads"], intermediate_size=med["intermediate_size"],
        hidden_act=med.get("hidden_act", "gelu"), max_position_embeddings=med["max_position_embeddings"],
        layer_norm_eps=med.get("layer_norm_eps", 1e-12), pad_token_id=med.get("pad_token_id", 0),
        encoder_hidden_size=vit["hidden_size"], is_decoder=True),  # is_decoder builds the cross-attention
        add_pooling_layer=False)
    text.load_state_dict(text_state)
    mlp = mlp_from_state_dict(mlp_state)  # Linear 768-1024-128-64-16-1 with Dropouts between: no activations
    vision, text, mlp = (m.to(device).eval() for m in (vision, text, mlp))
    transform = image_reward_transform(vit["image_size"])

    def score(images, prompts):
        pixels = torch.stack([transform(im) for im in images]).to(device)
        tokens = tokenizer(list(prompts), padding="max_length", truncation=True, max_length=MAX_PROMPT_TOKENS,
                           return_tensors="pt").to(device)
        with torch.no_grad():
            image_states = vision(pixel_values=pixels).last_hidden_state
            image_mask = torch.ones(image_states.shape[:-1], dtype=torch.long, device=device)
            states = text(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                          encoder_hidden_states=image_states, encoder_attention_mask=image_mask,
                          is_decoder=False).last_hidden_state
            rewards = mlp(states[:, 0, :].float())[:, 0]
        return ((rewards - REWARD_MEAN) / REWARD_STD).tolist()

    return score
