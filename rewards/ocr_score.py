"""``ocr_score``: Flow-GRPO's text-rendering reward ("Flow-GRPO: Training Flow Matching Models via
Online RL", Liu et al., 2025; yifan123/flow_grpo ``flow_grpo/ocr.py``): read the image's text with an
OCR model and score it against the text the prompt quotes, by edit distance.

The recogniser is pluggable (:func:`register_recognizer`): Flow-GRPO's PaddleOCR is built in as
``paddleocr``; a test or a user registers any ``images -> texts`` model. Loaded recognisers are
cached per (name, path, device), as the model scorers are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PIL import Image

from mmrl import Registry, pick_device, register_reward
from mmrl.measures.batch import check_batch
from mmrl.measures.text import levenshtein

_RECOGNIZERS: Registry[Callable] = Registry("OCR recognizer")
_LOADED: dict[tuple, Callable] = {}


def register_recognizer(name: str, override: bool = False):
    """Decorator for a recogniser's loader ``fn(path: str | None, device) -> read`` where
    ``read(images: list[PIL.Image]) -> list[str]`` is the text recognised in each image."""

    def wrap(fn):
        return _RECOGNIZERS.register(name, fn, override)

    return wrap


def recognizer_names() -> list[str]:
    return _RECOGNIZERS.names()


def clear_recognizers() -> None:
    """Forget the loaded recognisers (tests; freeing memory)."""
    _LOADED.clear()


def quoted_text(prompt: str) -> str | None:
    """The first double-quoted span of the prompt (Flow-GRPO: ``prompt.split('"')[1]``), or None."""
    parts = str(prompt).split('"')
    return parts[1] if len(parts) > 1 else None


def ocr_reward(recognized: str, target: str) -> float:
    """Flow-GRPO's score of one image: spaces removed and lower-cased on both sides; distance 0 when
    the target occurs in the recognised text, else their Levenshtein distance, capped at the
    target's length (many unrelated characters cost no more than missing the whole target);
    ``1 - distance / len(target)``. Hand-worked: "hel1o" for "Hello" -> 1 - 1/5 = 0.8."""
    recognized, target = recognized.replace(" ", "").lower(), target.replace(" ", "").lower()
    distance = 0 if target in recognized else min(levenshtein(recognized, target), len(target))
    return 1 - distance / len(target)


def _check(recognizer="paddleocr", path=None, **_):
    if recognizer not in _RECOGNIZERS:
        raise ValueError(f"ocr_score: unknown recognizer {recognizer!r} (task.reward_kwargs.ocr_score.recognizer); "
                         f"registered: {', '.join(recognizer_names())}")
    if path is not None and not Path(str(path)).expanduser().exists():
        raise FileNotFoundError(f"task.reward_kwargs.ocr_score.path={path!r} does not exist; set it to the "
                                "recognizer's local model directory (mmrl downloads nothing)")


@register_reward("ocr_score", check=_check, media="image")
def ocr_score(completions, examples, recognizer: str = "paddleocr", path: str | None = None,
              device: str = "auto") -> list:
    """:func:`ocr_reward` of the text ``recognizer`` reads in each image against the quoted text of
    ``ex["prompt"]``, in [0, 1]. None for a completion that is not an image or a prompt without a
    non-empty quoted text (Flow-GRPO's prompts always quote one; its code would fail on such a prompt).
    A recogniser that fails on an image scores it 0, as Flow-GRPO does."""
    _check(recognizer, path)
    check_batch("ocr_score", completions, examples, items="images")
    targets = [quoted_text(ex.get("prompt", "")) if isinstance(ex, dict) else None for ex in examples]
    todo = [i for i, (im, t) in enumerate(zip(completions, targets)) if isinstance(im, Image.Image) and t and
            t.replace(" ", "")]
    out: list = [None] * len(completions)
    if not todo:
        return out
    dev = pick_device(str(device))
    key = (recognizer, None if path is None else str(Path(str(path)).expanduser().resolve()), str(dev))
    if key not in _LOADED:
        _LOADED[key] = _RECOGNIZERS.get(recognizer)(key[1], dev)
    texts = _LOADED[key]([completions[i] for i in todo])
    if len(texts) != len(todo):
        raise ValueError(f"OCR recognizer {recognizer!r} returned {len(texts)} texts for {len(todo)} images")
    for i, text in zip(todo, texts):
        out[i] = 0.0 if text is None else ocr_reward(str(text), targets[i])
    return out


@register_recognizer("paddleocr")
def load_paddleocr(path: str | None, device):
    """Flow-GRPO's recogniser: PaddleOCR 2.x (``PaddleOCR(use_angle_cls=False, lang="en")``, ``ocr(img,
    cls=False)``), the lines whose confidence is above 0 joined. ``path``: a directory with PaddleOCR's
    ``det/`` and ``rec/`` inference models (without it PaddleOCR fetches its own into ~/.paddleocr).
    An image PaddleOCR fails on reads as None (scored 0)."""
    import numpy as np

    try:
        from paddleocr import PaddleOCR
    except ImportError as exc:
        raise ImportError("ocr_score's paddleocr recognizer needs PaddleOCR 2.x: pip install 'paddleocr<3' "
                          "paddlepaddle, or register another recognizer (register_recognizer)") from exc
    local = {} if path is None else {"det_model_dir": str(Path(path) / "det"), "rec_model_dir": str(Path(path) / "rec")}
    ocr = PaddleOCR(use_angle_cls=False, lang="en", use_gpu=device.type == "cuda",
                    show_log=False, **local)

    def read(images):
        texts = []
        for im in images:
            try:
                result = ocr.ocr(np.array(im.convert("RGB")), cls=False)
            except Exception:  # noqa: BLE001 - Flow-GRPO scores a failed read as the maximum distance
                texts.append(None)
                continue
            lines = result[0] if result and result[0] else []
            texts.append("".join(text for _, (text, confidence) in lines if confidence > 0))
        return texts

    return read
