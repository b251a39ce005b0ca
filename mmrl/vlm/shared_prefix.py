"""The shared prompt of a group runs through the language model once, not once per sample.

A GRPO group is G completions of one prompt (one image or video). The plain forward runs prompt plus
completion for each of the G samples, so the prompt (image tokens included, often most of the
sequence) is computed G times. "Prefix Grouper: Efficient GRPO Training through Shared-Prefix
Forward" (2025) computes the prompt once per group and lets the G completions attend to it.

Here that is done with transformers' own key/value cache, under autograd:

1. the distinct prompts of the micro-batch (equal ``prompt_ids``, pixels and image grid) run
   once each, left-padded to the batch's prompt width P, with ``use_cache=True``;
2. the cache rows are repeated to the samples (``index_select`` with each sample's
   prompt index): the same key/value tensors, so autograd sums the G uses of each prompt's
   keys and values and the gradients are those of the per-sample forward;
3. the completions run on that cache with the per-sample attention mask (prompt columns, then
   the completion's own) and the position ids the plain forward would use: for the mRoPE
   families they come from the model's ``get_rope_index`` on the whole plain batch, so the
   completion's text positions continue after the vision block exactly as there.

The hidden state that predicts completion token 0 is the prompt's last one; token t > 0 is
predicted from completion position t - 1, so the last completion token is never fed. Equal to
the plain forward to float rounding, log-probs, entropies and gradients (tests/test_shared_prefix.py,
Qwen2-VL, Qwen2.5-VL and Qwen3-VL).

What is not shared: the completion forward still reads the repeated prompt keys/values of every
sample (memory of one (N, heads, P + T, head_dim) pair per layer, as in the plain forward); the
prompt's MLP, projections and their stored activations are computed once per distinct prompt.

Under gradient checkpointing (``train.gradient_checkpointing``) the backward pass runs each layer's
forward again, cache update included; transformers' own cache would then grow a second time, so
its checkpointed layers drop any cache they are handed. The two passes here use caches whose
update answers a replay exactly as the first call: the prompt's keeps the first keys/values it is
given, the completions' reads the prompt's and stores nothing (:class:`_PromptLayer`,
:class:`_PrefixLayer`), and the layers are told they may keep them
(:func:`~mmrl.core.library_internals.cache_kept_under_checkpointing`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from ..core.library_internals import cache_kept_under_checkpointing
from .kv_cache import cache_keyword
from .processing import join_videos


def prompt_groups(prompt_ids: Sequence[Tensor], pixel_values: Sequence[Tensor | None],
                  grids: Sequence[Tensor | None],
                  videos: Sequence[dict | None] | None = None) -> tuple[list[int], Tensor] | None:
    """``(representatives, index)``: the first row of each distinct prompt, and for each row the
    position of its prompt in ``representatives``. Prompts are equal when their token ids, pixels
    and image grids are, and their videos' inputs (two examples may share a text but not an image).
    None when no two rows share a prompt: then there is nothing to save and the plain forward runs."""
    reps: list[int] = []
    index: list[int] = []
    buckets: dict[tuple, list[int]] = {}
    videos = videos or [None] * len(prompt_ids)
    for i, ids in enumerate(prompt_ids):
        key = (len(ids), int(ids.sum()), None if grids[i] is None else tuple(grids[i].flatten().tolist()),
               None if videos[i] is None else tuple(videos[i]["video_grid_thw"].flatten().tolist()))
        match = next((g for g in buckets.get(key, ()) if _same(i, reps[g], prompt_ids, pixel_values, videos)), None)
        if match is None:
            match = len(reps)
            reps.append(i)
            buckets.setdefault(key, []).append(match)
        index.append(match)
    if len(reps) == len(prompt_ids):
        return None
    return reps, torch.tensor(index, dtype=torch.long)


def _same(i: int, j: int, prompt_ids, pixel_values, videos) -> bool:
    if not torch.equal(prompt_ids[i], prompt_ids[j]) or not _equal(pixel_values[i], pixel_values[j]):
        return False
    a, b = videos[i], videos[j]
    return (a is None and b is None) or (a is not None and b is not None and a.keys() == b.keys()
                                         and all(_equal(a[k], b[k]) for k in a))


def _equal(a: Tensor | None, b: Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape and torch.equal(a, b))


def _partial_layers(backbone) -> list[str]:
    """The kinds of decoder layer whose cache keeps only a window (empty: every layer full attention)."""
    config = getattr(backbone.config, "text_config", backbone.config)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if getattr(config, "use_sliding_window", False):
        return sorted(set(layer_types) | {"sliding_attention"})
    return sorted({t for t in layer_types if t != "full_attention"})


def full_attention(backbone) -> bool:
    """Whether every decoder layer attends to the whole sequence (a cache then holds all of it)."""
    return not _partial_layers(backbone)


def check_supported(backbone) -> None:
    """Refuse models whose cache would not hold the whole prompt (sliding-window layers keep
    only the window, so completions would see less than in the plain forward)."""
    if partial := _partial_layers(backbone):
        raise ValueError("train.shared_prefix=true needs full-attention layers in every decoder layer; this "
                         f"model ({backbone.config.model_type}) has sliding-window layers {partial}. "
                         "Set train.shared_prefix=false")


def uses_shared_prefix(setting: bool | None, padding_free: bool, backbone, family_off: str | None = None) -> bool:
    """``train.shared_prefix`` as a run applies it: true (checked against the model) or false as
    set; unset, on wherever it applies (every layer full attention, and no ``train.padding_free``,
    which shares work its own way). Exact either way; measured faster on the tiny default.
    ``family_off``: why the model's family does not allow it (:mod:`mmrl.vlm.families`), or None;
    then unset is false and true is refused with that reason."""
    if family_off is not None:
        if setting:
            raise ValueError(f"train.shared_prefix=true: {family_off}. Set train.shared_prefix=false")
        return False
    if setting is None:
        return not padding_free and not _partial_layers(backbone)
    if setting:
        check_supported(backbone)
    return setting


def plain_positions(backbone, inputs: dict[str, Tensor]) -> Tensor:
    """The (3, N, L) position ids the plain forward of ``inputs`` uses: the model's
    ``get_rope_index`` (mRoPE: 3D positions in the vision blocks, text after them) when there are
    images or videos, else ``arange(L)`` on every row (the text model's own default)."""
    ids = inputs["input_ids"]
    grids = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in inputs}
    if "image_grid_thw" in grids or "video_grid_thw" in grids:
        positions, _ = backbone.get_rope_index(ids, mm_token_type_ids=inputs["mm_token_type_ids"],
                                               attention_mask=inputs["attention_mask"], **grids)
        return positions
    return torch.arange(ids.shape[1], device=ids.device).view(1, 1, -1).expand(3, ids.shape[0], -1)


def shared_prefix_hidden(backbone, inputs: dict[str, Tensor], prompt_len: int, num_targets: int,
                         groups: tuple[list[int], Tensor], pixel_values: Sequence[Tensor | None],
                         grids: Sequence[Tensor | None], videos: Sequence[dict | None] | None = None) -> Tensor:
    """The (N, T) hidden states that predict the completion tokens, as
    ``backbone(**inputs).last_hidden_state[:, P - 1:P - 1 + T]`` of the plain forward, with each
    distinct prompt run once (module docstring).

    ``inputs`` is the plain batch (prompts left-padded to width ``prompt_len`` = P, completions
    right-padded after them); ``groups`` is :func:`prompt_groups`'s answer; ``pixel_values`` and
    ``grids`` are each row's image patches and grid (None without an image), ``videos`` each row's
    video inputs (:func:`~mmrl.vlm.processing.split_videos`; None without a video)."""
    check_supported(backbone)
    P, T = prompt_len, num_targets
    representatives, index = groups
    device = inputs["input_ids"].device
    positions = plain_positions(backbone, inputs)
    reps = torch.tensor(representatives, dtype=torch.long, device=device)
    index = index.to(device)
    prompt_images = {}  # only the distinct prompts' images and videos: each is encoded once here
    if rows := [r for r in representatives if pixel_values[r] is not None]:
        prompt_images = {"pixel_values": torch.cat([pixel_values[r] for r in rows]).to(device),
                         "image_grid_thw": torch.cat([grids[r] for r in rows]).to(device)}
    if videos is not None:
        prompt_images.update({k: v.to(device) for k, v in join_videos([videos[r] for r in representatives]).items()})
    prompt_cache = Cache(layer_class_to_replicate=_PromptLayer)
    with cache_kept_under_checkpointing(backbone):
        prompt = backbone(
            input_ids=inputs["input_ids"][reps, :P],
            attention_mask=inputs["attention_mask"][reps, :P],
            position_ids=positions[:, reps, :P],
            mm_token_type_ids=inputs["mm_token_type_ids"][reps, :P],
            use_cache=True,
            **{cache_keyword(backbone): prompt_cache},
            **prompt_images,
        )
        first = prompt.last_hidden_state[index, P - 1:P]  # predicts completion token 0
        if T <= 1:
            return first[:, :T]  # T = 0: no completion tokens, as the plain slice
        # the same keys/values for every sample of a prompt (autograd sums the uses)
        cache = Cache(layers=[_PrefixLayer(layer.keys.index_select(0, index), layer.values.index_select(0, index))
                              for layer in prompt_cache.layers])
        rest = backbone(
            input_ids=inputs["input_ids"][:, P:P + T - 1],
            attention_mask=inputs["attention_mask"][:, :P + T - 1],
            position_ids=positions[:, :, P:P + T - 1],
            use_cache=True,
            **{cache_keyword(backbone): cache},
        ).last_hidden_state
    return torch.cat((first, rest), dim=1)


class _PromptLayer(DynamicLayer):
    """A layer's cache in the prompt pass: keeps the keys/values of its first update; a later one
    (the layer recomputed in the backward pass under checkpointing) returns what it is given, as
    the first did, and keeps nothing."""

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """A layer's cache in the completion pass: every update attends over the samples' prompt
    keys/values followed by the new ones, and stores nothing, so a recomputed update sees what
    the first one saw."""

    def __init__(self, keys: Tensor, values: Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)
