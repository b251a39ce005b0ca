"""Per-token log-probs without full-vocabulary float32 copies.

``log_softmax(logits.float())`` over a (B, T, V) tensor holds two float32 copies of every logit:
at micro-batch 16, 257 tokens and Qwen's 151,936-token vocabulary that is 2.3 GiB each. The
selected token's log-prob is ``logit[target] - logsumexp(logits)``, so here the language-model
head runs on chunks of hidden states; each chunk's logits live only while its log-probs (and,
when asked, entropies) are computed, and under autograd they are recomputed in the backward pass
(activation checkpointing) instead of being stored. Values equal ``log_softmax(...).gather(...)``
to float rounding (a test checks it, gradients included).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# Float32 logits of one chunk: about this many bytes (e.g. ~440 tokens of a 151,936-token vocabulary).
CHUNK_BYTES = 256 * 2**20


def split_head(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(backbone, lm_head)`` of a transformers causal VLM (peft-wrapped or not): the backbone
    returns hidden states, the head maps them to the vocabulary."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


def _chunk_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                    suppressed: Tensor | None, with_entropy: bool) -> Tensor:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if suppressed is not None:
        logits = logits.index_fill(-1, suppressed, float("-inf"))
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logps = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logps
    probs = torch.exp(logits - lse.unsqueeze(-1))
    # Suppressed tokens have -inf logits and probability 0: their term is 0, not 0 * inf.
    entropy = lse - (probs * logits.masked_fill(torch.isinf(logits), 0.0)).sum(-1)
    return torch.stack((logps, entropy), dim=-1)


def token_logprobs(hidden: Tensor, lm_head: torch.nn.Module, targets: Tensor, temperature: float = 1.0,
                   suppressed_ids: Sequence[int] = (), with_entropy: bool = False,
                   chunk_bytes: int = CHUNK_BYTES) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probs (B, T) of ``targets`` under ``lm_head(hidden)`` scaled by ``temperature``, the
    ``suppressed_ids`` masked out of the distribution; with ``with_entropy`` also the entropy of
    each position's full distribution. Float32 results; ``hidden`` (B, T, H) in any dtype."""
    B, T, H = hidden.shape
    vocab = lm_head.weight.shape[0]
    flat_h, flat_t = hidden.reshape(B * T, H), targets.reshape(B * T)
    suppressed = torch.tensor(list(suppressed_ids), dtype=torch.long, device=hidden.device) if suppressed_ids else None
    step = max(1, chunk_bytes // (4 * vocab * (2 if with_entropy else 1)))
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or lm_head.weight.requires_grad)
    parts = []
    for start in range(0, B * T, step):
        args = (flat_h[start:start + step], lm_head.weight, lm_head.bias, flat_t[start:start + step],
                temperature, suppressed, with_entropy)
        if needs_grad:
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*args))
    out = torch.cat(parts).reshape(B, T, *([2] if with_entropy else []))
    return (out[..., 0], out[..., 1]) if with_entropy else out
