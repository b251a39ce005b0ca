"""``grounding``: the bounding box of the one object of a named colour and shape."""

from __future__ import annotations

import random

from mmrl import Task, register_task
from mmrl.data.records import BadRecord, require_image
from mmrl.data.scenes import position_word, random_scene
from mmrl.measures.boxes import answer_box, answer_iou
from mmrl.media.coords import Frame, box_problem, convert_box, pixels_to_prediction
from mmrl.media.draw import PRED, TRUE, canvas, draw_box
from mmrl.parsing import parse_box

SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
# Kept short on purpose: the tiny model's 1k-token vocabulary is trained on these texts.
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>[x1, y1, x2, y2]</answer>."
# thinking=False (CLS-RL / No-Thinking-RL): the model answers directly, no reasoning block.
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>[x1, y1, x2, y2]</answer>."


def format_box(box) -> str:
    return "[" + ", ".join(str(int(v)) for v in box) + "]"


def parse_rec_record(record: dict) -> dict:
    """One VLM-R1 / RefCOCO-style REC record: ``image``, ``question`` (or ``problem`` /
    ``normal_caption``), ``answer`` (or ``solution`` / ``box``: a box as a list, or text such as
    "<answer>[..]</answer>"). VLM-R1's ``conversations`` layout gives question and answer. A box
    is kept as written, list or text: an inverted one is refused once the image is read."""
    image = require_image(record)
    question = record.get("question") or record.get("problem") or record.get("normal_caption")
    if not question:
        raise BadRecord("no 'question' (or 'problem' / 'normal_caption') text")
    solution = next((record[k] for k in ("answer", "solution", "box") if record.get(k) is not None), None)
    box = tuple(float(v) for v in solution) if isinstance(solution, (list, tuple)) else parse_box(str(solution), order=False)
    if box is None or len(box) != 4:
        raise BadRecord(f"the answer is not a box: {solution!r}")
    return {"image": image, "question": str(question).strip(), "file_box": box}


def finish_rec_example(ex: dict, box_space: str) -> dict:
    """Convert the file's box to original-image pixels once the image (and its size) is known;
    a box that is not finite, inverted or off the image is a :class:`BadRecord`."""
    w, h = ex["image_size"]
    box = convert_box(ex.pop("file_box"), box_space, "pixel", Frame(w, h))
    problem = box_problem(box, w, h)
    if problem:  # skipped and counted by the reader (FileExamples.bad_targets)
        raise BadRecord(f"{problem} (read as {box_space} coordinates)")
    return {**ex, "box": box, "answer": format_box(round(v) for v in box)}


@register_task("grounding")
class Grounding(Task):
    """Boxes are in pixels of the image as given (the tiny model sees it unresized), right/bottom
    exclusive like :mod:`mmrl.data.scenes`; ``image_size`` is recorded for later conversions."""

    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "iou": 1.0}

    def default_options(self):
        return {
            "min_objects": 2,
            "max_objects": 4,
            "image_size": 112,
            "train_size": 1_000_000,
            "eval_size": 1000,
            "thinking": True,  # False: answer-only prompt and target, format mode answer_only
            # Referring-expression data in the VLM-R1 / RefCOCO JSONL format instead of synthetic
            # scenes: {"image": path, "problem": text, "solution": [x1, y1, x2, y2]}.
            "train_path": None,
            "eval_path": None,
            "image_root": None,  # image paths are relative to this (default: the file's folder)
            "box_space": "pixel",  # the file's box coordinates: pixel | rel1000 | norm
        }

    def __init__(self, **options):
        super().__init__(**options)
        lo, hi = self.options["min_objects"], self.options["max_objects"]
        if not 1 <= lo <= hi <= 12:  # 4 colours x 3 shapes distinct pairs
            raise ValueError(f"grounding: need 1 <= min_objects <= max_objects <= 12, got {lo}, {hi}")

    def make(self, seed: int) -> dict:
        """Example ``seed``: 2-4 objects with unique (colour, shape), so the query names one."""
        rng = random.Random(seed)
        o = self.options
        n = rng.randint(o["min_objects"], o["max_objects"])
        scene = random_scene(rng, n, size=o["image_size"], unique=True)
        obj = rng.choice(scene.objects)
        return {
            "image": scene.image,
            "question": f"Give the bounding box of the {obj.color} {obj.shape}.",
            "answer": format_box(obj.box),
            "box": tuple(obj.box),
            "query": {"color": obj.color, "shape": obj.shape},
            "objects": [x.to_dict() for x in scene.objects],
            "image_size": scene.image.size,
            "id": seed,
        }

    def examples(self, split: str):
        space = self.options["box_space"]
        return self.file_or_synthetic(split, SPLIT_SEEDS, parse_rec_record, box_key="file_box", box_space=space,
                                      finish=lambda ex: finish_rec_example(ex, space))


    def reference_answer(self, ex: dict) -> str:
        """The box in the policy's coordinate space when the example says which
        (``pred_space``/``frame``, set by the trainer), else in pixels."""
        return format_box(round(v) for v in pixels_to_prediction(ex["box"], ex))

    def reasoning(self, ex: dict) -> str:
        t = ex.get("query")
        thing = f"{t['color']} {t['shape']}" if t else "object"
        return f"The {thing} is at the {position_word(ex['box'], ex['image_size'])}."

    def hints(self, ex: dict) -> list[str]:
        """Scaf-GRPO's three tiers, least to most revealing: what to look for (knowledge), which
        third of the image it is in (planning, the words of the reference reasoning), the box
        itself (solution)."""
        t = ex.get("query")
        where = position_word(ex["box"], ex["image_size"])
        what = f"Look for the {t['color']} {t['shape']}." if t else "Find what the sentence names."
        return [what, f"Look at: {where}.", f"The box is {format_box(round(v) for v in pixels_to_prediction(ex['box'], ex))}."]

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: IoU >= 0.5; mean_iou counts unparsable answers as 0."""
        ious = [answer_iou(c, ex) for c, ex in zip(completions, examples)]
        n = max(1, len(ious))
        return {
            "accuracy": sum(1.0 for v in ious if v is not None and v >= 0.5) / n,
            "mean_iou": sum(v or 0.0 for v in ious) / n,
            "parsed": sum(v is not None for v in ious) / n,
        }

    def visualize(self, ex: dict, completion: str):
        """The image upscaled, true box in green, predicted box (if parsable) in red."""
        image, draw = canvas(ex["image"])
        draw_box(draw, ex["box"], TRUE)
        pred = answer_box(completion, ex)
        if pred is not None:
            draw_box(draw, pred, PRED)
        return image
