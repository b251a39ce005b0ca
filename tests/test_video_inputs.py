"""Clips into a Qwen2.5-VL policy: the HF processor's video path, rollouts and re-scoring."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.registry import TASKS, load_plugins
from mmrl.vlm.policy import VLMPolicy
from mmrl.vlm.processing import split_videos

pytest.importorskip("torchvision", reason="transformers' video processor needs torchvision (mmrl[video])")
BUDGET = ("vlm.video_min_pixels=12544", "vlm.video_max_pixels=12544")


def _policy(path, *overrides):
    return VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", *BUDGET, *overrides))


def _examples(task_name, n):
    load_plugins()
    task = TASKS.get(task_name)()
    return task, [task.examples("train")[i] for i in range(n)]


def test_video_inputs_match_hf_processor(random_tiny_dir):
    """Our encoding of clip prompts equals transformers' Qwen2_5_VLProcessor: the same ids (one
    <|video_pad|> per merged patch of 4 temporal patches x 16 cells), pixels, grid and seconds per
    temporal patch (2 frames / 2 fps = 1 s)."""
    from transformers import Qwen2_5_VLProcessor
    from transformers.video_utils import VideoMetadata

    policy = _policy(random_tiny_dir)
    task, exs = _examples("video_qa", 2)
    prompts = [task.prompt(e) for e in exs]
    ours, images = policy.encode_prompts(prompts)
    assert images == [0, 0]
    p = policy.processor
    hf = Qwen2_5_VLProcessor(image_processor=p.image_processor, tokenizer=p.tokenizer,
                             video_processor=p.video_processor, chat_template=p.chat_template)
    texts, clips = [], []
    for messages in prompts:
        clean, _, videos = policy.split_messages(messages)
        texts.append(hf.apply_chat_template(clean, tokenize=False, add_generation_prompt=True))
        clips += videos
    meta = [VideoMetadata(total_num_frames=len(c.indices), fps=c.sample_fps, frames_indices=c.indices) for c in clips]
    theirs = hf(text=texts, videos=[c.frames for c in clips], return_tensors="pt", padding=True,
                videos_kwargs={"do_sample_frames": False, "video_metadata": meta})
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["mm_token_type_ids"], theirs["mm_token_type_ids"])
    assert ours["video_grid_thw"].tolist() == [[4, 8, 8], [4, 8, 8]]
    assert torch.equal(ours["video_grid_thw"], theirs["video_grid_thw"])
    assert torch.allclose(ours["pixel_values_videos"], theirs["pixel_values_videos"], atol=1e-5)
    assert ours["second_per_grid_ts"].tolist() == [1.0, 1.0] == list(theirs["second_per_grid_ts"])
    assert [int((row == p.video_token_id).sum()) for row in ours["input_ids"]] == [64, 64]


def test_split_videos_follows_each_rows_video_tokens():
    """Rows own the videos whose tokens they hold, in order; a row without video gets None."""
    vid = 7
    enc = {"input_ids": torch.tensor([[vid, vid, 1], [1, 1, 1], [vid, vid, vid]]),
           "video_grid_thw": torch.tensor([[2, 2, 2], [1, 2, 2], [2, 2, 2]]),  # 8, 4, 8 patches -> 2, 1, 2 tokens
           "pixel_values_videos": torch.arange(20).float()[:, None],
           "second_per_grid_ts": torch.tensor([1.0, 0.5, 2.0])}
    rows = split_videos(enc, vid, merge_size=2)
    assert rows[1] is None
    assert rows[0]["video_grid_thw"].tolist() == [[2, 2, 2]]
    assert rows[0]["pixel_values_videos"][:, 0].tolist() == list(range(8))
    assert rows[2]["video_grid_thw"].tolist() == [[1, 2, 2], [2, 2, 2]]
    assert rows[2]["pixel_values_videos"][:, 0].tolist() == list(range(8, 20))
    assert rows[2]["second_per_grid_ts"].tolist() == [0.5, 2.0]


@pytest.mark.slow
def test_video_rollout_scores_match_generation_and_training(random_tiny_dir):
    """Sampled clip completions re-score to the same log-probs in eval and in train mode, and a
    loss backpropagates: the payload carries each sample's video through the whole step."""
    policy = _policy(random_tiny_dir, "rollout.max_completion_length=8")
    task, exs = _examples("temporal_grounding", 2)
    exs = policy.prepare_examples(exs)
    torch.manual_seed(0)
    batch = policy.rollout(exs, [task.prompt(e) for e in exs], 3, "train", need_old_logps=True)
    assert len(batch) == 6 and all(v is not None for v in batch.payload["video"])
    again = policy.score(batch, reference=False)
    assert torch.allclose(again, batch.old_logps, atol=1e-5)
    policy.model.train()
    logps = policy.completion_logps(policy.model, batch)
    (-(logps.sum())).backward()
    grads = [p.grad for n, p in policy.model.named_parameters() if "lm_head" in n or "embed_tokens" in n]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_video_features_are_encoded_once_per_group(random_tiny_dir):
    """A group of G samples of one clip sends the clip through the vision tower once."""
    policy = _policy(random_tiny_dir, "rollout.max_completion_length=4",
                     "train.shared_prefix=false")  # the per-sample forward asks for every sample's clip
    task, exs = _examples("video_qa", 2)
    batch = policy.rollout(exs, [task.prompt(e) for e in exs], 4, "train")
    [encoder] = policy.video_encoders
    assert encoder.input_names == ("pixel_values_videos", "video_grid_thw")
    seen, encoded = encoder.images_seen, encoder.images_encoded
    policy.score(batch, reference=False)
    assert encoder.images_seen - seen == 8 and encoder.images_encoded - encoded == 2


@pytest.mark.slow
def test_reg_grpo_with_tempsamp_guidance_trains_on_clips(random_tiny_dir, tmp_path):
    """DeepVideo-R1's Reg-GRPO loss with TempSamp-R1's reference completions on a clip task: the
    teacher-forced references carry their clips, and a step trains on the mixed batch."""
    import json
    import math

    from conftest import tiny_run_config
    from mmrl.core.trainer import Trainer

    cfg = tiny_run_config(random_tiny_dir, tmp_path, 1, "task.name=video_qa", *BUDGET, "algo.loss_type=reg_grpo",
                          "algo.off_policy_guidance=1", "algo.beta=0", "eval.num_examples=0",
                          "rollout.max_completion_length=40")  # room for the whole reference answer
    Trainer(cfg, VLMPolicy(cfg)).train()
    row = next(json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
               if "loss" in json.loads(line))
    assert row["off_policy_frac"] > 0 and math.isfinite(row["loss"]) and row["grad_norm"] > 0
