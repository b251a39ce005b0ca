"""Stop texts (a tool task's ``</tool_call>``): generation ends where the model writes one, the
sample keeps the text and is not truncated; the HF engine (transformers' ``stop_strings``) on the
random tiny model, and the length rule every engine shares."""

from __future__ import annotations

import torch

from conftest import make_config


def _policy(path):
    from mmrl.vlm.policy import VLMPolicy

    return VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", "rollout.max_completion_length=24"))


def _prompt(policy):
    from PIL import Image

    return [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (56, 56), "white")},
                                         {"type": "text", "text": "How many shapes are there?"}]}]


def test_the_length_ends_at_the_token_that_completes_a_stop_text_not_at_the_padding(random_tiny_dir):
    """Padding after a stopped sample may be a stop token itself (Qwen pads with <|endoftext|>):
    the text decides where the sample ends."""
    policy = _policy(random_tiny_dir)
    tok = policy.tokenizer
    written = tok("count 3 </tool_call>", add_special_tokens=False)["input_ids"]
    after = tok(" more", add_special_tokens=False)["input_ids"]
    pad = [policy.pad_id] * 3
    ids = torch.tensor(written + after + pad)
    engine = policy.engine
    assert engine.completion_length(ids, ("</tool_call>",)) == (len(written), True)
    # without the stop text the sample runs to its first stop token: the padding, here
    assert policy.pad_id in policy.eos_ids
    assert engine.completion_length(ids) == (len(written) + len(after) + 1, True)
    # a stop text after the end of turn does not count
    end = sorted(policy.eos_ids)[0]
    ids = torch.tensor(tok("3", add_special_tokens=False)["input_ids"] + [end] + written)
    assert engine.completion_length(ids, ("</tool_call>",))[0] == len(ids) - len(written)


def test_hf_generation_stops_at_a_stop_text_and_the_sample_is_not_truncated(random_tiny_dir):
    """Samples of one prompt from the same seed with and without a stop text taken from the free
    sample: the stopped one is the free one's tokens up to the one that completes the text, not
    truncated, its log-probs those of the same positions."""
    policy = _policy(random_tiny_dir)
    ex, prompt = {"id": 0}, _prompt(policy)
    torch.manual_seed(3)
    free = policy.rollout([ex], [prompt], 1, "train", need_old_logps=True)
    ids = free.payload["completion_ids"][0]
    assert len(ids) >= 12, "the random model stopped too early to test"
    head = policy.decode(ids[:len(ids) // 2])
    stop = next(head[-n:] for n in range(4, len(head) + 1) if head.find(head[-n:]) == len(head) - n)
    torch.manual_seed(3)
    stopped = policy.rollout([ex], [prompt], 1, "train", need_old_logps=True, stop=(stop,))
    got = stopped.payload["completion_ids"][0]
    assert len(got) <= len(ids) // 2 and torch.equal(got, ids[:len(got)])
    assert stop in policy.decode(got) and stop not in policy.decode(got[:-1])
    assert not stopped.truncated.any() and int(stopped.action_mask.sum()) == len(got)
    assert torch.allclose(stopped.old_logps[0, :len(got)], free.old_logps[0, :len(got)], atol=1e-5)
