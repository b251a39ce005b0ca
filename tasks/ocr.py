"""``ocr``: read the short word or code written in the image ("What text is shown?" -> "W3K9A").

Synthetic images render a random string with PIL's built-in bitmap font (6 px a character, the
same on every machine: no font files, no FreeType), drawn on a small canvas and scaled up with
nearest-neighbour so the glyphs stay sharp and legible at 112 px. Position and colours vary a
little per example. Real data comes from JSONL files (``train_path`` / ``eval_path``).
"""

from __future__ import annotations

import random
import string

from PIL import Image, ImageDraw

from mmrl import Task, register_task
from mmrl.data.records import BadRecord, require_image
from mmrl.measures.text import anls, similarity
from mmrl.media.draw import FOOTER, PRED, TRUE, VIS_SCALE, bitmap_font, canvas, draw_box, draw_label
from mmrl.parsing import extract_answer

SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
QUESTION = "What text is shown?"
# Kept short on purpose: the tiny model's 1k-token vocabulary is trained on these texts.
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>text</answer>."
# thinking=False (CLS-RL / No-Thinking-RL): the model answers directly, no reasoning block.
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>text</answer>."
DEFAULT_ALPHABET = string.ascii_uppercase + string.digits
GLYPH_W, GLYPH_H = 6, 11  # the bitmap font's advance and line height, in canvas pixels
MAX_SCALE = 3  # 6 px glyphs -> 18 px at 112 px: big, but 6 characters still fit


def text_scale(length: int, size: int) -> int:
    """The integer upscaling at which ``length`` glyphs fit in ``size`` px with a 2 px margin."""
    return max(0, min(MAX_SCALE, (size - 4) // max(1, GLYPH_W * length)))


def render_text(text: str, size: int, rng: random.Random) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """A ``size`` x ``size`` RGB image of ``text`` at a random place in random (legible) colours,
    and the text's box in image pixels (x1, y1, x2, y2), right/bottom exclusive."""
    s = text_scale(len(text), size)
    background = tuple(rng.randint(205, 255) for _ in range(3))
    ink = tuple(rng.randint(0, 90) for _ in range(3))
    small = size // s  # the canvas the font draws on, upscaled s times
    width = GLYPH_W * len(text)
    x = rng.randint(1, max(1, small - width - 1))
    y = rng.randint(0, max(0, small - GLYPH_H))
    img = Image.new("RGB", (small, small), background)
    ImageDraw.Draw(img).text((x, y), text, font=bitmap_font(), fill=ink)
    image = Image.new("RGB", (size, size), background)
    offset = (size - small * s) // 2
    image.paste(img.resize((small * s, small * s), resample=Image.NEAREST), (offset, offset))
    box = (offset + x * s, offset + y * s, offset + (x + width) * s, offset + (y + GLYPH_H) * s)
    return image, box


def parse_record(record: dict) -> dict:
    """A record ``{"image", "text" (or "answer"), "question"?}`` -> an example."""
    image = require_image(record)
    text = record.get("text", record.get("answer"))
    if not isinstance(text, str) or not text.strip():
        raise BadRecord("no 'text' (or 'answer') string (or it is empty)")
    question = record.get("question", QUESTION)
    if not isinstance(question, str) or not question.strip():
        raise BadRecord("'question' must be a non-empty string")
    return {"image": image, "question": question.strip(), "answer": text.strip(), "text": text.strip(),
            "id": record.get("id")}


def _length(text: str) -> str:
    """ "The text has 5 characters." (the reference reasoning and the first hint)."""
    return f"The text has {len(text)} character{'' if len(text) == 1 else 's'}."


def _footer_canvas(image):
    """Upscaled copy (about 448 px wide, never downscaled) with a label strip."""
    scale = max(1, (VIS_SCALE * 112) // max(image.size))
    return canvas(image, scale=scale, footer=FOOTER) + (scale,)


@register_task("ocr")
class Ocr(Task):
    """Examples: ``image``, ``question``, ``answer`` (= ``text``), ``box`` (the rendered text's
    pixels, synthetic only), ``image_size``, ``id``."""

    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "edit_similarity": 1.0}

    def default_options(self):
        return {
            "min_len": 3,
            "max_len": 5,
            "alphabet": DEFAULT_ALPHABET,  # characters the codes are drawn from
            "image_size": 112,
            "train_size": 1_000_000,
            "eval_size": 1000,
            "case_sensitive": True,  # False: rewards and metrics compare case-folded text
            "thinking": True,  # False: answer-only prompt and target, format mode answer_only
            "train_path": None,  # JSONL {"image", "text", "question"?}: real data instead
            "eval_path": None,
            "image_root": None,  # image paths are relative to this (default: the file's folder)
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        lo, hi, size = o["min_len"], o["max_len"], o["image_size"]
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"ocr: need integers 1 <= min_len <= max_len, got {lo!r}, {hi!r}")
        if not isinstance(size, int) or text_scale(hi, size) < 1:
            raise ValueError(f"ocr: max_len {hi} characters ({GLYPH_W} px each) do not fit in image_size {size!r}")
        alphabet = o["alphabet"]
        bad = [c for c in alphabet if not ("!" <= c <= "~") or c in "<>"] if isinstance(alphabet, str) else None
        if not alphabet or bad is None or bad:
            raise ValueError(
                f"ocr: alphabet must be a non-empty string of printable ASCII without spaces or '<', '>' "
                f"(the bitmap font draws only ASCII; tags would break the answer block), got {alphabet!r}"
            )
        if not self.bool_option("case_sensitive"):
            # An instance attribute: the class default stays that of the case-sensitive layout.
            self.reward_kwargs = {**self.reward_kwargs, "edit_similarity": {"case_sensitive": False}}

    def make(self, seed: int) -> dict:
        """Example ``seed``: the length (uniform min_len..max_len), the characters, then the image."""
        rng = random.Random(seed)
        o = self.options
        text = "".join(rng.choice(o["alphabet"]) for _ in range(rng.randint(o["min_len"], o["max_len"])))
        image, box = render_text(text, o["image_size"], rng)
        return {"image": image, "question": QUESTION, "answer": text, "text": text, "box": box,
                "image_size": image.size, "id": seed}

    def examples(self, split: str):
        return self.file_or_synthetic(split, SPLIT_SEEDS, parse_record)


    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        return _length(ex["answer"])

    def hints(self, ex: dict) -> list[str]:
        """Scaf-GRPO's three tiers, least to most revealing: how long the text is (knowledge), its
        first characters (planning: where the reading starts), the text itself (solution)."""
        text = ex["answer"]
        first = text[: max(1, len(text) // 2)]
        return [_length(text), f"It starts with {first}.", f"The answer is {text}."]

    def _similarities(self, completions, examples) -> list:
        sims = []
        for c, ex in zip(completions, examples):
            pred = extract_answer(c)
            sims.append(None if pred is None else similarity(pred, str(ex["answer"]).strip(), self.options["case_sensitive"]))
        return sims

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: exact match (similarity 1); edit_similarity: mean similarity; anls: ST-VQA's
        ANLS (similarity below 0.5 counts 0); parsed: has an answer block. Unparsable = 0."""
        sims = self._similarities(completions, examples)
        n = max(1, len(sims))
        return {
            "accuracy": sum(1.0 for s in sims if s == 1.0) / n,
            "edit_similarity": sum(s or 0.0 for s in sims) / n,
            "anls": anls(sims),
            "parsed": sum(s is not None for s in sims) / n,
        }

    def visualize(self, ex: dict, completion: str):
        """The image upscaled, the rendered text boxed in green (synthetic examples), and the true
        vs predicted text written below it (green when exactly right, else red)."""
        image, draw, scale = _footer_canvas(ex["image"])
        if ex.get("box") is not None:
            draw_box(draw, ex["box"], TRUE, scale=scale)
        pred = extract_answer(completion)
        right = pred is not None and similarity(pred, str(ex["answer"]).strip(), self.options["case_sensitive"]) == 1.0
        shown = "?" if pred is None else " ".join(pred.split())[:40]
        draw_label(draw, f"true {ex['answer']}  pred {shown}", TRUE if right else PRED)
        return image
