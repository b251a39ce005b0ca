"""An evaluation gallery: the first predictions drawn by the task, marked right or wrong.

``write_gallery`` writes ``index.html`` (one card per example: picture, question, completion,
rewards, a green or red border; per episode for an environment task) and ``gallery.png`` (a contact
sheet of the first few of the same pictures with the same borders, each at its own aspect ratio:
:mod:`mmrl.runs.contact_sheet`) so a run's behaviour can be looked at without any tooling. The
trainer's ``samples_before.png`` / ``samples_after.png`` are the same kind of sheet
(:func:`save_samples_grid`). A sheet is read, not scrolled (:func:`sample_sheet`): at most
:data:`SHEET_PICTURES` pictures, or :data:`SHEET_STRIPS` clips' frame strips, each strip across a
wide sheet so its frames stay large enough to count what is in them, each captioned with its mark,
reward and whole completion, wrapped.

Right or wrong is the task's own success measure, :meth:`~mmrl.task.Task.success` (what pass@k
counts), so "k of n right" is the task's success metric on the shown examples; a task without a
per-example success (``success`` is None) is marked by reward >= half the best, and the header
says so. An environment task's rows are steps: it gets one card per episode, marked by the
episode's outcome, with its steps side by side and the actions it took.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from PIL import Image

from .contact_sheet import contact_sheet, side_by_side

RIGHT, WRONG = (40, 160, 60), (210, 50, 40)
SHEET_PICTURES = 8  # pictures on a sheet: two rows of four
SHEET_STRIPS = 4  # frame strips (a clip each, alone on its row) on a sheet
STRIP_WIDTH = 1280  # a sheet with strips: frame_strip's 8 frames of a 112-px clip ~157 px tall on it
STYLE = ("body{font-family:sans-serif}.card{display:inline-block;vertical-align:top;width:260px;margin:6px;"
         "padding:6px;border:4px solid}.card.wide{width:540px}.right{border-color:#28a03c}"
         ".wrong{border-color:#d23228}img{max-width:100%}pre,code{white-space:pre-wrap;font-size:12px}"
         "ol{padding-left:20px;font-size:12px}")


@dataclass
class Card:
    """One card of the gallery: its picture (None: nothing to show), its mark and its HTML text."""

    picture: Optional[Image.Image]
    right: bool
    body: str
    caption: str = ""  # under its tile on the contact sheet


def marks(task, completions: Sequence[Any], examples: Sequence[dict], rewards: Sequence[float],
          best: float) -> tuple[list[bool], bool]:
    """Right or wrong for each sample, and whether that is by ``task.success`` (the measure pass@k
    uses; when it judges every sample) rather than by reward >= half the best."""
    solved = [task.success(c, ex) for c, ex in zip(completions, examples)]
    if all(s is not None for s in solved):
        return [bool(s) for s in solved], True
    return [float(r) >= 0.5 * best for r in rewards], False


def marked_by(task, by_success: bool, best: float, episodic: bool = False) -> str:
    """The gallery header's sentence on how its samples were marked."""
    if by_success:
        metric = f" ({task.success_metric})" if task.success_metric else ""
        what = "each episode's outcome" if episodic else "the task's success measure"
        return f"marked by {what}{metric}, as pass@k counts"
    return f"marked by reward >= half the best ({0.5 * best:g}); this task has no per-example success"


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


def is_strip(picture: Image.Image) -> bool:
    """A frame strip (a clip's frames side by side, an episode's steps), as the HTML's wide card."""
    return picture.width >= 2 * picture.height


def sample_sheet(pictures: Sequence[Image.Image], right: Sequence[bool], captions: Sequence[str],
                 title: str) -> Image.Image:
    """The PNG look at samples: the first ones, up to :data:`SHEET_PICTURES` pictures or
    :data:`SHEET_STRIPS` strips (200 held-out clips made a 24-px strip each in an 11,000-px sheet),
    a strip across a :data:`STRIP_WIDTH` sheet, each in a green (right) or red (wrong) border with
    its caption wrapped under it. The title says how many of how many are shown."""
    shown = on_a_sheet(pictures)
    if shown < len(pictures):
        title = f"{title}; the first {shown} of {len(pictures)} shown"
    strips = any(is_strip(p) for p in pictures[:shown])
    sheet, _ = contact_sheet(pictures[:shown], [RIGHT if ok else WRONG for ok in right[:shown]], title,
                             captions[:shown], width=STRIP_WIDTH if strips else 960)
    return sheet


def on_a_sheet(pictures: Sequence[Image.Image]) -> int:
    """How many of the first ``pictures`` a sheet shows: up to :data:`SHEET_PICTURES`, and no more
    than :data:`SHEET_STRIPS` strips."""
    shown, strips = 0, 0
    for picture in pictures:
        if shown == SHEET_PICTURES or (is_strip(picture) and strips == SHEET_STRIPS):
            break
        shown, strips = shown + 1, strips + is_strip(picture)
    return shown


def sample_caption(i: int, right: bool, reward: float, text: str) -> str:
    """A tile's caption: its number, the mark in words (not only the border's colour), the reward
    and the whole completion (or a generator's prompt)."""
    return f"{i:03d} {'right' if right else 'wrong'} r={reward:.2f}: {text}"


def write_gallery(out_dir: Path, task, completions: Sequence[Any], examples: Sequence[dict],
                  rewards: Sequence[float], components: dict[str, Sequence[float]], best: float,
                  limit: int = 16, viewer: Optional[str] = None, episodes: Sequence[Sequence[int]] = ()) -> dict[str, Any]:
    """Write the gallery of the first ``limit`` samples, or of the first ``limit`` ``episodes``
    (each an episode's rows in step order, :func:`mmrl.core.episodes.episode_rows`) for an episodic
    task's rows; ``viewer``: the episode viewer's address relative to ``out_dir``, linked from the page.
    Returns ``{"right": k, "shown": n, "marked_by": "success" | "reward", "unit": "example" | "episode"}``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    episodic = bool(episodes)
    if episodic:
        cards, by_success = _episode_cards(task, completions, examples, rewards, best, episodes[:limit])
    else:
        cards, by_success = _example_cards(task, completions, examples, rewards, components, best, limit)
    how = marked_by(task, by_success, best, episodic)
    right = sum(card.right for card in cards)
    unit = "episode" if episodic else "example"
    html_cards, pictures, marked, captions = [], [], [], []
    for i, card in enumerate(cards):
        img = ""
        if card.picture is not None:
            card.picture.save(out_dir / f"{i:03d}.png")
            pictures.append(card.picture)
            marked.append(card.right)
            captions.append(f"{i:03d} {'right' if card.right else 'wrong'} {card.caption}")
            img = f'<img src="{i:03d}.png">'
        wide = " wide" if card.picture is not None and is_strip(card.picture) else ""
        html_cards.append(f'<div class="card {"right" if card.right else "wrong"}{wide}">{img}{card.body}</div>')
    title = f"{right} of {len(cards)} right"
    link = f' &middot; <a href="{html.escape(viewer)}">step through the episodes</a>' if viewer else ""
    (out_dir / "index.html").write_text(
        f"<!doctype html><meta charset='utf-8'><title>mmrl eval gallery</title><style>{STYLE}</style>"
        f"<h3>{title}</h3><p>{'one card per episode; ' if episodic else ''}{html.escape(how)}{link}</p>"
        + "".join(html_cards), encoding="utf-8")
    if pictures:
        sample_sheet(pictures, marked, captions, f"{title} ({unit}s) - {how}").save(out_dir / "gallery.png")
    summary = {"right": right, "shown": len(cards), "marked_by": "success" if by_success else "reward", "unit": unit}
    (out_dir / "summary.json").write_text(json.dumps(summary))
    return summary


def _example_cards(task, completions, examples, rewards, components, best, limit) -> tuple[list[Card], bool]:
    """One card per sample: picture, question, truth, completion, reward and its components."""
    n = min(limit, len(completions))
    right, by_success = marks(task, completions[:n], examples[:n], [float(r) for r in rewards[:n]], best)
    cards = []
    for i in range(n):
        ex, completion = examples[i], completions[i]
        scores = ", ".join(f"{k} {float(v[i]):.2f}" for k, v in components.items())
        cards.append(Card(sample_picture(task, ex, completion), right[i],
                          f"<p><b>{html.escape(str(ex.get('question', ex.get('prompt', ''))))}</b></p>"
                          f"<p>truth: {html.escape(str(ex.get('answer', '')))}</p>"
                          f"<pre>{html.escape(_completion_text(completion))}</pre>"
                          f"<p>reward {float(rewards[i]):.2f} ({html.escape(scores)})</p>",
                          f"r={float(rewards[i]):.2f}: "
                          + (str(ex.get("prompt", "")) if is_generated_media(completion) else str(completion))))
    return cards, by_success


def _episode_cards(task, completions, examples, rewards, best, chosen) -> tuple[list[Card], bool]:
    """One card per episode of ``chosen`` (each its rows in step order), marked as its first
    step's row is judged (the row pass@k judges; every row of an episode carries its outcome): its
    steps' pictures side by side, the instruction, the outcome and the actions in order."""
    firsts = [rows[0] for rows in chosen]
    right, by_success = marks(task, [completions[i] for i in firsts], [examples[i] for i in firsts],
                              [float(rewards[i]) for i in firsts], best)
    cards = []
    for rows, ok in zip(chosen, right):
        first = examples[rows[0]]
        steps = [p for p in (sample_picture(task, examples[i], completions[i]) for i in rows) if p is not None]
        actions = "".join(
            f"<li><code>{html.escape(str(completions[i]))}</code> {html.escape(str(examples[i].get('step_message', '')))}"
            f" &middot; reward {float(examples[i].get('step_reward', rewards[i])):g}</li>" for i in rows)
        outcome = "success" if first.get("episode_success") else "failure"
        cards.append(Card(side_by_side(steps) if steps else None, ok,
                          f"<p><b>{html.escape(str(first.get('instruction', '')))}</b></p>"
                          f"<p>{outcome} &middot; return {float(first.get('episode_return', 0)):g} &middot; "
                          f"{first.get('episode_length', len(rows))} steps</p><ol>{actions}</ol>",
                          f"{outcome} in {len(rows)} steps: {first.get('instruction', '')}"))
    return cards, by_success


def save_samples_grid(path: Path, task, completions: Sequence[Any], examples: Sequence[dict],
                      rewards: Sequence[float], best: Optional[float] = None) -> Path:
    """The before/after look at a run: generated images (clips: their middle frame) captioned with
    their prompts, or for text answers a :func:`sample_sheet` of the first samples' pictures
    (boxes drawn, clips as frame strips), marked as the gallery marks them (``best``: the best
    reward, for a task without per-example success; None: the best here). A generator given an
    input image (an edit's source, an image-to-video clip's first frame) gets the sheet too: the
    task's picture shows the input beside what was made of it."""
    prompts = [task.prompt(ex) for ex in examples] if completions and is_generated_media(completions[0]) else []
    if prompts and all(getattr(p, "image", None) is None for p in prompts):
        images = [_still(c) for c in completions]
        captions = [str(p) for p in prompts]  # a generator task's prompt is its text
        return save_image_grid(path, images, captions, rewards)
    path = Path(path)
    rows = []  # the samples with a picture, as far as a sheet shows them
    for c, ex, r in zip(completions, examples, rewards):
        pic = sample_picture(task, ex, c)
        if pic is not None:
            rows.append((pic, c, ex, float(r)))
        if len(rows) == SHEET_PICTURES:
            break
    if not rows:
        return path
    rows = rows[:on_a_sheet([row[0] for row in rows])]
    pictures, shown, scored, scores = (list(column) for column in zip(*rows))
    best = max(scores) if best is None else best
    right, by_success = marks(task, shown, scored, scores, best)
    texts = [str(task.prompt(ex)) if prompts else str(c) for c, ex in zip(shown, scored)]  # a generator's: its prompt
    captions = [sample_caption(i, ok, r, t) for i, (ok, r, t) in enumerate(zip(right, scores, texts))]
    title = (f"{sum(right)} of {len(right)} right - {marked_by(task, by_success, best)}"
             f"; the first {len(right)} of {len(completions)} samples")
    path.parent.mkdir(parents=True, exist_ok=True)
    sample_sheet(pictures, right, captions, title).save(path)
    return path


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
