"""``counting``: how many objects of a colour / shape / both are in a synthetic scene?"""

from __future__ import annotations

import random

from mmrl import Task, register_task
from mmrl.data.records import BadRecord, require_image
from mmrl.data.scenes import COLORS, DEFAULT_GRID, SHAPES, cell_of, noun_phrase, position_word, scene_with_targets
from mmrl.media.draw import FOOTER, PRED, TRUE, canvas, draw_box, draw_label
from mmrl.parsing import answer_correct, extract_answer, parse_number

QUERIES = ("color", "shape", "color_shape")
REASONING = ("count", "enumerate")
SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
# Kept short on purpose: the tiny model's 1k-token vocabulary is trained on these texts.
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>number</answer>."
# thinking=False (CLS-RL / No-Thinking-RL): the model answers directly, no reasoning block.
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>number</answer>."
# position_word's names of the 3x3 regions in reading order, so hints list regions stably.
REGIONS = ("top left", "top", "top right", "left", "center", "right", "bottom left", "bottom", "bottom right")


def matches_query(obj: dict, query: dict) -> bool:
    """Does a scene object (as a dict) fit the query? None means "any" for that attribute."""
    return (query["color"] is None or obj["color"] == query["color"]) and (
        query["shape"] is None or obj["shape"] == query["shape"]
    )


def parse_count_record(record: dict) -> dict:
    """One CLEVR-style counting record: ``image``, ``question``/``problem``, ``answer``/``solution``
    (a whole number, possibly inside "<answer>...</answer>")."""
    image = require_image(record)
    question = record.get("question") or record.get("problem")
    if not question:
        raise BadRecord("no 'question' (or 'problem') text")
    raw = record.get("answer", record.get("solution"))
    text = extract_answer(str(raw)) if isinstance(raw, str) and "<answer>" in raw else raw
    value = parse_number(str(text)) if text is not None else None
    if value is None or value < 0 or value != int(value):
        raise BadRecord(f"the answer is not a count: {raw!r}")
    return {"image": image, "question": str(question).strip(), "answer": str(int(value))}


def enumeration(ex: dict) -> str:
    """ "Red shapes in cells 3, 9" (cells of the scene's grid numbered 1.. in reading order), or
    "Red shapes in cells none": the matches of a synthetic example, one by one."""
    q, size = ex["query"], ex["image_size"][0]
    cells = sorted(cell_of(o["box"], size) + 1 for o in ex["objects"] if matches_query(o, q))
    noun = noun_phrase(q["color"], q["shape"], 2).capitalize()
    return f"{noun} in cells {', '.join(map(str, cells)) or 'none'}"


@register_task("counting")
class Counting(Task):
    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "accuracy": 1.0}
    answer_only_rewards = {"equality": 1.0}

    def default_options(self):
        return {
            "query": "color_shape",  # "color", "shape" or "color_shape"
            "max_count": 4,
            "max_distractors": 3,
            "image_size": 112,
            "train_size": 1_000_000,
            "eval_size": 1000,
            "thinking": True,  # False: answer-only prompt and target, equality reward (CLS-RL)
            # The reference reasoning: "count" states the count ("I count 2 red shapes."),
            # "enumerate" first lists the grid cells of the matches in reading order ("Red shapes in
            # cells 3, 9: I count 2 red shapes."), a chain of thought that counts by pointing.
            "reasoning": "count",
            # Real counting data (CLEVR / SuperCLEVR style JSONL) instead of synthetic scenes:
            # {"image": path, "problem" or "question": text, "solution" or "answer": count}.
            "train_path": None,
            "eval_path": None,
            "image_root": None,
        }

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["query"] not in QUERIES:
            raise ValueError(f"counting: query must be one of {QUERIES}, got {self.options['query']!r}")
        if self.options["reasoning"] not in REASONING:
            raise ValueError(f"counting: reasoning must be one of {REASONING}, got {self.options['reasoning']!r}")
        most = self.options["max_count"] + self.options["max_distractors"]
        if self.options["max_count"] < 0 or self.options["max_distractors"] < 0 or most > DEFAULT_GRID**2:
            raise ValueError(
                f"counting: max_count + max_distractors must be within 0..{DEFAULT_GRID ** 2} "
                f"(one object per grid cell), got {most}"
            )

    def make(self, seed: int) -> dict:
        """Example ``seed``: the count is drawn first (uniform 0..max_count), then the scene."""
        rng = random.Random(seed)
        o = self.options
        query = o["query"]
        color = rng.choice(list(COLORS)) if query in ("color", "color_shape") else None
        shape = rng.choice(SHAPES) if query in ("shape", "color_shape") else None
        k = rng.randint(0, o["max_count"])
        m = rng.randint(0, o["max_distractors"])
        scene = scene_with_targets(rng, (color, shape), num_targets=k, num_distractors=m, size=o["image_size"])
        return {
            "image": scene.image,
            "question": f"How many {noun_phrase(color, shape, 2)} are there?",
            "answer": str(k),
            "query": {"color": color, "shape": shape},
            "objects": [obj.to_dict() for obj in scene.objects],
            "image_size": scene.image.size,
            "id": seed,
        }

    def examples(self, split: str):
        return self.file_or_synthetic(split, SPLIT_SEEDS, parse_count_record)


    def reference_answer(self, ex: dict) -> str:
        return str(int(ex["answer"]))

    def reasoning(self, ex: dict) -> str:
        k = int(ex["answer"])
        q = ex.get("query")
        what = f" {noun_phrase(q['color'], q['shape'], k)}" if q else ""
        thought = f"I count {k}{what}."
        if self.options["reasoning"] == "enumerate" and q and "objects" in ex:
            thought = f"{enumeration(ex)}: {thought}"
        return thought

    def hints(self, ex: dict) -> list[str]:
        """Scaf-GRPO's three tiers, least to most revealing: which objects count (knowledge), in
        which regions of the image they are (planning), the count itself (solution). Words are
        the task's own ("red circles", "top left") so the tiny tokenizer knows them."""
        q = ex.get("query")
        if q is None or "objects" not in ex:  # read from a file: no scene description to hint from
            return ["Count each object once.", "Go row by row, left to right.", f"The answer is {ex['answer']}."]
        color, shape = q["color"], q["shape"]
        if color is not None and shape is not None:
            knowledge = f"Count only {noun_phrase(color, shape, 2)}; ignore other shapes."
        elif color is not None:
            knowledge = f"Count {color} shapes of any kind; ignore other colors."
        elif shape is not None:
            knowledge = f"Count {noun_phrase(None, shape, 2)} of any color; ignore other shapes."
        else:
            knowledge = "Count all shapes."
        size = ex["image_size"][0]
        found = {position_word(o["box"], size) for o in ex["objects"] if matches_query(o, q)}
        where = [r for r in REGIONS if r in found]
        planning = f"Look at: {', '.join(where)}." if where else "None are there."
        return [knowledge, planning, f"The answer is {ex['answer']}."]

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: exactly right (unparsable counts as wrong); mae over parsable answers only."""
        correct, errors = [], []
        for c, ex in zip(completions, examples):
            pred = extract_answer(c)
            correct.append(0.0 if pred is None else answer_correct(pred, ex["answer"]))
            value = parse_number(pred) if pred is not None else None
            if value is not None:
                errors.append(abs(value - float(ex["answer"])))
        n = max(1, len(correct))
        return {
            "accuracy": sum(correct) / n,
            "mae": sum(errors) / len(errors) if errors else float("nan"),
            "parsed": len(errors) / n,
        }

    def visualize(self, ex: dict, completion: str):
        """The image upscaled with the objects that match the question boxed in green, and the
        true vs predicted count written below it (red when wrong)."""
        image, draw = canvas(ex["image"], footer=FOOTER)
        q = ex.get("query")
        for obj in ex.get("objects", []) if q else []:
            if matches_query(obj, q):
                draw_box(draw, obj["box"], TRUE)
        pred = extract_answer(completion)
        right = pred is not None and answer_correct(pred, ex["answer"])
        draw_label(draw, f"{ex['question']}  true {ex['answer']}  pred {pred if pred is not None else '?'}", TRUE if right else PRED)
        return image

