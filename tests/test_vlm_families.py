"""The same policy code drives each Qwen-VL family: Qwen2-VL, Qwen2.5-VL and Qwen3-VL, built
from small configs with real transformers classes (no downloads), plus the image budget."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.registry import TASKS
from mmrl.vlm import tiny
from mmrl.vlm.policy import VLMPolicy


def _ids(tok):
    return {t: tok.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS}


def _qwen2_vl(tok):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = _ids(tok)
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen2VLForConditionalGeneration(cfg), 14


def _qwen3_vl(tok):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = _ids(tok)
    cfg = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                           num_position_embeddings=64, deepstack_visual_indexes=[1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen3VLForConditionalGeneration(cfg), 16


@pytest.mark.parametrize("build", [_qwen2_vl, _qwen3_vl], ids=["qwen2_vl", "qwen3_vl"])
def test_family_rollout_score_and_update(build, random_tiny_dir, tmp_path):
    from transformers import AutoTokenizer

    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:
        from transformers import Qwen2VLImageProcessor as ImageProcessor
    from mmrl.vlm.processing import VLMProcessor

    tok = AutoTokenizer.from_pretrained(random_tiny_dir)
    torch.manual_seed(0)
    model, patch = build(tok)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    processor = VLMProcessor(tok, ImageProcessor(patch_size=patch, min_pixels=32 * 32, max_pixels=128 * 128),
                             tiny.QWEN_CHAT_TEMPLATE)
    tiny.save_tiny(model, processor, tmp_path)

    policy = VLMPolicy(make_config(f"model.path={tmp_path}", "train.device=cpu", "rollout.max_completion_length=6",
                                   "vlm.video_min_pixels=3136", "vlm.video_max_pixels=3136"))
    assert type(policy.model).__name__ == type(model).__name__
    video = TASKS.get("temporal_grounding")()
    clips = [video.examples("train")[i] for i in range(2)]
    if build is _qwen3_vl:  # its timestamped frames are not encoded yet: a clear error, not wrong inputs
        with pytest.raises(ValueError, match="not supported"):
            policy.rollout(clips, [video.prompt(e) for e in clips], 2, "train")
    else:  # Qwen2-VL: clips without second_per_grid_ts (its M-RoPE counts frames)
        batch = policy.rollout(clips, [video.prompt(e) for e in clips], 2, "train", need_old_logps=True)
        assert "second_per_grid_ts" not in batch.payload["video"][0]
        assert torch.allclose(policy.score(batch, reference=False), batch.old_logps, atol=1e-5)
    task = TASKS.get("counting")()
    exs = [task.examples("train")[i] for i in range(2)]
    batch = policy.rollout(exs, [task.prompt(e) for e in exs], 2, policy.cfg.rollout,
                           need_old_logps=True, need_ref_logps=False)
    assert len(batch) == 4 and torch.isfinite(batch.old_logps).all()
    policy.configure_optimizer(policy.cfg.train, 2)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    m = policy.train_step(batch, Objective(ObjectiveConfig()),
                          float(batch.action_mask.sum()), 4.0)
    assert abs(m["ratio_mean"] - 1) < 1e-5 and m["grad_norm"] > 0


@pytest.mark.parametrize("max_pixels,tokens", [(112 * 112, 16), (56 * 56, 4)])
def test_max_pixels_sets_the_number_of_image_tokens(random_tiny_dir, max_pixels, tokens):
    """A 112x112 image is 8x8 patches -> 16 merged tokens; capped at 56*56 pixels it is 4."""
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu",
                                   f"vlm.max_pixels={max_pixels}", "vlm.min_pixels=784"))
    task = TASKS.get("counting")()
    enc, per_sample = policy.encode_prompts([task.prompt(task.examples("train")[0])])
    image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert per_sample == [1]
    assert int((enc["input_ids"] == image_pad).sum()) == tokens
    assert int(enc["image_grid_thw"].prod()) == tokens * 4
