"""The vision tower runs once per distinct image of a forward, not once per sample.

A GRPO group is G samples of one prompt: in generation, scoring and training the same image goes
through the vision tower G times, and its activations are stored G times. :class:`SharedImageEncoder`
is installed on the model's ``get_image_features`` (the one place transformers' Qwen-VL models
encode images): it finds the distinct images of the call (a cheap fingerprint, then an exact
``torch.equal``), encodes each once and hands every sample its image's features. The features
are the same tensors, so the loss and the gradients are exactly those of the per-sample forward
(autograd sums the G uses of each image's features); a test compares them.

With a frozen vision tower the features are also kept for the rest of the RL step
(``cache=True``): generation, the old-log-prob pass and the training forward then encode each
image once in all. :meth:`clear` forgets them (the policy calls it at every step).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def share_image_encoding(model, cache: bool, method: str = "get_image_features",
                         per_row: bool = False) -> "SharedImageEncoder | None":
    """Install a :class:`SharedImageEncoder` on ``model``'s ``method`` (``get_image_features``, or
    ``get_video_features`` for clips: the same call shape) of a transformers Qwen-VL model,
    peft-wrapped or not; None when the model has no such method (nothing to share). ``per_row``:
    the method takes ``pixel_values`` alone, one row per image, and returns one row of features
    per image (Gemma 3) instead of Qwen-VL's patches split by ``image_grid_thw``."""
    from .logprobs import split_head

    inner = split_head(model)[0]
    if not callable(getattr(inner, method, None)):
        return None
    return SharedImageEncoder(inner, cache=cache, method=method, per_row=per_row)


class SharedImageEncoder:
    """Replaces ``inner.get_image_features`` (``inner``: a Qwen-VL ``*Model`` with a vision tower)."""

    def __init__(self, inner, cache: bool = False, method: str = "get_image_features", per_row: bool = False):
        import inspect

        self.encode = getattr(inner, method)
        # generate() finds an encoder's inputs by its signature (pixel_values / image_grid_thw,
        # pixel_values_videos / video_grid_thw): this wrapper shows the wrapped method's
        self.__signature__ = inspect.signature(self.encode)
        self.input_names = tuple(self.__signature__.parameters)[:1 if per_row else 2]
        self.per_row = per_row
        self.cache_enabled = cache
        self.cache: dict[tuple, list[tuple[Tensor, dict[str, Any]]]] = {}
        self.images_seen = 0  # images handed to the wrapper
        self.images_encoded = 0  # images that went through the vision tower
        setattr(inner, method, self)

    def clear(self) -> None:
        self.cache.clear()

    def __call__(self, *args, **kwargs):
        pixel_values = args[0] if args else kwargs.pop(self.input_names[0])
        if self.per_row:  # one row per image; the row's shape stands in for the grid
            image_grid_thw = torch.tensor([list(pixel_values.shape[1:])] * len(pixel_values))
            pieces = list(pixel_values)
        else:
            image_grid_thw = args[1] if len(args) > 1 else kwargs.pop(self.input_names[1], None)
            if image_grid_thw is None:
                return self.encode(pixel_values, image_grid_thw, **kwargs)
            pieces = torch.split(pixel_values, image_grid_thw.prod(-1).tolist())
        sums = torch.stack([torch.stack((p.sum(), p.abs().sum())) for p in pieces]).tolist()
        records: list[dict[str, Any] | None] = [None] * len(pieces)
        todo: list[int] = []  # first occurrence of each image not found in the cache
        owner: dict[int, int] = {}  # image i -> the image whose record it shares
        local: dict[tuple, list[int]] = {}
        for i, piece in enumerate(pieces):
            key = (tuple(image_grid_thw[i].tolist()), *sums[i])
            hit = next((rec for ref, rec in self.cache.get(key, ()) if torch.equal(ref, piece)), None)
            if hit is not None:
                records[i] = hit
                continue
            same = next((j for j in local.get(key, ()) if torch.equal(pieces[j], piece)), None)
            if same is not None:
                owner[i] = same
                continue
            local.setdefault(key, []).append(i)
            todo.append(i)
        self.images_seen += len(pieces)
        self.images_encoded += len(todo)
        out = None
        if todo:
            if self.per_row:
                out = self.encode(torch.stack([pieces[i] for i in todo]), **kwargs)
            else:
                out = self.encode(torch.cat([pieces[i] for i in todo]), image_grid_thw[todo], **kwargs)
            for rec, i in zip(_per_image(out, len(todo)), todo):
                records[i] = rec
                if self.cache_enabled:
                    key = (tuple(image_grid_thw[i].tolist()), *sums[i])
                    self.cache.setdefault(key, []).append((pieces[i].detach(), _detached(rec)))
        for i, j in owner.items():
            records[i] = records[j]
        return _assemble(out, records, kwargs, self.per_row)


def _per_image(out, n: int) -> list[dict[str, Any]]:
    """The features of each of the ``n`` encoded images: ``pooler_output[i]`` and, for Qwen3-VL,
    each deepstack layer's slice (older transformers return a plain tuple of per-image tensors)."""
    if isinstance(out, (tuple, list)) and not hasattr(out, "pooler_output"):
        return [{"pooler_output": out[i]} for i in range(n)]
    deep = getattr(out, "deepstack_features", None)
    return [{"pooler_output": out.pooler_output[i],
             **({"deepstack_features": [layer[i] for layer in deep]} if deep is not None else {})}
            for i in range(n)]


def _detached(record: dict[str, Any]) -> dict[str, Any]:
    return {k: ([t.detach() for t in v] if isinstance(v, list) else v.detach()) for k, v in record.items()}


def _assemble(template, records: list[dict[str, Any]], kwargs: dict, per_row: bool = False):
    """The encoder's output for all images, in order, from per-image records (``per_row``: one
    tensor with a row per image, else a tuple of per-image tensors)."""
    pooler = tuple(r["pooler_output"] for r in records)
    if per_row:
        pooler = torch.stack(pooler)
    if template is not None and isinstance(template, (tuple, list)) and not hasattr(template, "pooler_output"):
        return pooler
    if template is None:  # every image came from the cache
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        template = BaseModelOutputWithPooling()
    template.pooler_output = pooler
    template.last_hidden_state = None  # patch-level states of the distinct images only: not per sample
    if "deepstack_features" in records[0]:
        layers = len(records[0]["deepstack_features"])
        template.deepstack_features = [tuple(r["deepstack_features"][k] for r in records) for k in range(layers)]
    return template
