"""Completions and examples as JSON, for a reward computed in another process (``mmrl serve-reward``
and the ``http`` reward): one encoding both sides share, so what a served reward sees is what the
reward sees in process.

- text, numbers, booleans, ``None``, lists and string-keyed dicts of them: as they are;
- a PIL image: ``{"$image": "<PNG, base64>"}`` (lossless, so pixel checks score the same image);
  a clip (a list of frames) is a list of those;
- anything else (a tensor, a model object): dropped from an example (:func:`encode_example`), an
  error in a completion (a reward service scores text, images and clips).

The request and answer schema is documented in docs/plugins.md ("A reward as a service").
"""

from __future__ import annotations

import base64
import io
import numbers
from typing import Any

from PIL import Image

IMAGE_TAG = "$image"
_DROP = object()  # a value with no JSON form (left out of an example)


def encode_image(image: Image.Image) -> dict:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {IMAGE_TAG: base64.b64encode(buf.getvalue()).decode("ascii")}


def decode_image(tagged: dict) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(tagged[IMAGE_TAG], validate=True)))
    image.load()
    return image


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Number):
        return float(value) if not isinstance(value, numbers.Integral) else int(value)
    if isinstance(value, Image.Image):
        return encode_image(value)
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return _DROP if any(v is _DROP for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: _encode(v) for k, v in value.items()}
        return _DROP if any(v is _DROP for v in items.values()) else items
    return _DROP


def encode(value: Any) -> Any:
    """``value`` in its JSON form; ValueError when part of it has none."""
    out = _encode(value)
    if out is _DROP:
        raise ValueError(f"a {type(value).__name__} has no JSON form here (text, numbers, PIL images, and lists "
                         "and dicts of them have)")
    return out


def encode_example(example: dict, fields: list[str] | None = None) -> dict:
    """The example's keys that have a JSON form (``fields``: only these); keys starting with ``_``
    (the trainer's own bookkeeping) are left out."""
    keys = [k for k in example if not str(k).startswith("_")] if fields is None else fields
    out = {}
    for key in keys:
        if key in example and (value := _encode(example[key])) is not _DROP:
            out[str(key)] = value
    return out


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`: tagged images back as PIL images."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {IMAGE_TAG}:
            return decode_image(value)
        return {k: decode(v) for k, v in value.items()}
    return value
