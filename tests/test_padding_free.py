"""train.padding_free: a micro-batch's samples packed into one row with per-sample positions
(transformers' packed sequences for the Qwen-VL families). Log-probs, entropies and every gradient
equal the padded forward for Qwen2-VL, Qwen2.5-VL and Qwen3-VL, with images of different sizes,
videos, text-only prompts and LoRA; train.micro_batch_tokens regroups the samples by tokens and a
whole train_step and the no-grad scores stay the padded ones, in batch order."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.config import ConfigError
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.vlm.packing import completion_positions, packed_inputs, token_balanced_micro_batches
from mmrl.vlm.policy import VLMPolicy
from test_shared_prefix import COMPLETIONS, _assert_equal, _groups
from test_shared_prefix import _forward as shared_prefix_forward
from test_static_cache import VIDEO_BUDGET, _prompts
from test_vision_once import family_dirs  # noqa: F401  (the tiny Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoints)


def _forward(policy, batch, packed: bool):
    return shared_prefix_forward(policy, batch, padding_free=packed)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_equal_to_the_padded_forward(family, family_dirs):  # noqa: F811
    """Vision tower trained, temperature 0.7, prompts of two lengths and completions of three."""
    policy = VLMPolicy(make_config(f"model.path={family_dirs[family]}", "train.device=cpu",
                                   "vlm.freeze_vision=false", "rollout.temperature=0.7"))
    batch = _groups(policy)
    packed = _forward(policy, batch, packed=True)
    assert any("visual" in n for n in packed[2]) and any("embed" in n or "lm_head" in n for n in packed[2])
    _assert_equal(packed, _forward(policy, batch, packed=False))


def test_the_packed_row_has_no_padding_and_restarts_positions(random_tiny_dir):
    """Every token of the row is a sample's own (prompt + completion, no pad id), the text
    positions restart at 0 at each sample, and each completion token is predicted from the
    position just before it."""
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu"))
    batch = _groups(policy, copies=2)
    payload = batch.payload
    backbone = policy.module.model
    inputs, ends = packed_inputs(policy.processor, payload["prompt_ids"], payload["completion_ids"], payload,
                                 backbone.get_rope_index)
    lengths = [len(p) + len(c) for p, c in zip(payload["prompt_ids"], payload["completion_ids"])]
    assert inputs["input_ids"].shape == (1, sum(lengths)) and "attention_mask" not in inputs
    assert inputs["position_ids"].shape == (4, 1, sum(lengths))
    assert inputs["position_ids"][0, 0].tolist() == [t for n in lengths for t in range(n)]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    assert ends.tolist() == [s + len(p) - 1 for s, p in zip(starts, payload["prompt_ids"])]
    assert policy.pad_id not in inputs["input_ids"][0].tolist()
    index = completion_positions(ends[:2], [3, 1], width=4)
    assert index.tolist() == [[ends[0], ends[0] + 1, ends[0] + 2, ends[0] + 2], [ends[1]] * 4]


@pytest.mark.slow
def test_videos_and_text_only_prompts(random_tiny_dir):
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", *VIDEO_BUDGET))
    examples, prompts = _prompts("video")
    batch = policy.rollout_given(examples, prompts, [COMPLETIONS[k % 3] for k in range(len(prompts))],
                                 need_old_logps=False, need_ref_logps=False)
    assert any(v is not None for v in batch.payload["video"])
    _assert_equal(_forward(policy, batch, packed=True), _forward(policy, batch, packed=False))
    text = [[{"role": "user", "content": "Count the shapes."}], [{"role": "user", "content": "Where is it? Answer."}]]
    batch = policy.rollout_given([{}] * 4, [text[i % 2] for i in range(4)], [COMPLETIONS[k % 3] for k in range(4)],
                                 need_old_logps=False, need_ref_logps=False)
    _assert_equal(_forward(policy, batch, packed=True), _forward(policy, batch, packed=False))


def test_token_balanced_micro_batches_by_hand():
    """Lengths 5, 3, 4, 2 under 7 tokens: longest first, 5 -> A, 4 -> B, 3 -> B (7), 2 -> A (7).
    At most 2 samples and no token limit: 5 -> A, 4 -> A (full), 3 -> B, 2 -> B."""
    assert token_balanced_micro_batches([5, 3, 4, 2], max_tokens=7, max_samples=16) == [[0, 3], [1, 2]]
    assert token_balanced_micro_batches([5, 3, 4, 2], max_tokens=100, max_samples=2) == [[0, 2], [1, 3]]
    assert token_balanced_micro_batches([9, 1], max_tokens=4, max_samples=8) == [[0], [1]]  # too long: alone


@pytest.mark.slow
def test_lora_scores_in_batch_order_with_token_micro_batches(random_tiny_dir):
    """LoRA, micro-batches of at most 200 tokens (the 6 samples have 92, 88, 107, 104, 100 and 119:
    groups [0, 2], [1, 3], [4], [5]): the policy's and the reference's scores equal the padded
    micro-batches', row for row."""
    scores = {}
    for packed in (False, True):
        overrides = ("train.padding_free=true", "train.micro_batch_tokens=200") if packed else ()
        policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "model.lora.enabled=true",
                                       "model.lora.r=4", "train.micro_batch_size=4", *overrides))
        batch = _groups(policy)
        if packed:
            lengths = [len(p) + len(c) for p, c in zip(batch.payload["prompt_ids"], batch.payload["completion_ids"])]
            assert lengths == [92, 88, 107, 104, 100, 119]
            assert [rows for rows, _ in policy._micro_batches(batch)] == [[0, 2], [1, 3], [4], [5]]
        scores[packed] = (policy.score(batch, reference=False), policy.score(batch, reference=True))
    for a, b in zip(scores[True], scores[False]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [0, 200])
def test_train_step_equal(random_tiny_dir, tokens):
    """A whole train_step (clipped loss, KL to the reference, entropy bonus, a top-entropy token
    selection made on the whole mini-batch) padded, and packed: with the same micro-batches every
    metric is equal; regrouped by tokens, the loss (the sum of the micro-batches' terms, each
    normalised by the mini-batch) and the gradient norm are (the other metrics are means over
    micro-batches, so they depend on the grouping)."""
    metrics, batch = {}, None
    for packed in (False, True):
        overrides = ("train.padding_free=true", f"train.micro_batch_tokens={tokens}") if packed else ()
        policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "vlm.freeze_vision=false",
                                       "algo.beta=0.04", "train.micro_batch_size=4", *overrides))
        if batch is None:
            batch = _groups(policy)
            batch.off_policy = None
            noise = 0.25 * torch.randn(batch.action_mask.shape, generator=torch.Generator().manual_seed(0))
            batch.old_logps = policy.score(batch, reference=False) + noise
            batch.ref_logps = policy.score(batch, reference=True) + 0.02
            batch.advantages = torch.tensor([1.0, -0.5, -0.5, 0.8, 0.2, -1.0])
        policy.configure_optimizer(policy.cfg.train, 2)
        objective = Objective(ObjectiveConfig(beta=0.04, entropy_coef=0.01, top_entropy_quantile=0.5))
        metrics[packed] = policy.train_step(batch, objective, float(batch.action_mask.sum()), 6.0)
    assert metrics[False]["grad_norm"] > 0 and metrics[False]["clip_frac_low"] > 0
    for key in (metrics[False] if not tokens else ("loss", "grad_norm")):
        assert metrics[True][key] == pytest.approx(metrics[False][key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("overrides,message", [
    (("train.padding_free=true", "train.shared_prefix=true"), "choose one|set one of them to false"),
    (("train.micro_batch_tokens=512",), "read only with train.padding_free=true"),
    (("train.padding_free=true", "train.micro_batch_tokens=-1"), "expected 0"),
])
def test_combinations_that_cannot_be_honoured_are_refused(random_tiny_dir, overrides, message):
    with pytest.raises(ConfigError, match=message):
        VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", *overrides))


def test_a_generator_run_refuses_the_keys():
    from mmrl.config import check_unused_keys
    from mmrl.diffusion.policy import DiffusionPolicy

    for key in ("train.padding_free=true", "train.micro_batch_tokens=64"):
        with pytest.raises(ConfigError, match=key.split("=")[0]):
            check_unused_keys(make_config(key), DiffusionPolicy.unused_config, "a DiffusionPolicy")


def test_without_flash_attention_the_run_is_warned_what_it_costs(random_tiny_dir, caplog):
    """sdpa/eager attention gives the packed row an (L, L) mask: slower than padding on CPU."""
    with caplog.at_level("WARNING", logger="mmrl"):
        VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "train.padding_free=true"))
    assert "flash_attention_2" in caplog.text and "4.9x" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="mmrl"):
        VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu"))
    assert "padding_free" not in caplog.text
