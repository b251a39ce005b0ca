"""Lean log-probs (logit minus logsumexp, the LM head run in checkpointed chunks) equal the full
log-softmax, entropies and gradients included."""

from __future__ import annotations

import pytest
import torch

from mmrl.vlm.logprobs import token_logprobs


def _reference(hidden, head, targets, temperature, suppressed):
    logits = head(hidden).float()
    if suppressed:
        logits[..., suppressed] = float("-inf")
    logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logps = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    finite = logp_all.clamp(min=torch.finfo(logp_all.dtype).min)
    entropy = -(logp_all.exp() * finite).sum(-1)
    return logps, entropy


@pytest.mark.parametrize("chunk_bytes", [4 * 37 * 3, 2**28])  # several chunks (3 tokens each) / one chunk
@pytest.mark.parametrize("with_entropy", [False, True])
def test_equal_to_the_full_log_softmax_values_and_gradients(chunk_bytes, with_entropy):
    g = torch.Generator().manual_seed(0)
    B, T, H, V = 3, 5, 8, 37
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(H, V, dtype=torch.float64)
    targets = torch.randint(0, V - 2, (B, T), generator=g)
    suppressed, temperature = [V - 1, V - 2], 0.7

    ref_logps, ref_entropy = _reference(hidden, head, targets, temperature, suppressed)
    out = token_logprobs(hidden, head, targets, temperature, suppressed, with_entropy, chunk_bytes=chunk_bytes)
    logps, entropy = out if with_entropy else (out, None)
    torch.testing.assert_close(logps, ref_logps.to(logps.dtype), rtol=1e-6, atol=1e-6)
    ref_loss = ref_logps.sum() + (ref_entropy.sum() if with_entropy else 0)
    loss = logps.sum() + (entropy.sum() if with_entropy else 0)
    if with_entropy:
        torch.testing.assert_close(entropy, ref_entropy.to(entropy.dtype), rtol=1e-6, atol=1e-6)
    ref_grads = torch.autograd.grad(ref_loss, (hidden, head.weight))
    grads = torch.autograd.grad(loss, (hidden, head.weight))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-6, atol=1e-6)


def test_suppressed_tokens_have_no_probability_and_no_nan():
    hidden = torch.randn(1, 2, 4)
    head = torch.nn.Linear(4, 6)
    logps, entropy = token_logprobs(hidden, head, torch.tensor([[0, 1]]), suppressed_ids=[5], with_entropy=True)
    assert torch.isfinite(logps).all() and torch.isfinite(entropy).all()
    full = torch.log_softmax(head(hidden)[..., :5], -1)  # the distribution over the other 5 tokens
    torch.testing.assert_close(logps, full.gather(-1, torch.tensor([[[0], [1]]])).squeeze(-1))
