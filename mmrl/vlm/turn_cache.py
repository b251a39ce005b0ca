"""A trajectory's next turn reads only what is new: the keys/values of the tokens it already
processed are kept from one turn to the next.

In the agent loop (:mod:`mmrl.core.agent_loop`) turn ``t + 1``'s prompt is turn ``t``'s prompt,
its completion and the interaction's answer (a tool's image, a screen), so generating turn
``t + 1`` from scratch computes the whole conversation again, and a trajectory of ``T`` turns costs
``O(T^2)`` prompt tokens and re-encodes every earlier image each turn. A :class:`TurnStore` keeps,
for each sequence the last ``generate`` call processed (prompt + completion), its token ids, its
images and its keys/values; the next call looks up each prompt's longest *reusable* prefix among
them (the prefix-caching idea of vLLM, "Efficient Memory Management for Large Language Model Serving
with PagedAttention", on whole sequences instead of blocks), copies those keys/values and computes
only the rest.

A prefix is reusable when its token ids are equal, and each image whose placeholder tokens lie in
it is the same image (equal pixels and grid: two examples may share a text and not an image); an
image whose placeholders the prefix would cut is computed again whole. Keys/values depend only on
the tokens before them (causal attention; the positions of Qwen-VL's mRoPE are computed left to
right), so the reused ones are those a full pass computes, to float rounding: the old re-read and
this give the same greedy completions and log-probs (tests/test_turn_cache.py). A completion is
matched by its token ids, so where the next prompt tokenizes the message differently the reuse
simply stops there.

The store lives only while the agent loop holds a :meth:`~mmrl.vlm.sampling.VLMSampling.turn_cache`
session: the weights cannot change inside one, and the memory (one KV cache of the last turn) is
released when the loop ends.

The same reuse inside one call (:func:`group_prefill`, ``rollout.group_prefill``): a GRPO group is
G copies of one prompt in the batch, and ``generate`` runs each copy's prompt through the language
model again (the images are encoded once already, :mod:`mmrl.vlm.vision_once`); the distinct prompts
are computed once and their keys/values copied to the copies, as :mod:`mmrl.vlm.shared_prefix` does
for scoring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from .shared_prefix import full_attention, prompt_groups

# Model types whose positions continue through the backbone's ``rope_deltas`` after a cached prefix
# (transformers' Qwen-VL classes: mRoPE, the text after the vision blocks offset by the delta).
TURN_CACHE_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def turn_cache_off(backbone) -> str | None:
    """Why this model's turns cannot reuse keys/values (None: they can)."""
    model_type = backbone.config.model_type.removesuffix("_model")
    if model_type not in TURN_CACHE_MODELS:
        return f"{backbone.config.model_type} is not one of {', '.join(TURN_CACHE_MODELS)} (the mRoPE Qwen-VL models)"
    if not full_attention(backbone):
        return "its sliding-window layers keep only a window of the conversation"
    return None


@dataclass
class Image:
    """One image of a sequence: its placeholder tokens ``[start, end)``, its patches and grid."""

    start: int
    end: int
    pixels: Tensor
    grid: Tensor

    def same(self, other: Image) -> bool:
        return (self.start == other.start and self.end == other.end and torch.equal(self.grid, other.grid)
                and (self.pixels is other.pixels or torch.equal(self.pixels, other.pixels)))


@dataclass
class Tokens:
    """A sequence as the store sees it: its token ids (no padding) and its images in order."""

    ids: Tensor
    images: list[Image]


@dataclass
class Entry:
    """A processed sequence and its keys/values, per layer ``(heads, len(ids), head_dim)``."""

    tokens: Tokens
    keys: list[Tensor]
    values: list[Tensor]


def prompt_tokens(enc: dict, images: Sequence[dict], processor) -> list[Tokens]:
    """Each row of a left-padded batch encoding as :class:`Tokens` (``images``: each row's
    ``pixel_values`` / ``image_grid_thw``, :func:`~mmrl.vlm.family_processing.split_images`)."""
    rows = []
    for i, sample in enumerate(images):
        ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].cpu()
        rows.append(Tokens(ids, image_spans(ids, sample.get("pixel_values"), sample.get("image_grid_thw"),
                                            processor.image_token_id, processor.merge_size)))
    return rows


def image_spans(ids: Tensor, pixels: Tensor | None, grid: Tensor | None, image_token: int, merge: int) -> list[Image]:
    """The images of one sequence: image ``k`` fills the ``k``-th run of ``grid[k].prod() /
    merge**2`` placeholder tokens and the ``k``-th block of ``grid[k].prod()`` patches."""
    if grid is None:
        return []
    where = (ids == image_token).nonzero()[:, 0].tolist()
    out, token, patch = [], 0, 0
    for g in grid:
        patches = int(g.prod())
        count = patches // merge**2
        out.append(Image(where[token], where[token + count - 1] + 1, pixels[patch:patch + patches], g))
        token, patch = token + count, patch + patches
    return out


def reusable(query: Tokens, entry: Tokens, common: int) -> int:
    """How much of ``query``'s first ``common`` tokens (equal to ``entry``'s) may take ``entry``'s
    keys/values: up to the first image that differs, or that the prefix would cut."""
    for k, image in enumerate(query.images):
        if image.start >= common:
            break
        if image.end > common or k >= len(entry.images) or not image.same(entry.images[k]):
            return image.start
    return common


class TurnStore:
    """The keys/values of the sequences the last call processed (module docstring)."""

    def __init__(self):
        self.entries: list[Entry] = []

    def match(self, queries: Sequence[Tokens], limits: Sequence[int]) -> list[tuple[Entry | None, int]]:
        """For each query its entry with the longest reusable prefix, at most ``limits[i]`` tokens
        (a pass must feed at least the prompt's last token): ``(entry, length)``, ``(None, 0)``
        without one."""
        if not self.entries:
            return [(None, 0)] * len(queries)
        width = max(len(e.tokens.ids) for e in self.entries)
        table = torch.full((len(self.entries), width), -1, dtype=torch.long)
        for j, e in enumerate(self.entries):
            table[j, :len(e.tokens.ids)] = e.tokens.ids
        out = []
        for q, limit in zip(queries, limits):
            n = min(limit, width)
            common = (table[:, :n] == q.ids[:n]).long().cumprod(1).sum(1)  # equal leading tokens, per entry
            best: tuple[Entry | None, int] = (None, 0)
            for j in common.argsort(descending=True, stable=True).tolist():
                if int(common[j]) <= best[1]:
                    break
                length = reusable(q, self.entries[j].tokens, int(common[j]))
                if length > best[1]:
                    best = (self.entries[j], length)
            out.append(best)
        return out


def cached_width(rows: Sequence[Tokens], pads: Sequence[int], matched: Sequence[int]) -> int:
    """The columns ``C`` of a left-padded batch that every row can take from the store: row ``i``
    (``pads[i]`` pad columns, ``matched[i]`` reusable tokens) covers ``C <= pads[i] + matched[i]``,
    and no image straddles column ``C`` (it is computed whole, after it)."""
    width = min(p + m for p, m in zip(pads, matched))
    moved = True
    while moved:
        moved = False
        for row, pad in zip(rows, pads):
            for image in row.images:
                if image.start < width - pad < image.end:
                    width, moved = pad + image.start, True
    return width


def assemble(cache_class, matches: Sequence[tuple[Entry | None, int]], pads: Sequence[int], width: int):
    """A key/value cache of ``width`` columns for the padded batch: row ``i``'s columns from
    ``pads[i]`` on are its entry's first keys/values, the pad columns zeros (masked out)."""
    entry = next(e for e, _ in matches if e is not None)
    cache = cache_class()
    for layer in range(len(entry.keys)):
        like = entry.keys[layer]
        keys = like.new_zeros((len(matches), like.shape[0], width, like.shape[-1]))
        values = entry.values[layer].new_zeros(keys.shape)
        for i, ((e, _), pad) in enumerate(zip(matches, pads)):
            if pad < width:
                keys[i, :, pad:] = e.keys[layer][:, :width - pad]
                values[i, :, pad:] = e.values[layer][:, :width - pad]
        cache.update(keys, values, layer)
    return cache


def kept(cache, sequences: Tensor, prompt_width: int, rows: Sequence[Tokens], pads: Sequence[int],
         lengths: Sequence[int]) -> list[Entry]:
    """The entries a ``generate`` call leaves: ``sequences`` is its (B, W + new) output for prompts
    left-padded to ``prompt_width`` = W, ``cache`` its returned cache (``W + new - 1`` columns: the
    last token is never fed), ``lengths`` each completion's tokens. Each row keeps its prompt and
    the completion tokens the cache holds keys/values of."""
    fed = sequences.shape[1] - 1
    out = []
    for i, (row, pad, length) in enumerate(zip(rows, pads, lengths)):
        end = min(prompt_width + length, fed)
        tokens = Tokens(sequences[i, pad:end].clone(), row.images)
        out.append(Entry(tokens, [layer.keys[i, :, pad:end] for layer in cache.layers],
                         [layer.values[i, :, pad:end] for layer in cache.layers]))
    return out


def generation_positions(backbone, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """``(positions, deltas)`` as ``generate`` makes them for a left-padded batch: the (3, B, W)
    mRoPE positions (``get_rope_index`` with images; else each row's count of real tokens before,
    on all three axes) and the (B, 1) offset of the text positions that follow them."""
    mask = inputs["attention_mask"]
    if "image_grid_thw" in inputs:
        return backbone.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                       attention_mask=mask, image_grid_thw=inputs["image_grid_thw"])
    text = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return text.unsqueeze(0).expand(3, -1, -1), torch.zeros(mask.shape[0], 1, dtype=torch.long, device=mask.device)


def group_prefill(backbone, inputs: dict[str, Tensor], rows: Sequence[Tokens], cache_class, keyword: str):
    """The key/value cache of every column of the padded prompts ``inputs`` but the last (as
    :func:`prefill`), each distinct prompt computed once and its
    keys/values copied to the rows that repeat it; None when no two rows are equal (the groups are
    :func:`~mmrl.vlm.shared_prefix.prompt_groups`', as scoring's)."""
    groups = prompt_groups([r.ids for r in rows],
                           [torch.cat([im.pixels for im in r.images]) if r.images else None for r in rows],
                           [torch.stack([im.grid for im in r.images]) if r.images else None for r in rows])
    if groups is None:
        return None
    reps, index = groups
    device = inputs["input_ids"].device
    width = inputs["input_ids"].shape[1]
    positions, deltas = generation_positions(backbone, inputs)
    first = torch.tensor(reps, dtype=torch.long, device=device)
    new = [im for r in reps for im in rows[r].images]
    images = {"pixel_values": torch.cat([im.pixels for im in new]).to(device),
              "image_grid_thw": torch.stack([im.grid for im in new]).to(device)} if new else {}
    once = cache_class()
    backbone(input_ids=inputs["input_ids"][first, :width - 1], attention_mask=inputs["attention_mask"][first, :width - 1],
             position_ids=positions[:, first, :width - 1], mm_token_type_ids=inputs["mm_token_type_ids"][first, :width - 1],
             use_cache=True, **{keyword: once}, **images)
    index = index.to(device)
    cache = cache_class()
    for layer, kv in enumerate(once.layers):
        cache.update(kv.keys.index_select(0, index), kv.values.index_select(0, index), layer)
    backbone.rope_deltas = deltas
    return cache


def prefill(backbone, store: TurnStore, inputs: dict[str, Tensor], rows: Sequence[Tokens], cache_class,
            keyword: str):
    """The key/value cache of every column of the padded prompts ``inputs`` but the last (the one
    ``generate`` then feeds), the columns the store holds copied (:func:`assemble`) and the rest
    computed, each new image encoded once; None when no row can reuse anything.

    ``generate`` goes on from such a cache with the text positions offset by the backbone's
    ``rope_deltas`` (what its own prefill leaves there), so they are set here to this batch's."""
    width = inputs["input_ids"].shape[1]
    pads = [width - len(r.ids) for r in rows]
    matches = store.match(rows, [len(r.ids) - 1 for r in rows])
    cached = cached_width(rows, pads, [m for _, m in matches])
    if cached <= min(pads):
        return None
    positions, deltas = generation_positions(backbone, inputs)
    cache = assemble(cache_class, matches, pads, cached)
    if cached < width - 1:
        new = [im for row, pad in zip(rows, pads) for im in row.images if im.start >= cached - pad]
        images = {"pixel_values": torch.cat([im.pixels for im in new]).to(inputs["input_ids"].device),
                  "image_grid_thw": torch.stack([im.grid for im in new]).to(inputs["input_ids"].device)} if new else {}
        backbone(input_ids=inputs["input_ids"][:, cached:width - 1],
                 attention_mask=inputs["attention_mask"][:, :width - 1],
                 position_ids=positions[:, :, cached:width - 1],
                 mm_token_type_ids=inputs["mm_token_type_ids"][:, cached:width - 1],
                 use_cache=True, **{keyword: cache}, **images)
    backbone.rope_deltas = deltas
    return cache
