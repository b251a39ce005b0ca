"""Tiny random checkpoints of the non-Qwen families, built locally from their real transformers
classes (model, processor, image processor) with a byte-level BPE tokenizer trained here that holds
the family's special tokens, and the family's chat template written out from its hub template
(image placeholder and turn markers faithful; system-prompt and tool branches left out).
Each is saved as an ordinary checkpoint directory that ``model.path`` loads."""

from __future__ import annotations

from pathlib import Path

import torch

# Gemma 3's hub template (google/gemma-3-4b-it chat_template.json): <bos>, <start_of_turn>user|model,
# an image as <start_of_image> (the processor expands it), <end_of_turn> after every turn.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Idefics3 / SmolVLM's hub template (HuggingFaceTB/SmolVLM-256M-Instruct): "<|im_start|>" once,
# then "User:" / "Assistant:" turns, an image as <image> (the processor expands it into tiles),
# <end_of_utterance> after every turn.
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# SmolVLM2's hub template (HuggingFaceTB/SmolVLM2-256M-Video-Instruct; transformers' SmolVLMProcessor
# DEFAULT_CHAT_TEMPLATE): Idefics3's, plus a clip as <video> (the processor expands it into a timestamp
# and an image per frame).
SMOLVLM2_TEMPLATE = IDEFICS3_TEMPLATE.replace(
    "{% elif line['type'] == 'image' %}{{ '<image>' }}",
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}")

# LLaVA-OneVision's hub template (llava-hf/llava-onevision-qwen2-0.5b-ov-hf): "<|im_start|>role ", the
# turn's images first as <image> (the processor expands each by its anyres crops), then "\n" + text.
LLAVA_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% if message['content'] is string %}{{ '\n' + message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\n' + content['text'] }}"
    "{% endfor %}{% endif %}{{ '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# InternVL 3's hub template (OpenGVLab/InternVL3-1B-hf): ChatML turns, an image as "<IMG_CONTEXT>\n"
# (the processor expands it to <img>, its tiles' context tokens, </img>).
INTERNVL_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# GLM-4.1V's hub template (zai-org/GLM-4.1V-9B-Thinking): "[gMASK]<sop>", <|user|> / <|assistant|> turns
# with no closing token (the next role token ends a turn), an image as
# <|begin_of_image|><|image|><|end_of_image|> (the processor expands <|image|> per merged patch).
GLM4V_TEMPLATE = (
    "[gMASK]<sop>{% for msg in messages %}"
    "{% if msg['role'] == 'system' %}<|system|>\n{{ msg['content'] }}"
    "{% elif msg['role'] == 'user' %}<|user|>\n{% if msg['content'] is string %}{{ msg['content'] }}{% else %}"
    "{% for item in msg['content'] %}{% if item['type'] == 'video' %}<|begin_of_video|><|video|><|end_of_video|>"
    "{% elif item['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% elif msg['role'] == 'assistant' %}<|assistant|>\n{{ msg['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _tokenizer(corpus, specials: list[str], extra: dict[str, str], vocab_size: int = 512, **named):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sorted(set(corpus)), trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, extra_special_tokens=extra, model_max_length=4096, **named)


def build_gemma3(path: Path, corpus) -> Path:
    """Gemma3ForConditionalGeneration: 2 text layers (one sliding, one global, as Gemma 3 alternates
    them), a 1-layer SigLIP tower on 32x32 images in 8x8 patches pooled to 4 image tokens."""
    from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil,
                              Gemma3Processor)

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                "<end_of_image>", "<image_soft_token>"]
    tok = _tokenizer(corpus, specials, {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                        "image_token": "<image_soft_token>"},
                     bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    processor = Gemma3Processor(Gemma3ImageProcessorPil(size={"height": 32, "width": 32}), tok,
                                chat_template=GEMMA3_TEMPLATE, image_seq_length=4)
    config = Gemma3Config(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=64,
                         layer_types=["sliding_attention", "full_attention"], max_position_embeddings=1024,
                         pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        mm_tokens_per_image=4, boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"])
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config)
    # transformers initialises the projector's weight to zeros (a trained checkpoint overwrites it):
    # random here, so image features reach the language model and gradients reach the tower
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.5)
    # as Gemma 3's generation_config: end of text or end of turn stops a completion
    model.generation_config.eos_token_id = [ids["<eos>"], ids["<end_of_turn>"]]
    model.generation_config.pad_token_id = ids["<pad>"]
    return _save(model, processor, path)


def build_idefics3(path: Path, corpus, smolvlm: bool = False) -> Path:
    """Idefics3ForConditionalGeneration (``smolvlm``: SmolVLMForConditionalGeneration, SmolVLM2's
    class, with its video processor and <video> token): 2 Llama text layers, a 1-layer SigLIP tower
    on 32x32 tiles in 8x8 patches, pixel shuffle by 2 (4 tokens a tile); a 64 px longest edge splits
    an image into 2x2 tiles plus the global one, as SmolVLM splits large images."""
    import transformers

    prefix = "SmolVLM" if smolvlm else "Idefics3"
    Config, Model, ImageProcessor, Processor = (getattr(transformers, prefix + suffix) for suffix in
                                                ("Config", "ForConditionalGeneration", "ImageProcessorPil",
                                                 "Processor"))
    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<image>", "<fake_token_around_image>",
                "<global-img>", "<video>", *[f"<row_{r}_col_{c}>" for r in range(1, 4) for c in range(1, 4)]]
    tok = _tokenizer(corpus, specials, {"image_token": "<image>", "end_of_utterance_token": "<end_of_utterance>",
                                        "fake_image_token": "<fake_token_around_image>",
                                        "global_image_token": "<global-img>"},
                     bos_token="<|im_start|>", eos_token="<end_of_utterance>", pad_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    image_processor = ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                     do_image_splitting=True)
    # the class requires one; frames resized to one 32x32 tile each (4 tokens), as SmolVLM2 squares them
    videos = (transformers.SmolVLMVideoProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32}),) \
        if smolvlm else ()
    processor = Processor(image_processor, tok, *videos, image_seq_len=4,
                          chat_template=SMOLVLM2_TEMPLATE if smolvlm else IDEFICS3_TEMPLATE)
    config = Config(
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, pad_token_id=ids["<|endoftext|>"],
                         bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<end_of_utterance>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        scale_factor=2, image_token_id=ids["<image>"], pad_token_id=ids["<|endoftext|>"])
    torch.manual_seed(0)
    model = Model(config)
    model.generation_config.eos_token_id = [ids["<end_of_utterance>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return _save(model, processor, path)


def build_llava_onevision(path: Path, corpus) -> Path:
    """LlavaOnevisionForConditionalGeneration: 2 Qwen2 text layers, a 1-layer SigLIP tower on
    32x32 crops in 8x8 patches (16 tokens a crop), anyres grid pinpoints up to 64x64 (a square image
    is the base crop plus 2x2 crops, unpadded and pooled as the real model does)."""
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor,
                              LlavaOnevisionVideoProcessor)

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
    tok = _tokenizer(corpus, specials, {"image_token": "<image>", "video_token": "<video>"},
                     eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    pinpoints = [[32, 32], [32, 64], [64, 32], [64, 64]]
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32},
                                                      crop_size={"height": 32, "width": 32},
                                                      image_grid_pinpoints=pinpoints)
    # the video processor is required by the class (transformers' video processors need torchvision);
    # frames at the tower's 32x32, 16 patch tokens pooled to 4 a frame
    videos = LlavaOnevisionVideoProcessor(size={"height": 32, "width": 32})
    processor = LlavaOnevisionProcessor(image_processor, tok, videos, num_image_tokens=16,
                                        vision_feature_select_strategy="full",
                                        chat_template=LLAVA_ONEVISION_TEMPLATE)
    config = LlavaOnevisionConfig(
        text_config=dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8),
        image_token_index=ids["<image>"], video_token_index=ids["<video>"], vision_feature_select_strategy="full",
        vision_feature_layer=-1, image_grid_pinpoints=pinpoints, vision_aspect_ratio="anyres_max_9")
    torch.manual_seed(0)
    model = LlavaOnevisionForConditionalGeneration(config)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return _save(model, processor, path)


def build_internvl(path: Path, corpus) -> Path:
    """InternVLForConditionalGeneration: 2 Qwen2 text layers, a 1-layer InternViT on 32x32 tiles in
    8x8 patches, pixel shuffle by 0.5 (4 tokens a tile); images cropped into up to 4 tiles plus a
    thumbnail, as InternVL's dynamic tiling does (GotOcr2 image processor, InternVL's own)."""
    from transformers import (GotOcr2ImageProcessorPil, InternVLConfig, InternVLForConditionalGeneration,
                              InternVLProcessor, InternVLVideoProcessor)

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
    tok = _tokenizer(corpus, specials, {"start_image_token": "<img>", "end_image_token": "</img>",
                                        "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"},
                     eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    image_processor = GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True,
                                               min_patches=1, max_patches=4)
    # frames at the tile size: one 32x32 tile (4 tokens) a frame
    processor = InternVLProcessor(image_processor, tok, InternVLVideoProcessor(size={"height": 32, "width": 32}),
                                  image_seq_length=4,
                                  chat_template=INTERNVL_TEMPLATE)
    config = InternVLConfig(
        text_config=dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=[32, 32], patch_size=[8, 8]),
        image_token_id=ids["<IMG_CONTEXT>"], image_seq_length=4, downsample_ratio=0.5)
    torch.manual_seed(0)
    model = InternVLForConditionalGeneration(config)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return _save(model, processor, path)


def build_glm4v(path: Path, corpus) -> Path:
    """Glm4vForConditionalGeneration: 2 GLM-4 text layers with M-RoPE, a 2-block vision tower on
    14 px patches merged 2x2 (Qwen-VL-style grids), images resized to 28-56 px sides by GLM's image
    processor (4 merged tokens for a 56x56 image)."""
    from transformers import (Glm4vConfig, Glm4vForConditionalGeneration, Glm4vImageProcessorPil, Glm4vProcessor,
                              Glm4vVideoProcessor)

    specials = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>",
                "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]
    tok = _tokenizer(corpus, specials, {"image_token": "<|image|>", "video_token": "<|video|>"},
                     eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    image_processor = Glm4vImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 56 * 56})
    # a clip's pixel budget over all its frames: 8 frames of 56x56 (4 tokens a pair of frames)
    videos = Glm4vVideoProcessor(size={"shortest_edge": 2 * 28 * 28, "longest_edge": 8 * 56 * 56})
    processor = Glm4vProcessor(image_processor, tok, videos, chat_template=GLM4V_TEMPLATE)
    config = Glm4vConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                          "partial_rotary_factor": 1.0},  # 8 frequencies: 2+3+3 as GLM's 8+12+12
                         pad_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"]]),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, image_size=56, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64),
        image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"])
    torch.manual_seed(0)
    model = Glm4vForConditionalGeneration(config)
    # as GLM-4.1V's generation_config: end of text, or the next turn's role token, stops a completion
    model.generation_config.eos_token_id = [ids["<|endoftext|>"], ids["<|user|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return _save(model, processor, path)


def _save(model, processor, path: Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    processor.save_pretrained(str(path))
    return path


def build_smolvlm(path: Path, corpus) -> Path:
    return build_idefics3(path, corpus, smolvlm=True)


# What building a family's processor imports beyond mmrl's base install (transformers' video
# processors need torchvision; SmolVLMProcessor needs num2words).
NEEDS = {"smolvlm": ("torchvision", "num2words"), "llava_onevision": ("torchvision",), "internvl": ("torchvision",),
         "glm4v": ("torchvision",)}

BUILDERS = {"gemma3": build_gemma3, "idefics3": build_idefics3, "smolvlm": build_smolvlm,
            "llava_onevision": build_llava_onevision, "internvl": build_internvl, "glm4v": build_glm4v}
