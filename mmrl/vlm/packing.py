"""Padding-free scoring (``train.padding_free``): a micro-batch's samples packed into one row.

Why: the padded layout (:meth:`~mmrl.vlm.scoring.VLMScoring._collate`) gives every sample the
longest prompt plus the longest completion of its micro-batch, so short samples carry padding
through every projection, MLP and stored activation. Packed, each sample contributes only its own
prompt and completion tokens: ``[p0 c0 p1 c1 ...]`` in one row.

How it stays exact: transformers' packed-sequence support for the Qwen-VL families. The model gets
``position_ids`` of shape (4, 1, L): the first row the text positions, restarting at 0 for each
sample (transformers' ``find_packed_sequence_indices`` reads the restarts and builds a
block-diagonal causal mask, so no sample attends to another; with ``flash_attention_2`` it runs
the variable-length kernel instead of a mask), and three mRoPE rows, each sample's own from the
model's ``get_rope_index`` (images and videos placed as in its unpacked forward). Log-probs and
gradients equal the padded forward to float rounding (``tests/test_padding_free.py``).

What it saves depends on the attention: with ``flash_attention_2`` (a GPU) attention costs only the
samples' own lengths; with ``sdpa`` or ``eager`` transformers materialises one (L, L) mask and
attention runs over the whole packed row, so only the projections and MLPs lose their padding.

``train.micro_batch_tokens`` then forms micro-batches by tokens instead of sample counts
(:func:`token_balanced_micro_batches`), so a micro-batch of long samples is not as wide as one of
short ones.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .processing import batch_vision_inputs, join_videos


def packed_inputs(processor, prompts: Sequence[torch.Tensor], comps: Sequence[torch.Tensor], payload: dict,
                  rope_index) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The packed row's model inputs (``input_ids`` (1, L), 4-row ``position_ids``, vision inputs;
    no attention mask: the positions carry the packing) and ``ends`` (N,): the index in the row
    of each sample's last prompt token, whose hidden state predicts its first completion token.
    ``rope_index`` is the model's ``get_rope_index``."""
    rows = [torch.cat([p, c.to(p.dtype)]) for p, c in zip(prompts, comps)]
    input_ids = torch.cat(rows)[None]
    token_types = processor.token_types(input_ids)
    videos = payload.get("video") or [None] * len(rows)
    text, mrope, ends, start = [], [], [], 0
    for i, row in enumerate(rows):
        grid, video, end = payload["image_grid_thw"][i], videos[i], start + len(row)
        if grid is None and video is None:  # text only: the three rows are the text positions
            mrope.append(torch.arange(len(row)).view(1, 1, -1).expand(3, 1, -1))
        else:
            vid = join_videos([video])
            pos, _ = rope_index(input_ids=row[None], mm_token_type_ids=token_types[:, start:end], image_grid_thw=grid,
                                video_grid_thw=vid.get("video_grid_thw"),
                                second_per_grid_ts=vid.get("second_per_grid_ts"),
                                attention_mask=torch.ones_like(row[None]))
            mrope.append(pos.cpu())
        text.append(torch.arange(len(row)))
        ends.append(start + len(prompts[i]) - 1)
        start = end
    position_ids = torch.cat([torch.cat(text).view(1, 1, -1), torch.cat(mrope, dim=2).to(torch.long)], dim=0)
    inputs = {"input_ids": input_ids, "position_ids": position_ids, "mm_token_type_ids": token_types,
              **batch_vision_inputs(payload)}
    return inputs, torch.tensor(ends)


def completion_positions(ends: torch.Tensor, lengths: Sequence[int], width: int) -> torch.Tensor:
    """(N, width) indices into the packed row of the hidden states that predict each completion
    token: ``ends[i] + t`` for ``t < lengths[i]``; past a completion's end the index repeats its
    last position (those log-probs are masked out by the action mask)."""
    t = torch.arange(width).view(1, -1)
    last = torch.tensor([max(n - 1, 0) for n in lengths]).view(-1, 1)
    return ends.view(-1, 1) + torch.minimum(t, last)


def token_balanced_micro_batches(lengths: Sequence[int], max_tokens: int, max_samples: int) -> list[list[int]]:
    """Rows grouped so each group holds at most ``max_tokens`` tokens and ``max_samples`` samples
    (a longer sample goes alone): first-fit over the samples longest first, each group's rows in
    batch order, groups ordered by their first row. Deterministic."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for g, rows in enumerate(groups):
            if loads[g] + lengths[i] <= max_tokens and len(rows) < max_samples:
                rows.append(i)
                loads[g] += lengths[i]
                break
        else:
            groups.append([i])
            loads.append(lengths[i])
    return sorted((sorted(rows) for rows in groups), key=lambda rows: rows[0])
