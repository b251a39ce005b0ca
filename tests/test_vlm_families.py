"""The same policy code drives each family: Qwen2-VL, Qwen2.5-VL and Qwen3-VL, Gemma 3, Idefics3,
SmolVLM, LLaVA-OneVision, InternVL and GLM-4.1V, built from small configs with real transformers
classes (no downloads; tests/vlm_family_models.py), plus the Qwen image budget. What each family
allows is declared in mmrl.vlm.families and mmrl.media.coords (docs/models.md)."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.registry import TASKS
from mmrl.vlm import loading as vlm_loading
from mmrl.vlm.logprobs import split_head
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


@pytest.mark.slow
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


# -- the other families, through the same policy code (tests/vlm_family_models.py builds them) ----------------

OTHER_FAMILIES = ["gemma3", "idefics3", "smolvlm", "llava_onevision", "internvl", "glm4v"]


@pytest.fixture(scope="session", params=OTHER_FAMILIES)
def family_dir(request, tmp_path_factory):
    """``(model_type, checkpoint dir)`` of a tiny random checkpoint of each family."""
    from mmrl.registry import load_plugins
    from mmrl.vlm.tiny_builders import tokenizer_corpus
    from vlm_family_models import BUILDERS, NEEDS

    for module in NEEDS.get(request.param, ()):
        pytest.importorskip(module, reason=f"the {request.param} processor needs {module}: pip install {module}")
    load_plugins()
    corpus = tokenizer_corpus([TASKS.get("counting")(), TASKS.get("grounding")()], per_task=100)
    return request.param, BUILDERS[request.param](tmp_path_factory.mktemp(request.param), corpus)


def _family_policy(path, *extra):
    return VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", "rollout.max_completion_length=6",
                                 "train.seed=0", *extra))


def _counting(n=2, mixed_sizes=False):
    """Counting examples and prompts; ``mixed_sizes``: the second image resized to 96x48, so the
    batch pads the family's image tensors (tiles, anyres crops) across samples."""
    task = TASKS.get("counting")()
    exs = [task.examples("train")[i] for i in range(n)]
    if mixed_sizes:
        exs[1] = {**exs[1], "image": exs[1]["image"].resize((96, 48))}
    return exs, [task.prompt(e) for e in exs]


VIDEO_FAMILIES = ["smolvlm", "llava_onevision", "internvl", "glm4v"]


def _clips(n=2, frames=4):
    """Temporal-grounding examples cut to their first ``frames`` frames (2 fps: 0, 0.5, 1, 1.5 s), and prompts."""
    import dataclasses

    task = TASKS.get("temporal_grounding")()
    exs = []
    for i in range(n):
        ex, clip = task.examples("train")[i], task.examples("train")[i]["video"]
        exs.append({**ex, "video": dataclasses.replace(clip, frames=clip.frames[:frames],
                                                       timestamps=clip.timestamps[:frames],
                                                       indices=clip.indices[:frames])})
    return exs, [task.prompt(e) for e in exs]


def _generation_logps(policy, monkeypatch):
    """Capture generate()'s own logits during a rollout: the log-probs of the distribution each
    token was sampled from (vision tokens suppressed, temperature 1), per sample and step."""
    captured = []
    generate = policy.module.generate

    def recording(**kwargs):
        out = generate(**kwargs, return_dict_in_generate=True, output_logits=True)
        logits = torch.stack(out.logits, dim=1).float()  # (B, T, V) raw logits
        logits[..., policy.suppressed_ids] = float("-inf")
        captured.append(torch.log_softmax(logits, -1))
        return out.sequences

    monkeypatch.setattr(policy.module, "generate", recording)
    return captured


@pytest.mark.slow
def test_family_rollout_rescores_to_the_sampled_logprobs(family_dir, monkeypatch):
    """A rollout with image prompts; re-scoring its completions (the padded training forward,
    image tensors from the payload) gives the log-probs of the distribution generate() sampled
    them from, to 1e-5 in float32; no vision token is ever sampled."""
    model_type, path = family_dir
    policy = _family_policy(path, "rollout.temperature=1.0", "train.micro_batch_size=3")
    assert policy.module.config.model_type == model_type
    captured = _generation_logps(policy, monkeypatch)
    exs, prompts = _counting(mixed_sizes=True)
    batch = policy.rollout(exs, prompts, 2, "train")
    assert len(batch) == 4 and batch.payload["pixel_values"][0] is not None
    _assert_rescored_as_sampled(policy, batch, captured[0])


def _assert_rescored_as_sampled(policy, batch, sampled):
    """``policy.score`` of ``batch`` equals the log-probs of the sampled tokens under the captured
    generation distribution ``sampled`` (to 1e-5), and no completion holds a vision token."""
    mask = batch.action_mask.bool()
    comps = torch.zeros_like(batch.action_mask, dtype=torch.long)
    for i, c in enumerate(batch.payload["completion_ids"]):
        comps[i, :len(c)] = c
        assert not set(c.tolist()) & set(policy.suppressed_ids)
    expected = sampled[:, :comps.shape[1]].gather(-1, comps.unsqueeze(-1)).squeeze(-1)
    scored = policy.score(batch, reference=False)
    assert mask.any()
    assert torch.allclose(scored[mask], expected[mask], atol=1e-5), (scored - expected)[mask].abs().max()


def _step_moves_the_lm_and_the_tower(policy, exs, prompts):
    """One training step on two samples of each of ``prompts`` (spread advantages, on-policy): the
    ratio is 1, and weights of both the language model and the vision tower change. The batch."""
    batch = policy.rollout(exs, prompts, 2, "train", need_old_logps=True)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    policy.configure_optimizer(policy.cfg.train, 2)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    m = policy.train_step(batch, Objective(ObjectiveConfig()), float(batch.action_mask.sum()), 4.0)
    assert abs(m["ratio_mean"] - 1) < 1e-5 and m["grad_norm"] > 0
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    tower = vlm_loading.vision_tower(policy.model)
    prefix = next(n for n, m_ in policy.model.named_modules() if m_ is tower)
    assert any("q_proj" in n and not n.startswith(prefix + ".") for n in changed)
    assert any(n.startswith(prefix + ".") for n in changed)
    return batch


@pytest.mark.slow
def test_family_training_step_and_checkpoint_round_trip(family_dir, tmp_path):
    """One training step changes the language model and the vision tower; the checkpoint the
    policy saves loads into a fresh policy with identical log-probs."""
    _, path = family_dir
    policy = _family_policy(path)
    batch = _step_moves_the_lm_and_the_tower(policy, *_counting())
    after = policy.score(batch, reference=False)
    policy.save(tmp_path / "ckpt")
    fresh = _family_policy(path)
    fresh.load(tmp_path / "ckpt")
    assert torch.equal(fresh.score(batch, reference=False), after)


@pytest.mark.slow
def test_family_lora_in_bfloat16_adapts_the_language_model_only(family_dir):
    """LoRA on the family's declared targets (the language model's projections, never the vision
    tower's), base weights in bfloat16: a rollout and a training step run and move only adapters."""
    _, path = family_dir
    policy = _family_policy(path, "model.lora.enabled=true", "model.lora.r=4", "model.dtype=bfloat16")
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    tower = vlm_loading.vision_tower(policy.model.get_base_model())
    assert not any("lora_" in n for n, _ in tower.named_parameters())
    adapted = {n.split(".")[-4] for n in trainable if n.endswith("lora_A.default.weight")}
    assert adapted == set(policy.family.lora_targets)
    exs, prompts = _counting()
    batch = policy.rollout(exs, prompts, 2, "train", need_old_logps=True)
    assert torch.isfinite(batch.old_logps).all()
    policy.configure_optimizer(policy.cfg.train, 2)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    m = policy.train_step(batch, Objective(ObjectiveConfig()), float(batch.action_mask.sum()), 4.0)
    assert m["grad_norm"] > 0


@pytest.mark.slow
def test_family_declares_what_it_does_not_do(family_dir):
    """Where the architecture rules out a speed-up it is off, and asking for it is refused with the
    family's reason; a video prompt to a family without video is a stated error, not wrong inputs."""
    from mmrl.config import ConfigError
    from mmrl.vlm.shared_prefix import uses_shared_prefix

    model_type, path = family_dir
    policy = _family_policy(path)
    family = policy.family
    assert (policy.image_encoders == []) == bool(family.vision_once_off)
    assert policy.shared_prefix is (family.shared_prefix_off is None)
    if family.shared_prefix_off:
        assert uses_shared_prefix(None, False, None, family.shared_prefix_off) is False
        with pytest.raises(ValueError, match="train.shared_prefix=true"):
            _family_policy(path, "train.shared_prefix=true")
    with pytest.raises(ConfigError, match="train.padding_free=true: not for"):
        _family_policy(path, "train.padding_free=true", "train.shared_prefix=false")
    with pytest.raises(ValueError, match="min_pixels"):
        _family_policy(path, "vlm.max_pixels=12544")
    with pytest.raises(ValueError, match="vlm.video_min_pixels / vlm.video_max_pixels are Qwen-VL's"):
        _family_policy(path, "vlm.video_max_pixels=12544")
    if model_type not in VIDEO_FAMILIES:  # Gemma 3 takes no video; Idefics3's processor has no video processor
        exs, prompts = _clips()
        with pytest.raises(ValueError, match="video prompts: .*(takes images, not video|has no video processor)"):
            policy.rollout(exs, prompts, 1, "train")


@pytest.mark.slow
def test_family_speedups_are_exact(family_dir):
    """Where a family allows the vision tower once per distinct image (Gemma 3: a pixel row per
    image; GLM-4.1V: Qwen-style grids) and one prompt pass per group (GLM-4.1V: M-RoPE like
    Qwen-VL), log-probs and gradients equal the plain forward's."""
    _, path = family_dir
    _speedups_match_the_plain_forward(path, *_counting(), "image_encoders")


def _speedups_match_the_plain_forward(path, exs, prompts, encoders: str):
    """Log-probs and gradients of a rollout of ``prompts`` with the family's speed-ups equal the plain
    forward's, and its vision-once wrappers (``encoders``: the policy's image or video ones) encode
    each distinct image or clip once."""
    fast = _family_policy(path, "train.micro_batch_size=4")
    if fast.family.vision_once_off and fast.family.shared_prefix_off:
        pytest.skip(f"{fast.family.name} allows neither (stated in mmrl.vlm.families)")
    plain = _family_policy(path, "train.micro_batch_size=4", "train.shared_prefix=false")
    inner = split_head(plain.module)[0]
    for method in ("get_image_features", "get_video_features"):  # uninstall vision-once: the class's own
        inner.__dict__.pop(method, None)
    plain.image_encoders.clear()
    plain.video_encoders.clear()
    for encoder in getattr(fast, encoders):
        encoder.images_seen = encoder.images_encoded = 0
    batch = fast.rollout(exs, prompts, 2, "train")
    assert fast.shared_prefix is (fast.family.shared_prefix_off is None)
    assert bool(getattr(fast, encoders)) is (fast.family.vision_once_off is None)
    grads = []
    for policy in (fast, plain):
        policy.module.zero_grad()
        with policy.autocast():
            logps = policy.completion_logps(policy.module, batch)
        logps.sum().backward()
        grads.append({n: p.grad.clone() for n, p in policy.module.named_parameters() if p.grad is not None})
        if policy is fast:
            fast_logps = logps.detach()
    assert torch.allclose(fast_logps, logps.detach(), atol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-4, rtol=1e-3), name
    for encoder in getattr(fast, encoders)[:1]:
        assert encoder.images_encoded < encoder.images_seen  # 2 distinct images or clips, 4 samples


def test_family_teacher_forced_completions_end_the_turn(family_dir):
    """Given completions (off-policy guidance, SFT references) end with the token the family's chat
    template closes an assistant turn with, which also stops its generation."""
    _, path = family_dir
    policy = _family_policy(path, "rollout.max_completion_length=12")
    exs, prompts = _counting()
    batch = policy.rollout_given(exs, prompts, ["<answer>3</answer>", "4"], True, False)
    end = policy.tokenizer.convert_tokens_to_ids(policy.family.end_of_turn)
    assert end in policy.eos_ids
    assert [int(c[-1]) for c in batch.payload["completion_ids"]] == [end, end]
    assert batch.completions == ["<answer>3</answer>", "4"] and torch.isfinite(batch.old_logps).all()


def test_family_coordinate_frame(family_dir):
    """Boxes are read in the frame the family documents (InternVL: 0-1000 of the image), and a
    family that documents none is refused by the grounding rewards instead of guessed at, unless
    ``vlm.box_space`` states one."""
    from mmrl.media.coords import FAMILY_OUTPUT_SPACE, NoCoordinateFrame, declares_space
    from mmrl.registry import REWARDS

    model_type, path = family_dir
    policy = _family_policy(path)
    grounding = TASKS.get("grounding")()
    raw = grounding.examples("train")[0]
    (w, h), (x1, y1, x2, y2) = raw["image_size"], raw["box"]
    in_rel1000 = "<answer>[{:.3f}, {:.3f}, {:.3f}, {:.3f}]</answer>".format(x1 / w * 1000, y1 / h * 1000,
                                                                          x2 / w * 1000, y2 / h * 1000)
    iou = REWARDS.get("iou")
    if declares_space(model_type):
        assert policy.box_space == FAMILY_OUTPUT_SPACE[model_type] == "rel1000"
        ex = policy.prepare_examples([raw])[0]
        assert iou([in_rel1000], [ex])[0] == pytest.approx(1.0, abs=1e-3)
        return
    ex = policy.prepare_examples([raw])[0]
    with pytest.raises(NoCoordinateFrame, match="declares no coordinate frame.*vlm.box_space"):
        iou([in_rel1000], [ex])
    with pytest.raises(NoCoordinateFrame):
        policy.box_space
    stated = _family_policy(path, "vlm.box_space=rel1000")
    ex = stated.prepare_examples([raw])[0]
    assert ex["pred_space"] == "rel1000" and iou([in_rel1000], [ex])[0] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_family_two_step_cli_run(family_dir, tmp_path, monkeypatch):
    """`mmrl train vlm model.path=<tiny family dir>` trains 2 steps and writes its summary (the
    command line's own code, in this process: a subprocess would spend most of its time importing)."""
    import torch
    from typer.testing import CliRunner

    from conftest import CLI_RUN
    from mmrl.cli import app

    _, path = family_dir
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        r = CliRunner().invoke(app, ["train", "vlm", f"model.path={path}", *CLI_RUN, f"train.threads={threads}",
                                     "train.steps=2", "log.run_name=fam"])
    finally:
        torch.set_num_threads(threads)
    assert r.exit_code == 0, r.output[-2000:]
    assert (tmp_path / "runs" / "fam" / "summary.json").exists()


# -- clips, through each family's own video processor ---------------------------------------------------------

# What each family's processor writes for a 4-frame clip at 2 fps (frames at 0, 0.5, 1 and 1.5 s):
# SmolVLM2 a time before each frame (whole seconds), then the frame as one image; GLM-4.1V a frame
# pair's tokens then its first frame's second; InternVL a numbered image per frame; LLaVA-OneVision
# 4 frames x 2x2 pooled tokens + 1 newline.
CLIP_TEXT = {"smolvlm": ["Frame from 00:00:<fake_token_around_image><global-img>" + "<image>" * 4,
                         "Frame from 00:01:<fake_token_around_image>"],
             "glm4v": ["<|begin_of_video|><|begin_of_image|>" + "<|image|>" * 4 + "<|end_of_image|>0<|begin_of_image|>",
                       "<|end_of_image|>1<|end_of_video|>"],
             "internvl": ["Frame1: <img>" + "<IMG_CONTEXT>" * 4 + "</img>", "Frame4: <img>"],
             "llava_onevision": ["<|im_start|>user " + "<video>" * 17 + "\n"]}


@pytest.mark.slow
@pytest.mark.parametrize("family_dir", VIDEO_FAMILIES, indirect=True)
def test_family_video_rollout_rescores_to_the_sampled_logprobs(family_dir, monkeypatch):
    """A rollout on clip prompts through the family's own processor: its prompt carries the frames
    (with their times where the family writes them), each sample keeps its clip's tensors (its video
    inputs, or 4 more images where the model reads frames as images), and re-scoring gives the
    log-probs of the distribution generate() sampled from, to 1e-5 in float32; no vision token sampled."""
    model_type, path = family_dir
    policy = _family_policy(path, "rollout.temperature=1.0", "train.micro_batch_size=3")
    captured = _generation_logps(policy, monkeypatch)
    exs, prompts = _clips()
    batch = policy.rollout(exs, prompts, 2, "train")
    prompt = policy.tokenizer.decode(batch.payload["prompt_ids"][0])
    assert all(text in prompt for text in CLIP_TEXT[model_type]), prompt
    if policy.family.video_layout == "as_images":
        assert batch.payload["video"] == [None] * 4 and [len(x) for x in batch.payload["pixel_values"]] == [4] * 4
    else:
        assert all(v["pixel_values_videos"] is not None for v in batch.payload["video"])
    if model_type == "glm4v":  # frames are <|image|> tokens of type 2 (M-RoPE reads them): as its processor says
        ids = batch.payload["prompt_ids"][0]
        types = policy.processor.token_types(ids[None])[0]
        assert types.tolist() == policy.processor.hf.create_mm_token_type_ids([ids.tolist()])[0]
        assert set(types.tolist()) == {0, 2}
    _assert_rescored_as_sampled(policy, batch, captured[0])


@pytest.mark.slow
@pytest.mark.parametrize("family_dir", VIDEO_FAMILIES, indirect=True)
def test_family_video_training_step(family_dir):
    """One training step on clip samples changes the language model and the vision tower (the
    frames' features carry the gradient)."""
    _, path = family_dir
    _step_moves_the_lm_and_the_tower(_family_policy(path), *_clips())


@pytest.mark.parametrize("family_dir", ["smolvlm", "llava_onevision", "internvl"], indirect=True)
def test_family_batch_of_clip_image_and_text_prompts(family_dir):
    """One batch of a clip prompt, an image prompt and a text prompt (Video-R1 mixes clips and
    images): each sample keeps its own inputs, so scored alone it has the log-probs it has in the batch."""
    _, path = family_dir
    policy = _family_policy(path)
    (clip, _), (clip_prompt, _) = _clips()
    (image,), (image_prompt,) = _counting(1)
    text_prompt = [{"role": "user", "content": [{"type": "text", "text": "How many?"}]}]
    batch = policy.rollout([clip, image, image], [clip_prompt, image_prompt, text_prompt], 1, "train",
                           need_old_logps=True)
    assert batch.payload["pixel_values"][1] is not None and batch.payload["pixel_values"][2] is None
    for i in range(3):
        alone = policy.score(batch.select([i]), reference=False)[0]
        assert torch.allclose(alone, batch.old_logps[i, :len(alone)], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family_dir", ["glm4v", "llava_onevision", "internvl", "smolvlm"], indirect=True)
def test_family_refuses_clip_batches_it_cannot_take(family_dir):
    """GLM-4.1V cannot hold images and clips in one forward, LLaVA-OneVision's model and InternVL's
    processor clips of unequal frame counts, SmolVLM2's processor one prompt's images and clip: a
    rollout asking for it, and a batch put together from rollouts that each could be taken (scoring),
    are refused with the reason, not fed wrong inputs."""
    from mmrl.core.rollouts import Rollouts

    model_type, path = family_dir
    policy = _family_policy(path)
    if model_type == "smolvlm":
        (clip, _), (clip_prompt, _) = _clips()
        (image,), _ = _counting(1)
        both = [{"role": "user", "content": [{"type": "image", "image": image["image"]}, *clip_prompt[0]["content"]]}]
        with pytest.raises(ValueError, match="both images and a clip: transformers' SmolVLMProcessor returns both"):
            policy.rollout([clip], [both], 1, "train")
        return
    if model_type == "glm4v":
        (clip, _), (clip_prompt, _) = _clips()
        (image,), (image_prompt,) = _counting(1)
        with pytest.raises(ValueError, match="image and video prompts: transformers' Glm4vModel"):
            policy.rollout([clip, image], [clip_prompt, image_prompt], 1, "train")
        parts = [policy.rollout([clip], [clip_prompt], 1, "train"), policy.rollout([image], [image_prompt], 1, "train")]
        with pytest.raises(ValueError, match="image and video samples: transformers' Glm4vModel"):
            policy.score(Rollouts.concat(parts), reference=False)
        return
    (four, _), (four_prompt, _) = _clips(frames=4)
    (six, _), (six_prompt, _) = _clips(frames=6)
    with pytest.raises(ValueError, match=r"clips of \[4, 6\] frames in one batch.*nframes"):
        policy.rollout([four, six], [four_prompt, six_prompt], 1, "train")
    if model_type == "llava_onevision":  # InternVL's model reads frames as tiles: only its processor stacks clips
        parts = [policy.rollout([four], [four_prompt], 1, "train"), policy.rollout([six], [six_prompt], 1, "train")]
        with pytest.raises(ValueError, match=r"clips of \[4, 6\] frames in one forward"):
            policy.score(Rollouts.concat(parts), reference=False)


@pytest.mark.slow
@pytest.mark.parametrize("family_dir", ["glm4v"], indirect=True)
def test_family_video_speedups_are_exact(family_dir):
    """GLM-4.1V's clips through vision-once (its get_video_features, split by video_grid_thw) and
    the shared prompt pass: log-probs and gradients equal the plain forward's; each clip encoded once."""
    _, path = family_dir
    _speedups_match_the_plain_forward(path, *_clips(), "video_encoders")
