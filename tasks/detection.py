"""``detection``: open-vocabulary detection, every object of one or two named categories.

"Find every red shape." / "Find every circle and square." on a synthetic scene (the default), or
any JSONL file of real images in the format below. The answer is a list of boxes in the answer
block, ``<answer>[[x1, y1, x2, y2], [x1, y1, x2, y2]]</answer>``, ``[]`` when nothing matches.

Real data (``train_path`` / ``eval_path``), one JSON object per line::

    {"image": "rel/path.jpg", "problem": "Find every person.", "boxes": [[x1, y1, x2, y2], ...],
     "labels": ["person", ...]}

``image`` is relative to ``image_root`` (default: the file's folder), ``labels`` is optional
(one per box), ``boxes`` may be empty, and ``box_space`` names the file's coordinate space:
``pixel`` (original-image pixels), ``rel1000`` (0-1000) or ``norm`` (0-1). Boxes are converted to
original-image pixels when an example is read (the image is opened then, which gives its size).
A split without a path uses the synthetic generator.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from mmrl import Task, register_task
from mmrl.data.records import BadRecord, require_image
# place_in_cell: the scenes' one-object-per-28-px-cell placement, reused so detection scenes look
# exactly like counting's (scene_with_targets cannot take a two-category query).
from mmrl.data.scenes import (COLORS, DEFAULT_GRID, SHAPES, SceneObject, noun_phrase, place_in_cell,
                              position_word, render_scene)
from mmrl.measures.detection import answer_boxes, ap50_score, match_boxes, truth_boxes
from mmrl.media.coords import Frame, box_problem, convert_box, pixels_to_prediction
from mmrl.media.draw import FOOTER, PRED, TRUE, canvas, draw_box, draw_label
from mmrl.parsing import extract_answer, parse_boxes

SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
# Kept short on purpose: the tiny model's 1k-token vocabulary is trained on these texts.
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>[[x1, y1, x2, y2], ...]</answer>."
# thinking=False (CLS-RL / No-Thinking-RL): the model answers directly, no reasoning block.
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>[[x1, y1, x2, y2], ...]</answer>."
QUERY_KINDS = ("color", "shape", "color_shape")
BOX_SPACES = ("pixel", "rel1000", "norm")  # coordinate spaces a data file may use
_SPACE_LIMIT = {"rel1000": 1000.0, "norm": 1.0}  # largest valid coordinate, checked per line
VIS_SIDE = 448  # visualisations are upscaled to about this many pixels on the long side


def format_boxes(boxes) -> str:
    """``[[x1, y1, x2, y2], ...]`` with integer coordinates; ``[]`` for no box."""
    return "[" + ", ".join("[" + ", ".join(str(int(round(v))) for v in b) + "]" for b in boxes) + "]"


def category_phrase(category: dict, count: int = 1) -> str:
    """ "red circle", "red shape", "circle"; pluralised unless ``count`` is 1."""
    return noun_phrase(category["color"], category["shape"], count)


def query_phrase(query: Sequence[dict], count: int = 1) -> str:
    """The categories joined with "and": "circle and square", "red circles and blue squares"."""
    return " and ".join(category_phrase(c, count) for c in query)


def _matches(obj: dict, category: dict) -> bool:
    return (category["color"] is None or obj["color"] == category["color"]) and (
        category["shape"] is None or obj["shape"] == category["shape"]
    )


def _where(box, image_size) -> str:
    """``position_word`` (thirds of the image) for a box on an image of any aspect ratio."""
    w, h = (float(v) for v in image_size)
    return position_word((box[0] / w, box[1] / h, box[2] / w, box[3] / h), 1)


def _parse_record(record: dict, box_space: str) -> dict:
    """One record -> an example with boxes still in the file's space (``source_boxes``). The boxes
    are ``boxes``, or read from an ``answer`` text ("[[x1, y1, x2, y2], ...]", e.g. the assistant
    turn of a ``conversations`` record)."""
    image = require_image(record)
    problem = record.get("question", record.get("problem"))
    if not isinstance(problem, str) or not problem.strip():
        raise BadRecord("'question' (or 'problem') must be a non-empty string")
    boxes = record.get("boxes")
    if boxes is None and isinstance(record.get("answer"), str):
        parsed = parse_boxes(extract_answer(record["answer"]) or record["answer"])
        boxes = [list(b) for b in parsed] if parsed is not None else None
    if not isinstance(boxes, list):
        raise BadRecord("'boxes' must be a list of [x1, y1, x2, y2] boxes (possibly empty)")
    limit = _SPACE_LIMIT.get(box_space)
    parsed = []
    for b in boxes:
        if not (isinstance(b, list) and len(b) == 4 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in b)):
            raise BadRecord(f"box {b!r} is not four finite numbers")
        if limit is not None and max(b) > limit * 1.001:
            raise BadRecord(f"box {b} exceeds {limit:g}, the range of box_space {box_space!r}; is box_space right?")
        x1, y1, x2, y2 = (float(v) for v in b)
        if x2 < x1 or y2 < y1:  # not reordered: the file may mean another layout ([x, y, w, h]?)
            raise BadRecord(f"box {b} is inverted (x2 < x1 or y2 < y1); boxes are [x1, y1, x2, y2]")
        parsed.append((x1, y1, x2, y2))
    labels = record.get("labels")
    if labels is None:
        labels = ["object"] * len(parsed)
    elif not (isinstance(labels, list) and len(labels) == len(parsed) and all(isinstance(x, str) for x in labels)):
        raise BadRecord(f"'labels' must be a list of {len(parsed)} strings, one per box")
    ex = {"image": image, "question": problem.strip(), "source_boxes": parsed, "labels": list(labels)}
    if "id" in record:
        ex["id"] = record["id"]
    return ex


def to_pixel_boxes(ex: dict, box_space: str) -> dict:
    """Finish a file example once its image (hence its size) is known: the file's boxes, in
    ``box_space``, become original-image pixels; a box that is not finite, inverted or off the image
    makes the record a :class:`BadRecord`."""
    w, h = ex["image_size"]
    frame = Frame(float(w), float(h))
    boxes = [tuple(convert_box(b, box_space, "pixel", frame)) for b in ex.pop("source_boxes")]
    for box in boxes:  # one unusable target: the record is skipped and counted (FileExamples.bad_targets)
        problem = box_problem(box, w, h)
        if problem:
            raise BadRecord(f"{problem} (read as {box_space} coordinates)")
    return {**ex, "boxes": boxes, "answer": format_boxes(boxes)}


@register_task("detection")
class Detection(Task):
    """Boxes are in pixels of the original image, right/bottom exclusive like
    :mod:`mmrl.data.scenes`; predictions are converted from the policy's space box by box."""

    modality = "vlm"
    success_metric = "ap50"  # per image, 1.0 = every box found at IoU 0.5 and nothing extra ranked above
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "det_iou": 1.0}

    def default_options(self):
        return {
            "max_objects": 4,  # objects per synthetic scene (1..max_objects); any number may match
            "image_size": 112,
            "train_size": 1_000_000,
            "eval_size": 1000,
            "thinking": True,  # False: answer-only prompt and target, format mode answer_only
            # Real data: JSONL files (see the module docstring); None = synthetic scenes.
            "train_path": None,
            "eval_path": None,
            "image_root": None,  # default: each file's folder
            "box_space": "pixel",  # the files' coordinate space: pixel | rel1000 | norm
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        if not 1 <= o["max_objects"] <= DEFAULT_GRID**2:
            raise ValueError(
                f"detection: max_objects must be within 1..{DEFAULT_GRID ** 2} (one object per grid cell), "
                f"got {o['max_objects']}"
            )
        if o["box_space"] not in BOX_SPACES:
            raise ValueError(f"detection: box_space must be one of {BOX_SPACES}, got {o['box_space']!r}")

    # -- data -----------------------------------------------------------------------------------
    def make(self, seed: int) -> dict:
        """Example ``seed``: one or two categories of one kind (colours, shapes, or colour+shape
        pairs), a scene of 1..max_objects objects of which 0..all match, the rest matching none."""
        rng = random.Random(seed)
        o = self.options
        kind = rng.choice(QUERY_KINDS)
        n_categories = 1 if rng.random() < 0.75 else 2
        colors = rng.sample(list(COLORS), n_categories) if kind != "shape" else [None] * n_categories
        shapes = rng.sample(SHAPES, n_categories) if kind != "color" else [None] * n_categories
        query = [{"color": c, "shape": s} for c, s in zip(colors, shapes)]
        pairs = [{"color": c, "shape": s} for c in COLORS for s in SHAPES]
        others = [p for p in pairs if not any(_matches(p, q) for q in query)]
        n = rng.randint(1, o["max_objects"])
        k = rng.randint(0, n)
        chosen = []
        for _ in range(k):
            category = rng.choice(query)
            chosen.append(rng.choice([p for p in pairs if _matches(p, category)]))
        chosen += [rng.choice(others) for _ in range(n - k)]
        cells = rng.sample(range(DEFAULT_GRID**2), n)
        objects = [SceneObject(p["shape"], p["color"], place_in_cell(rng, cell, o["image_size"], DEFAULT_GRID))
                   for p, cell in zip(chosen, cells)]
        cell = o["image_size"] // DEFAULT_GRID
        objects.sort(key=lambda ob: (ob.box[1] // cell, ob.box[0]))  # reading order, not target-first
        scene = render_scene(objects, o["image_size"])
        objs = [ob.to_dict() for ob in scene.objects]
        boxes, labels = [], []
        for ob in objs:
            for category in query:
                if _matches(ob, category):
                    boxes.append(tuple(ob["box"]))
                    labels.append(category_phrase(category))
        return {
            "image": scene.image,
            "question": f"Find every {query_phrase(query)}.",
            "answer": format_boxes(boxes),
            "boxes": boxes,
            "labels": labels,
            "query": query,
            "objects": objs,
            "image_size": scene.image.size,
            "id": seed,
        }

    def examples(self, split: str):
        space = self.options["box_space"]
        return self.file_or_synthetic(split, SPLIT_SEEDS, lambda r: _parse_record(r, space),
                                      box_key="source_boxes", box_space=space,
                                      finish=lambda ex: to_pixel_boxes(ex, space))

    # -- prompting ------------------------------------------------------------------------------

    def reference_answer(self, ex: dict) -> str:
        """The true boxes in the policy's coordinate space when the example says which
        (``pred_space``/``frame``, set by the trainer), else in pixels."""
        return format_boxes(pixels_to_prediction(b, ex) for b in ex["boxes"])

    def _count_text(self, ex: dict) -> str:
        """ "2 red circles", "1 square", "0 circles and squares"; just the number for real data."""
        k = len(ex["boxes"])
        if "query" not in ex:
            return str(k)
        if k == 1 and ex.get("labels"):
            return f"1 {ex['labels'][0]}"
        return f"{k} {query_phrase(ex['query'], k)}"

    def reasoning(self, ex: dict) -> str:
        return f"I count {self._count_text(ex)}."

    def hints(self, ex: dict) -> list[str]:
        """Scaf-GRPO's three tiers, least to most revealing: what to find (knowledge), how many
        there are and in which thirds of the image (planning, in answer order), the answer."""
        if "query" in ex:
            knowledge = f"Box only {query_phrase(ex['query'], 2)}; ignore the rest."
        else:
            names = list(dict.fromkeys(x for x in ex.get("labels", []) if x != "object"))
            knowledge = f"Box every {' and '.join(names)}." if names else "Box every object the question names."
        boxes = ex["boxes"]
        if boxes:
            where = ", ".join(_where(b, ex["image_size"]) for b in boxes)
            planning = f"There {'is' if len(boxes) == 1 else 'are'} {len(boxes)}: {where}."
        else:
            planning = "There are none."
        return [knowledge, planning, f"The answer is {self.reference_answer(ex)}."]

    # -- evaluation -----------------------------------------------------------------------------
    def metrics(self, completions, examples) -> dict[str, float]:
        """ap50: mean over the batch of each image's AP at IoU 0.5 (the ``ap50`` reward;
        unparsable answers count as 0; there are no confidence scores to rank boxes across images,
        so this is the per-image mean, not a pooled COCO AP); mean_iou: mean IoU of the matched
        (prediction, truth) pairs over the batch (greedy one-to-one, IoU > 0; NaN without any);
        parsed: the fraction of answers with a parsable box list."""
        aps, ious, parsed = [], [], 0
        for c, ex in zip(completions, examples):
            preds, truths = answer_boxes(c, ex), truth_boxes(ex) or []
            if preds is None:
                aps.append(0.0)
                continue
            parsed += 1
            aps.append(ap50_score(preds, truths))
            ious.extend(iou for _, _, iou in match_boxes(preds, truths))
        n = max(1, len(aps))
        return {
            "ap50": sum(aps) / n,
            "mean_iou": sum(ious) / len(ious) if ious else float("nan"),
            "parsed": parsed / n,
        }

    def visualize(self, ex: dict, completion: str):
        """The image upscaled, true boxes in green, predicted boxes (if parsable) in red, and the
        question with the true and predicted box counts written below it (green when the answer's
        AP50 is 1, else red)."""
        w, h = ex["image"].size
        scale = max(1, round(VIS_SIDE / max(w, h)))
        image, draw = canvas(ex["image"], scale=scale, footer=FOOTER)
        for b in ex["boxes"]:
            draw_box(draw, b, TRUE, scale=scale)
        preds = answer_boxes(completion, ex)
        for b in preds or []:
            draw_box(draw, b, PRED, scale=scale)
        right = preds is not None and ap50_score(preds, truth_boxes(ex) or []) == 1.0
        got = "?" if preds is None else len(preds)
        draw_label(draw, f"{ex['question']}  true {len(ex['boxes'])}  pred {got}", TRUE if right else PRED)
        return image
