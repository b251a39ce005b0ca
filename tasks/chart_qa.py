"""``chart_qa``: questions about a small bar or line chart ("What is the value of B?" -> "7").

Synthetic charts have 3-5 categories labelled A, B, C, ... with integer values 1..9, drawn with PIL
only: a y axis with a tick, a grid line and a label at every integer, bars (or points joined by a
line) whose tops sit exactly on the grid lines, and the category letters under the x axis, so
every value can be read off the image. Question types: ``value`` (read one value), ``compare``
("Is A higher than C?" -> yes/no) and ``max`` ("Which is the highest?" -> a letter; the maximum
is always unique). Real data comes from ChartQA-style JSONL files (``train_path`` / ``eval_path``).
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Sequence

from PIL import Image, ImageDraw

from mmrl import Task, register_task
from mmrl.data.records import BadRecord
from mmrl.measures.relaxed import relaxed_correct
from mmrl.media.draw import FOOTER, PRED, TRUE, VIS_SCALE, bitmap_font, canvas, draw_box, draw_label
from mmrl.parsing import extract_answer

SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
KINDS = ("bar", "line")
QUESTION_TYPES = ("value", "compare", "max")
MAX_VALUE = 9  # values are integers 1..9: one labelled grid line each
# Kept short on purpose: the tiny model's 1k-token vocabulary is trained on these texts.
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>answer</answer>."
# thinking=False (CLS-RL / No-Thinking-RL): the model answers directly, no reasoning block.
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>answer</answer>."
PALETTE = ((52, 101, 164), (204, 0, 0), (78, 154, 6), (117, 80, 123), (206, 92, 0), (0, 128, 128))
GRID, AXIS = (222, 222, 222), (0, 0, 0)
MIN_IMAGE_SIZE = 96  # below this the nine 11 px tick labels overlap


def layout(size: int, n: int) -> dict:
    """Where things go on a ``size`` px chart of ``n`` categories: the y axis column ``left``,
    the x axis row ``bottom``, ``unit`` pixels per value (value v's grid line is at row
    ``bottom - v * unit``), the categories' centre columns ``centers`` and the bar ``width``."""
    left, bottom, right = 14, size - 16, size - 4
    unit = (bottom - 8) // MAX_VALUE
    slot = (right - left - 1) / n
    centers = [round(left + 1 + slot * (i + 0.5)) for i in range(n)]
    return {"left": left, "bottom": bottom, "right": right, "unit": unit, "centers": centers,
            "width": max(3, int(slot * 0.6))}


def draw_chart(kind: str, labels, values, size: int, color) -> tuple[Image.Image, list]:
    """The chart image and each category's box in pixels (x1, y1, x2, y2, right/bottom
    exclusive): the bar, or the point's 5x5 marker."""
    g = layout(size, len(values))
    left, bottom, right, unit = g["left"], g["bottom"], g["right"], g["unit"]
    font = bitmap_font()
    image = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for v in range(1, MAX_VALUE + 1):
        y = bottom - v * unit
        draw.line([(left + 1, y), (right, y)], fill=GRID)
        draw.line([(left - 3, y), (left - 1, y)], fill=AXIS)  # tick
        draw.text((left - 10, y - 6), str(v), font=font, fill=AXIS)  # digit ink rows y-4..y+3
    boxes = []
    for cx, v in zip(g["centers"], values):
        top = bottom - v * unit
        if kind == "bar":
            x1 = cx - g["width"] // 2
            boxes.append((x1, top, x1 + g["width"], bottom))
        else:
            boxes.append((cx - 2, top - 2, cx + 3, top + 3))
    if kind == "bar":
        for x1, y1, x2, y2 in boxes:
            draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=color)
    else:
        points = [(cx, bottom - v * unit) for cx, v in zip(g["centers"], values)]
        draw.line(points, fill=color, width=1)
        for x1, y1, x2, y2 in boxes:
            draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=color)
    draw.line([(left, 4), (left, bottom)], fill=AXIS)  # y axis
    draw.line([(left, bottom), (right, bottom)], fill=AXIS)  # x axis
    for cx, label in zip(g["centers"], labels):
        draw.text((cx - 2, bottom + 2), label, font=font, fill=AXIS)
    return image, boxes


def parse_record(record: dict) -> dict:
    """A ChartQA-style record -> an example: the image under ``image`` or ``imgname``, the
    question under ``question`` or ``query``, the answer under ``answer`` or ``label``."""
    image = next((record[k] for k in ("image", "imgname") if record.get(k) not in (None, "", [])), None)
    question = next((record[k] for k in ("question", "query") if k in record), None)
    answer = next((record[k] for k in ("answer", "label") if k in record), None)
    if image is None:
        raise BadRecord("no 'image' or 'imgname'")
    if not isinstance(question, str) or not question.strip():
        raise BadRecord("no 'query' or 'question' string")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
        raise BadRecord("no 'label' or 'answer' (a string or a number)")
    if isinstance(answer, float) and not math.isfinite(answer):
        raise BadRecord(f"answer {answer!r} is not a finite number")
    return {"image": image, "question": question.strip(), "answer": str(answer).strip(), "qtype": None,
            "id": record.get("id")}


def _as_choices(name: str, value, valid) -> list[str]:
    # A config's list arrives as an OmegaConf ListConfig: any non-string sequence will do.
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, Sequence) else None
    if not items or any(v not in valid for v in items):
        raise ValueError(f"chart_qa: {name} must be a non-empty list of {list(valid)}, got {value!r}")
    return items


@register_task("chart_qa")
class ChartQA(Task):
    """Synthetic examples: ``image``, ``question``, ``answer``, ``qtype``, ``kind``, ``labels``,
    ``values``, ``asked`` (the categories the question or its answer is about), ``boxes`` (each
    category's bar or point, pixels), ``image_size``, ``id``."""

    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "relaxed_accuracy": 1.0}

    def default_options(self):
        return {
            "kinds": ["bar", "line"],
            "questions": ["value", "compare", "max"],
            "min_categories": 3,
            "max_categories": 5,
            "image_size": 112,
            "train_size": 1_000_000,
            "eval_size": 1000,
            "thinking": True,  # False: answer-only prompt and target, format mode answer_only
            "train_path": None,  # ChartQA-style JSONL {"imgname"|"image", "query"|"question", "label"|"answer"}
            "eval_path": None,
            "image_root": None,  # image paths are relative to this (default: the file's folder)
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        o["kinds"] = _as_choices("kinds", o["kinds"], KINDS)
        o["questions"] = _as_choices("questions", o["questions"], QUESTION_TYPES)
        lo, hi, size = o["min_categories"], o["max_categories"], o["image_size"]
        if not (isinstance(lo, int) and isinstance(hi, int) and 2 <= lo <= hi <= 10):
            raise ValueError(f"chart_qa: need integers 2 <= min_categories <= max_categories <= 10, got {lo!r}, {hi!r}")
        if not isinstance(size, int) or size < MIN_IMAGE_SIZE:
            raise ValueError(f"chart_qa: image_size must be an integer >= {MIN_IMAGE_SIZE}, got {size!r}")

    def make(self, seed: int) -> dict:
        """Example ``seed``: kind, number of categories, values (redrawn until the maximum is
        unique), colour, then the question."""
        rng = random.Random(seed)
        o = self.options
        kind = rng.choice(o["kinds"])
        n = rng.randint(o["min_categories"], o["max_categories"])
        labels = list(string.ascii_uppercase[:n])
        while True:
            values = [rng.randint(1, MAX_VALUE) for _ in range(n)]
            if values.count(max(values)) == 1:
                break
        color = rng.choice(PALETTE)
        image, boxes = draw_chart(kind, labels, values, o["image_size"], color)
        qtype = rng.choice(o["questions"])
        if qtype == "value":
            i = rng.randrange(n)
            asked, question, answer = [labels[i]], f"What is the value of {labels[i]}?", str(values[i])
        elif qtype == "compare":
            # Two categories with different values (one exists: the maximum is unique), in a
            # random order, so "yes" and "no" are equally likely.
            pairs = [(i, j) for i in range(n) for j in range(n) if values[i] != values[j]]
            i, j = rng.choice(pairs)
            asked = [labels[i], labels[j]]
            question = f"Is {labels[i]} higher than {labels[j]}?"
            answer = "yes" if values[i] > values[j] else "no"
        else:
            i = values.index(max(values))
            asked, question, answer = [labels[i]], "Which is the highest?", labels[i]
        return {"image": image, "question": question, "answer": answer, "qtype": qtype, "kind": kind,
                "labels": labels, "values": values, "asked": asked, "boxes": boxes,
                "image_size": image.size, "id": seed}

    def examples(self, split: str):
        return self.file_or_synthetic(split, SPLIT_SEEDS, parse_record)


    @staticmethod
    def _value(ex: dict, label: str) -> int:
        return ex["values"][ex["labels"].index(label)]

    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        """The values of the categories the answer rests on: "B is at 7."."""
        if ex.get("values") is None:  # real data: no drawn values to reason from
            return "I read the chart."
        said = ", ".join(f"{a} is at {self._value(ex, a)}" for a in ex["asked"])
        if ex["qtype"] == "max":
            said += ", the highest"
        return f"{said}."

    def hints(self, ex: dict) -> list[str]:
        """Scaf-GRPO's three tiers, least to most revealing: which bar or point to look at
        (knowledge), its approximate height (planning), the answer (solution)."""
        answer = f"The answer is {ex['answer']}."
        if ex.get("values") is None:
            return ["Read the labels and the axis.", "Find the part of the chart the question names.", answer]
        thing = "bar" if ex["kind"] == "bar" else "point"
        asked = ex["asked"]
        if ex["qtype"] == "value":
            v = self._value(ex, asked[0])
            return [f"Look at the {thing} above {asked[0]}.", f"{asked[0]} is between {v - 1} and {v + 1}.", answer]
        if ex["qtype"] == "compare":
            a, b = asked
            return [f"Look at the {thing}s above {a} and {b}.",
                    f"{a} is about {self._value(ex, a)}, {b} is about {self._value(ex, b)}.", answer]
        top = "tallest bar" if thing == "bar" else "highest point"
        return [f"Look for the {top}.", f"The highest is about {max(ex['values'])}.", answer]

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: ChartQA relaxed accuracy (unparsable counts as wrong); accuracy/<type> for
        each question type present in the batch; parsed: has an answer block."""
        correct, parsed = [], 0
        by_type: dict[str, list[float]] = {}
        for c, ex in zip(completions, examples):
            pred = extract_answer(c)
            parsed += pred is not None
            ok = 0.0 if pred is None else relaxed_correct(pred, ex["answer"])
            correct.append(ok)
            if ex.get("qtype"):
                by_type.setdefault(ex["qtype"], []).append(ok)
        n = max(1, len(correct))
        out = {"accuracy": sum(correct) / n, "parsed": parsed / n}
        for qtype in sorted(by_type):
            out[f"accuracy/{qtype}"] = sum(by_type[qtype]) / len(by_type[qtype])
        return out

    def visualize(self, ex: dict, completion: str):
        """The chart upscaled, the bars or points the question is about boxed in green, and the
        question, true and predicted answers written below (green when right, else red)."""
        scale = max(1, (VIS_SCALE * 112) // max(ex["image"].size))
        image, draw = canvas(ex["image"], scale=scale, footer=FOOTER)
        for label in ex.get("asked") or ():
            x1, y1, x2, y2 = ex["boxes"][ex["labels"].index(label)]
            draw_box(draw, (x1 - 1, y1 - 1, x2 + 1, y2 + 1), TRUE, scale=scale)
        pred = extract_answer(completion)
        right = pred is not None and relaxed_correct(pred, ex["answer"]) == 1.0
        shown = "?" if pred is None else " ".join(pred.split())[:24]
        draw_label(draw, f"{ex['question'][:60]}  true {ex['answer']}  pred {shown}", TRUE if right else PRED)
        return image
