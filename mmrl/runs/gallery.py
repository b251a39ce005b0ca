"""An evaluation gallery: the first predictions drawn by the task, marked right or wrong.

``write_gallery`` writes ``index.html`` (one card per example: picture, question, completion,
rewards, a green or red border) and ``gallery.png`` (a contact sheet of the same pictures with the
same borders) so a run's behaviour can be looked at without any tooling.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from PIL import Image

RIGHT, WRONG = (40, 160, 60), (210, 50, 40)


def is_right(task, completion: str, ex: dict, reward: float, best: float) -> bool:
    """Right by the task's own ``accuracy`` metric when it has one, else reward >= half the best."""
    try:
        acc = task.metrics([completion], [ex]).get("accuracy")
    except Exception:  # a task's metric must not break the gallery
        acc = None
    if acc is not None and math.isfinite(acc):
        return acc >= 0.5
    return reward >= 0.5 * best


def is_generated_media(completion: Any) -> bool:
    """A generator's completion: an image, or a clip as a list of frames."""
    if isinstance(completion, list):
        return bool(completion) and all(isinstance(f, Image.Image) for f in completion)
    return isinstance(completion, Image.Image)


def _still(completion: Any) -> Image.Image:
    """One image for a generated completion: the image, or a clip's middle frame."""
    return completion[len(completion) // 2] if isinstance(completion, list) else completion


def sample_picture(task, ex: dict, completion: Any) -> Optional[Image.Image]:
    """What a sample looks like: the task's picture of it (boxes, clicks drawn), else the generated
    image (a clip's middle frame), else the input image; None when there is nothing to show."""
    try:
        pic = task.visualize(ex, completion)
    except Exception:
        pic = None
    if pic is None and is_generated_media(completion):
        pic = _still(completion)
    if pic is None and isinstance(ex.get("image"), Image.Image):
        pic = ex["image"]
    return None if pic is None else pic.convert("RGB")


def _completion_text(completion: Any) -> str:
    if is_generated_media(completion):
        return "(a clip of %d frames)" % len(completion) if isinstance(completion, list) else "(the image above)"
    return str(completion)


def write_gallery(out_dir: Path, task, completions: Sequence[Any], examples: Sequence[dict],
                  rewards: Sequence[float], components: dict[str, Sequence[float]], best: float,
                  limit: int = 16, thumb: int = 224) -> dict[str, Any]:
    """Write the gallery of the first ``limit`` samples; returns ``{"right": k, "shown": n}``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cards, tiles, right_count = [], [], 0
    for i in range(min(limit, len(completions))):
        ex, completion, reward = examples[i], completions[i], float(rewards[i])
        right = is_right(task, completion, ex, reward, best)
        right_count += right
        pic = sample_picture(task, ex, completion)
        name = None
        if pic is not None:
            name = f"{i:03d}.png"
            pic.save(out_dir / name)
            tile = pic.copy()
            tile.thumbnail((thumb, thumb))
            framed = Image.new("RGB", (thumb + 8, thumb + 8), RIGHT if right else WRONG)
            framed.paste(tile, (4 + (thumb - tile.width) // 2, 4 + (thumb - tile.height) // 2))
            tiles.append(framed)
        scores = ", ".join(f"{k} {float(v[i]):.2f}" for k, v in components.items())
        cards.append(
            f'<div class="card {"right" if right else "wrong"}">'
            + (f'<img src="{name}">' if name else "")
            + f"<p><b>{html.escape(str(ex.get('question', ex.get('prompt', ''))))}</b></p>"
            + f"<p>truth: {html.escape(str(ex.get('answer', '')))}</p>"
            + f"<pre>{html.escape(_completion_text(completion))}</pre>"
            + f"<p>reward {reward:.2f} ({html.escape(scores)})</p></div>"
        )
    (out_dir / "index.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>mmrl eval gallery</title><style>"
        "body{font-family:sans-serif}.card{display:inline-block;vertical-align:top;width:260px;margin:6px;"
        "padding:6px;border:4px solid}.right{border-color:#28a03c}.wrong{border-color:#d23228}"
        "img{max-width:100%}pre{white-space:pre-wrap;font-size:12px}</style>"
        f"<h3>{right_count} of {len(cards)} right</h3>" + "".join(cards), encoding="utf-8")
    if tiles:
        cols = min(4, len(tiles))
        rows = math.ceil(len(tiles) / cols)
        size = tiles[0].width
        sheet = Image.new("RGB", (cols * size, rows * size), "white")
        for k, tile in enumerate(tiles):
            sheet.paste(tile, ((k % cols) * size, (k // cols) * size))
        sheet.save(out_dir / "gallery.png")
    summary = {"right": right_count, "shown": len(cards)}
    (out_dir / "summary.json").write_text(json.dumps(summary))
    return summary


def save_samples_grid(path: Path, task, completions: Sequence[Any], examples: Sequence[dict],
                      rewards: Sequence[float]) -> Path:
    """The before/after look at a run: generated images (clips: their middle frame) captioned with
    their prompts, or for text answers the task's pictures (boxes drawn) captioned with the answer."""
    if completions and is_generated_media(completions[0]):
        images = [_still(c) for c in completions]
        captions = [str(task.prompt(ex)) for ex in examples]  # a generator task's prompt is its text
        return save_image_grid(path, images, captions, rewards)
    pictures, captions, scores = [], [], []
    for c, ex, r in zip(completions, examples, rewards):
        pic = sample_picture(task, ex, c)
        if pic is not None:
            pictures.append(pic)
            captions.append(str(c).replace("\n", " ")[-34:])
            scores.append(r)
    return save_image_grid(path, pictures, captions, scores, columns=4, cell=192) if pictures else Path(path)


def save_image_grid(path: Path, images: Sequence[Image.Image], captions: Sequence[str],
                    rewards: Sequence[float], columns: int = 8, cell: int = 128) -> Path:
    """A PNG contact sheet of generated images (upscaled to ``cell`` px, nearest-neighbour so
    small samples stay crisp), each with its prompt and reward underneath: the before/after
    look at a generator run."""
    from PIL import ImageDraw

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [_still(im) for im in images]
    rows = max(1, math.ceil(len(images) / columns))
    label = 28
    sheet = Image.new("RGB", (columns * cell, rows * (cell + label)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for i, (image, caption, reward) in enumerate(zip(images, captions, rewards)):
        x, y = (i % columns) * cell, (i // columns) * (cell + label)
        image = image.convert("RGB")
        scale = cell / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        sheet.paste(image.resize(size, resample=Image.NEAREST), (x, y))
        text = str(caption)
        draw.text((x + 2, y + cell + 1), text[:22], fill=(0, 0, 0))
        draw.text((x + 2, y + cell + 13), f"{text[22:34]} r={reward:.2f}", fill=(0, 0, 0))
    sheet.save(path)
    return path
