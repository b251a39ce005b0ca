"""A VLM policy's scoring: token log-probs of a batch's completions, and the loss on them.

The batch's payload (:func:`mmrl.vlm.sampling.payload_keys`) is collated into one left-padded
prompt block and right-padded completions; the LM head runs chunk by chunk
(:mod:`mmrl.vlm.logprobs`), with shared prefixes (:mod:`mmrl.vlm.shared_prefix`) when configured.
``score`` is the no-grad pass (old and reference log-probs); ``loss_terms`` yields the core
objective's loss per micro-batch, with batch-dependent token selections made once per mini-batch.

:class:`VLMScoring` is a part of :class:`~mmrl.vlm.policy.VLMPolicy`; it reads what the policy
and :class:`~mmrl.core.policy.PolicyBase` set up: ``cfg``, ``module``, ``processor``, ``pad_id``,
``suppressed_ids``, ``device``, ``micro_batch_size``, ``forward``, ``reference``, ``autocast``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..core import distributed as dist
from ..core.losses import TokenSelection, select_tokens
from ..core.rollouts import Rollouts
from .logprobs import split_head, token_logprobs
from .packing import completion_positions, packed_inputs, token_balanced_micro_batches
from .family_processing import join_images
from .shared_prefix import prompt_groups, shared_prefix_hidden


class VLMScoring:
    """Log-probs, scoring and loss terms of :class:`~mmrl.vlm.policy.VLMPolicy`."""

    # -- scoring ----------------------------------------------------------------------------------
    def _collate(self, batch: Rollouts) -> tuple[dict[str, torch.Tensor], int]:
        """Prompt left-padded to a common width P, completion right-padded after it.

        Completion token t of every sample then sits at column P + t, so its logit is at P + t - 1.
        """
        prompts = batch.payload["prompt_ids"]
        comps = batch.payload["completion_ids"]
        P = max(len(p) for p in prompts)
        T = batch.action_mask.shape[1]
        ids = torch.full((len(batch), P + T), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), P + T), dtype=torch.long)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            ids[i, P - len(p):P] = p
            attn[i, P - len(p):P] = 1
            ids[i, P:P + len(c)] = c
            attn[i, P:P + len(c)] = 1
        inputs = {"input_ids": ids, "attention_mask": attn, **self.processor.token_inputs(ids),
                  **join_images(batch.payload, self.processor.family)}
        return {k: v.to(self.device) for k, v in inputs.items()}, P

    def _targets(self, batch: Rollouts) -> torch.Tensor:
        """(N, T) completion tokens, right-padded with the pad id."""
        targets = torch.full((len(batch), batch.action_mask.shape[1]), self.pad_id, dtype=torch.long)
        for i, c in enumerate(batch.payload["completion_ids"]):
            targets[i, :len(c)] = c
        return targets.to(self.device)

    def _padded_hidden(self, backbone, batch: Rollouts) -> torch.Tensor:
        """(N, T, H): the hidden states predicting each completion token, padded layout."""
        inputs, P = self._collate(batch)
        T = batch.action_mask.shape[1]
        payload = batch.payload
        videos = payload.get("video")
        groups = prompt_groups(payload["prompt_ids"], payload["pixel_values"], payload["image_grid_thw"], videos) \
            if self.shared_prefix else None
        if groups is None:
            return backbone(**inputs, use_cache=False).last_hidden_state[:, P - 1:P - 1 + T]
        return shared_prefix_hidden(backbone, inputs, P, T, groups, payload["pixel_values"], payload["image_grid_thw"],
                                    videos)

    def _packed_hidden(self, backbone, batch: Rollouts) -> torch.Tensor:
        """(N, T, H): the same hidden states from one packed row (:mod:`mmrl.vlm.packing`)."""
        payload = batch.payload
        inputs, ends = packed_inputs(self.processor, payload["prompt_ids"], payload["completion_ids"], payload,
                                     backbone.get_rope_index)
        hidden = backbone(**{k: v.to(self.device) for k, v in inputs.items()}, use_cache=False).last_hidden_state[0]
        index = completion_positions(ends, [len(c) for c in payload["completion_ids"]], batch.action_mask.shape[1])
        return hidden[index.to(hidden.device)]

    def completion_logps(self, model, batch: Rollouts, with_entropy: bool = False):
        """Per-token log-probs (N, T) of the completions under ``model`` (temperature-scaled);
        with ``with_entropy`` also the per-token entropy of the full next-token distribution.
        The LM head runs chunk by chunk (:mod:`mmrl.vlm.logprobs`): no (N, T, V) float32 copy.
        With ``train.shared_prefix`` each distinct prompt of the batch runs once and its samples'
        completions attend to its cached keys/values (:mod:`mmrl.vlm.shared_prefix`, exact); with
        ``train.padding_free`` the samples run packed in one row (:mod:`mmrl.vlm.packing`, exact).
        Call it under :meth:`autocast` (``train_step`` and :meth:`score` do)."""
        hidden, head = self._completion_hidden(model, batch)
        out = token_logprobs(hidden, head, self._targets(batch), self.cfg.rollout.temperature, self.suppressed_ids,
                             with_entropy)
        mask = batch.action_mask.to(hidden.device)
        if not with_entropy:
            return out * mask
        logps, entropy = out
        return logps * mask, entropy * mask

    def _completion_hidden(self, model, batch: Rollouts):
        """``(hidden, lm_head)``: the (N, T, H) hidden states that predict the completion tokens
        (padded or packed) and the head that maps them to the vocabulary."""
        backbone, head = split_head(model)
        return (self._packed_hidden if self.cfg.train.padding_free else self._padded_hidden)(backbone, batch), head

    def _fused_loss(self, batch: Rollouts, obj_cfg, num_tokens: float, num_seqs: float):
        """The objective's loss on ``batch`` through Liger's fused head and loss
        (``train.use_liger_loss``, :mod:`mmrl.vlm.liger`): run inside :meth:`forward`, so a sharded
        head is whole while it is read."""
        from .liger import fused_loss

        if batch.off_policy is not None and bool(batch.off_policy.any()):
            raise ValueError("train.use_liger_loss=true: off-policy rows (LUFFY's shaped loss) are not in Liger's "
                             "loss; set train.use_liger_loss=false")
        hidden, head = self._completion_hidden(self.module, batch)
        dev = hidden.device
        return fused_loss(hidden, head, self._targets(batch), batch.action_mask.to(dev), batch.advantages.to(dev),
                          None if batch.old_logps is None else batch.old_logps.to(dev),
                          None if batch.rollout_logps is None else batch.rollout_logps.to(dev), obj_cfg,
                          num_tokens, num_seqs, self.cfg.rollout.temperature, self.suppressed_ids)

    def _micro_batches(self, batch: Rollouts):
        """``(rows, sub-batch)`` per forward: ``micro_batch_size`` samples in batch order, or with
        ``train.micro_batch_tokens`` (padding-free) groups of at most that many tokens."""
        mb = self.micro_batch_size
        budget = self.cfg.train.micro_batch_tokens
        if budget:
            lengths = [len(p) + len(c) for p, c in zip(batch.payload["prompt_ids"], batch.payload["completion_ids"])]
            groups = token_balanced_micro_batches(lengths, budget, mb)
        else:
            groups = [list(range(start, min(start + mb, len(batch)))) for start in range(0, len(batch), mb)]
        for rows in groups:
            yield rows, batch.select(rows)

    @staticmethod
    def _in_batch_order(parts: list[tuple[list[int], torch.Tensor]]) -> torch.Tensor:
        """Per-micro-batch results put back in the batch's row order."""
        rows = [r for rs, _ in parts for r in rs]
        values = torch.cat([v for _, v in parts])
        out = torch.empty_like(values)
        out[torch.tensor(rows)] = values
        return out

    @torch.no_grad()
    def score(self, batch: Rollouts, reference: bool) -> torch.Tensor:
        """Log-probs of the whole batch without gradient, in micro-batches."""
        parts = []
        ctx = self.reference() if reference else contextlib.nullcontext(self.module)
        with ctx as model:
            model.eval()
            for rows, sub in self._micro_batches(batch):
                with self.autocast():
                    parts.append((rows, self.completion_logps(model, sub).cpu()))
        return self._in_batch_order(parts)

    # -- training -------------------------------------------------------------------------------
    def loss_terms(self, batch: Rollouts, objective, num_tokens: float, num_seqs: float):
        """The objective's loss per micro-batch. Batch-dependent token selections (top-entropy
        tokens, Clip-Cov/KL-Cov) are computed once on the whole mini-batch first (a no-grad pass),
        then sliced per micro-batch, so gradient accumulation stays exact."""
        obj_cfg = objective.cfg
        selection = self._selection(batch, obj_cfg) if obj_cfg.needs_selection else None
        self.module.train()
        for rows, sub in self._micro_batches(batch):
            if self.cfg.train.use_liger_loss:
                yield self.forward(self._fused_loss, sub, obj_cfg, num_tokens, num_seqs)
                continue
            entropies = None
            if obj_cfg.needs_entropy:
                logps, entropies = self.forward(self.completion_logps, self.module, sub, with_entropy=True)
                if not obj_cfg.entropy_coef:
                    entropies = entropies.detach()
            else:
                logps = self.forward(self.completion_logps, self.module, sub)
            dev = logps.device
            extra: dict[str, Any] = {}
            if entropies is not None:
                extra["entropies"] = entropies
            if selection is not None:
                extra["selection"] = selection[rows].to(dev)
            if sub.off_policy is not None:
                extra["off_policy"] = sub.off_policy.to(dev)
            yield objective(
                logps,
                None if sub.old_logps is None else sub.old_logps.to(dev),
                sub.advantages.to(dev),
                sub.action_mask.to(dev),
                ref_logps=None if sub.ref_logps is None else sub.ref_logps.to(dev),
                rollout_logps=None if sub.rollout_logps is None else sub.rollout_logps.to(dev),
                num_tokens=num_tokens, num_seqs=num_seqs, **extra,
            )

    @torch.no_grad()
    def _selection(self, batch: Rollouts, obj_cfg):
        """Token selections of the whole mini-batch under the current weights."""
        self.module.eval()
        logps, ents = [], []
        for rows, sub in self._micro_batches(batch):
            with self.autocast():
                lp, ent = self.completion_logps(self.module, sub, with_entropy=True)
            logps.append((rows, lp.cpu()))
            ents.append((rows, ent.cpu()))
        logps, ents = self._in_batch_order(logps), self._in_batch_order(ents)
        old = batch.old_logps if batch.old_logps is not None else logps
        if dist.world_size() > 1:
            return _selection_across_ranks(obj_cfg, logps, old, batch.advantages, batch.action_mask, ents)
        return select_tokens(obj_cfg, logps, old, batch.advantages, batch.action_mask, ents)




def _selection_across_ranks(obj_cfg, logps, old, advantages, mask, ents) -> TokenSelection:
    """The token selections of the global mini-batch, as one process would make them: every rank's
    rows are gathered (right-padded to the longest completion), rank 0 selects on the whole
    (quantile threshold, covariance means, Clip-Cov's random pick, KL-Cov's top-k) and broadcasts,
    and each rank keeps its own rows. Selecting on each rank's share would give every rank its own
    threshold."""
    parts = dist.gather([t.detach().cpu() for t in (logps, old, advantages, mask, ents)])
    if dist.is_main():
        width = max(p[3].shape[1] for p in parts)

        def cat(i: int) -> torch.Tensor:
            xs = [p[i] for p in parts]
            if xs[0].dim() == 1:  # sequence advantages
                return torch.cat(xs)
            return torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in xs])

        whole = select_tokens(obj_cfg, cat(0), cat(1), cat(2), cat(3), cat(4))
        bounds, start = [], 0
        for p in parts:
            bounds.append((start, start + p[3].shape[0], p[3].shape[1]))
            start += p[3].shape[0]
        shares = [whole[lo:hi, :width_r] for lo, hi, width_r in bounds]
    else:
        shares = None
    return dist.broadcast(shares)[dist.rank()]
