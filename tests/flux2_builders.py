"""Tiny randomly initialised FLUX.2, FLUX.2 [klein] and FLUX.1-Kontext pipelines built locally, no downloads.

The configs follow diffusers' ``get_dummy_components`` (tests/pipelines/flux2/test_pipeline_flux2.py,
test_pipeline_flux2_klein.py, tests/pipelines/flux/test_pipeline_flux_kontext.py) with these changes:

- the tokenizers are built here: a byte-level BPE without merges (every byte one token, like the real
  Tekken / Qwen byte-level vocabularies, so any prompt encodes), with the special tokens and a chat
  template of the real one's shape (Mistral-Small-3.1's ``[SYSTEM_PROMPT]``/``[INST]`` inside a
  ``PixtralProcessor`` for FLUX.2; Qwen3's ``<|im_start|>`` turns with the empty think block for klein);
- the text encoders are as narrow as diffusers' but as DEEP as the pipelines' default hidden-state layers
  need (30 Mistral layers for (10, 20, 30), 27 Qwen3 layers for (9, 18, 27)), so the adapters run with
  the checkpoints' own defaults, as ``mmrl train diffusion model.path=...`` does;
- the VAEs downsample (scale factor 2) with 2 latent channels, and the FLUX.2 VAE's batch-norm
  statistics are random, so the scale-factor arithmetic, the 2x2 patch order and the de-normalisation
  are exercised; the schedulers are the checkpoints' (FLUX.2-dev: dynamic exponential shift).

16 px images -> FLUX.2 latents (8, 4, 4) = 16 tokens; Kontext latents (2, 8, 8) = 16 tokens (+16 for the
source image).
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<unk>", "[IMG]", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
            "[IMG_BREAK]", "[IMG_END]", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"]
VOCAB_SIZE = 288  # 16 specials + 256 bytes, rounded up

# Mistral-Small-3.1's template, reduced to what Flux2Pipeline sends: a system turn and user turns whose
# content is a list of {"type": "text"} parts (format_input), or a plain string.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['content'] is string %}{% set text = m['content'] %}{% else %}"
    "{% set text = m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{% endif %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif m['role'] == 'user' %}[INST]{{ text }}[/INST]{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)
# Qwen3's template, reduced to what Flux2KleinPipeline sends (one user turn, the generation prompt,
# enable_thinking=False: the empty think block).
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def _byte_bpe():
    """A byte-level BPE over the 256 byte symbols (no merges) with :data:`SPECIALS` as ids 0..15."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    return tokenizer


def mistral_processor():
    """A ``PixtralProcessor`` (what ``AutoProcessor`` gives for FLUX.2-dev's tokenizer/) over the byte BPE."""
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_byte_bpe(), bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        chat_template=MISTRAL_TEMPLATE, model_max_length=512,
    )
    return PixtralProcessor(image_processor=PixtralImageProcessor(), tokenizer=tokenizer, patch_size=16,
                            chat_template=MISTRAL_TEMPLATE)


def qwen3_tokenizer():
    """A ``Qwen2TokenizerFast`` (FLUX.2 [klein]'s tokenizer class) over the byte BPE."""
    from transformers import Qwen2TokenizerFast

    bpe = _byte_bpe()
    return Qwen2TokenizerFast(vocab=bpe.get_vocab(), merges=[], unk_token="<unk>", eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", bos_token=None, chat_template=QWEN3_TEMPLATE,
                              model_max_length=512)


def _flux2_vae():
    """AutoencoderKLFlux2 with scale factor 2, 2 latent channels and random batch-norm statistics."""
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(3)
    vae = AutoencoderKLFlux2(
        sample_size=32, in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(4, 8), layers_per_block=1, latent_channels=2,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
    )
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape) * 0.5)
        vae.bn.running_var.copy_(torch.rand(vae.bn.running_var.shape) + 0.5)
    return vae


def _flux2_transformer(guidance_embeds: bool):
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(0)
    return Flux2Transformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=48, timestep_guidance_channels=256, axes_dims_rope=[4, 4, 4, 4],
        guidance_embeds=guidance_embeds,
    )


def flux2_scheduler():
    """FLUX.2-dev's scheduler_config.json: dynamic shifting with the exponential time shift (the
    pipeline's empirical mu)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, time_shift_type="exponential", base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096,
    )


def build_tiny_flux2(path) -> Path:
    """Flux2Pipeline: a 30-layer width-16 Mistral-3 text encoder (hidden states 10, 20, 30 -> 48-wide prompt
    embeddings), FLUX.2 transformer with a guidance embedding, VAE scale factor 2."""
    from diffusers import Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    transformer = _flux2_transformer(guidance_embeds=True)
    config = Mistral3Config(
        text_config={"model_type": "mistral", "vocab_size": VOCAB_SIZE, "hidden_size": 16, "intermediate_size": 37,
                     "max_position_embeddings": 1024, "num_attention_heads": 4, "num_hidden_layers": 30,
                     "num_key_value_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
                     "sliding_window": None, "bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 4},
        vision_config={"model_type": "pixtral", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4,
                       "intermediate_size": 37, "image_size": 30, "patch_size": 6, "num_channels": 3},
        bos_token_id=2, eos_token_id=3, pad_token_id=4, image_seq_length=4, vision_feature_layer=-1,
        image_token_index=1,
    )
    torch.manual_seed(1)
    text_encoder = Mistral3ForConditionalGeneration(config)
    pipe = Flux2Pipeline(scheduler=flux2_scheduler(), vae=_flux2_vae(), text_encoder=text_encoder,
                         tokenizer=mistral_processor(), transformer=transformer)
    pipe.save_pretrained(path)
    return Path(path)


def build_tiny_flux2_klein(path, distilled: bool = False) -> Path:
    """Flux2KleinPipeline: a 27-layer width-16 Qwen3 text encoder (hidden states 9, 18, 27), FLUX.2
    transformer without guidance embedding; ``distilled``: the step-distilled variant (no CFG)."""
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    transformer = _flux2_transformer(guidance_embeds=False)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE, hidden_size=16, intermediate_size=16, num_hidden_layers=27, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, pad_token_id=13, eos_token_id=12,
    )
    torch.manual_seed(1)
    text_encoder = Qwen3ForCausalLM(config)
    pipe = Flux2KleinPipeline(scheduler=flux2_scheduler(), vae=_flux2_vae(), text_encoder=text_encoder,
                              tokenizer=qwen3_tokenizer(), transformer=transformer, is_distilled=distilled)
    pipe.save_pretrained(path)
    return Path(path)


def build_tiny_flux_kontext(path, schnell: bool = False) -> Path:
    """FluxKontextPipeline over the tests' tiny FLUX.1 components (``diffusion_fixtures.build_tiny_flux``:
    CLIP + T5, 1-channel VAE with scale factor 2, so 16 px -> latents (1, 8, 8) -> 16 packed tokens,
    and 16 more for the source image). Kontext-dev style (guidance embedding, dynamic shifting), or with
    ``schnell=True`` without the guidance embedding (true CFG)."""
    from diffusers import FluxKontextPipeline, FluxPipeline

    from diffusion_fixtures import build_tiny_flux

    flux = FluxPipeline.from_pretrained(build_tiny_flux(Path(path) / "flux", schnell=schnell))
    FluxKontextPipeline(**flux.components).save_pretrained(Path(path) / "kontext")
    return Path(path) / "kontext"
