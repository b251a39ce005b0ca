"""``visual_math``: small math questions whose numbers are only in the image.

Synthetic kinds (deterministic by seed; train and eval seeds disjoint):

- ``arith``: an expression such as ``3 + 4 x 2`` is drawn as text on the image (``x`` is
  multiplication and binds tighter than ``+``/``-``; values are never negative); "What is the
  value shown?"
- ``count_sum``: a scene of circles and squares (:mod:`mmrl.data.scenes`); "How many circles and
  squares are there in all?"
- ``choice``: either of the above as multiple choice, options A-D listed in the prompt
  (``ex["options"]``), the correct letter as the answer.

Real data: MathVista / MathVerse-style JSONL (``train_path`` / ``eval_path``, images relative to
``image_root`` or the file's folder), one object a line::

    {"image": "images/1.png", "question": "...", "answer": "12", "choices": ["3", "12"]}

``problem`` may stand for ``question``, ``options`` for ``choices``; choices are a list (read as
A, B, C, ...) or a letter -> text object. An answer given as an option's text becomes its letter.
Bad records are skipped and counted (:class:`mmrl.data.records.FileExamples`).

Scored by ``math_answer`` (Math-Verify's equivalence with mmrl's documented rules,
:mod:`mmrl.measures.math_equivalence`).
"""

from __future__ import annotations

import random
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from mmrl import Task, image_prompt, register_task
from mmrl.data.records import BadRecord, require_image
from mmrl.data.scenes import BACKGROUND, noun_phrase, scene_with_targets
from mmrl.measures.math_equivalence import clean, compare, normalize_options, truth_letter
from mmrl.media.draw import FOOTER, PRED, TRUE, canvas, draw_box, draw_label
from mmrl.parsing import extract_answer, normalize

KINDS = ("arith", "count_sum", "choice")
BASE_KINDS = ("arith", "count_sum")  # what a "choice" question wraps
SPLIT_SEEDS = {"train": 11, "eval": 12}  # distinct seeds: eval examples are never trained on
# Kept short on purpose, like counting's: a tiny model's vocabulary is trained on these texts.
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>{slot}</answer>."
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>{slot}</answer>."
ARITH_QUESTION = "What is the value shown?"
COUNT_SUM_QUESTION = "How many circles and squares are there in all?"
TEXT_COLOR = (20, 20, 20)
OPS = ("+", "-", "x")


@lru_cache(maxsize=16)
def _font(size: int):
    """Pillow's bundled scalable font at ``size`` px (a fixed bitmap font on old Pillow)."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: no size argument
        return ImageFont.load_default()


def evaluate(tokens: list) -> tuple[int, list[str]]:
    """Value of ``[a, op, b, op, c, ...]`` with ``x`` before ``+``/``-``, and the steps taken
    ("4 x 2 = 8", "3 + 8 = 11"), in the order a person would write them."""
    steps: list[str] = []
    tokens = list(tokens)
    i = 1
    while i < len(tokens):  # multiplications first, left to right
        if tokens[i] == "x":
            a, b = tokens[i - 1], tokens[i + 1]
            steps.append(f"{a} x {b} = {a * b}")
            tokens[i - 1 : i + 2] = [a * b]
        else:
            i += 2
    value = tokens[0]
    for i in range(1, len(tokens), 2):
        b = tokens[i + 1]
        new = value + b if tokens[i] == "+" else value - b
        steps.append(f"{value} {tokens[i]} {b} = {new}")
        value = new
    return value, steps


def _counted(n: int, shape: str) -> str:
    """ "1 circle", "3 circles"."""
    return f"{n} {noun_phrase(None, shape, n)}"


def expression_text(tokens: list) -> str:
    return " ".join(str(t) for t in tokens)


@register_task("visual_math")
class VisualMath(Task):
    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)  # with a {slot} to fill
    rewards = {"format": 0.5, "math_answer": 1.0}

    def default_options(self):
        return {
            "kinds": list(KINDS),  # any of "arith", "count_sum", "choice"
            "max_operand": 9,  # arith operands are 1..max_operand
            "max_terms": 3,  # arith expressions have 2..max_terms operands
            "max_group": 4,  # count_sum: 1..max_group circles and as many squares
            "num_choices": 4,  # choice: options A, B, C, D
            "image_size": 112,
            "train_size": 1_000_000,
            "eval_size": 1000,
            "thinking": True,  # False: answer-only prompt and target, format mode answer_only
            "train_path": None,  # JSONL (MathVista/MathVerse style) instead of synthetic train data
            "eval_path": None,  # likewise for eval
            "image_root": None,  # where the JSONL's image paths start; default: the file's folder
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        kinds = o["kinds"]
        if isinstance(kinds, str) or not kinds or any(k not in KINDS for k in kinds):
            raise ValueError(f"visual_math: kinds must be a non-empty list of {KINDS}, got {kinds!r}")
        self.kinds = tuple(dict.fromkeys(kinds))
        if not 1 <= o["max_operand"] <= 99:
            raise ValueError(f"visual_math: max_operand must be within 1..99, got {o['max_operand']}")
        if not 2 <= o["max_terms"] <= 4:
            raise ValueError(f"visual_math: max_terms must be within 2..4, got {o['max_terms']}")
        if not 1 <= o["max_group"] <= 8:  # two groups in the 16 cells of the scene grid
            raise ValueError(f"visual_math: max_group must be within 1..8, got {o['max_group']}")
        if not 2 <= o["num_choices"] <= 10:
            raise ValueError(f"visual_math: num_choices must be within 2..10, got {o['num_choices']}")

    # -- synthetic examples -----------------------------------------------------------------------
    def _arith(self, rng: random.Random) -> dict:
        o = self.options
        for _ in range(50):  # redraw until the value is not negative (almost always at once)
            n = rng.randint(2, o["max_terms"])
            tokens: list = [rng.randint(1, o["max_operand"])]
            for _ in range(n - 1):
                tokens += [rng.choice(OPS), rng.randint(1, o["max_operand"])]
            value, steps = evaluate(tokens)
            if value >= 0:
                break
        else:
            tokens = [t if i % 2 == 0 else "+" for i, t in enumerate(tokens)]
            value, steps = evaluate(tokens)
        text = expression_text(tokens)
        size = o["image_size"]
        image = Image.new("RGB", (size, size), BACKGROUND)
        draw = ImageDraw.Draw(image)
        font_px = max(8, size // 5)
        while font_px > 8:
            x1, y1, x2, y2 = draw.textbbox((0, 0), text, font=_font(font_px))
            if x2 - x1 <= size - 8:
                break
            font_px -= 1
        font = _font(font_px)
        x1, y1, x2, y2 = draw.textbbox((0, 0), text, font=font)
        w, h = x2 - x1, y2 - y1
        x = rng.randint(2, max(2, size - w - 2)) - x1
        y = rng.randint(2, max(2, size - h - 2)) - y1
        draw.text((x, y), text, fill=TEXT_COLOR, font=font)
        return {
            "image": image,
            "question": ARITH_QUESTION,
            "answer": str(value),
            "value": value,
            "expression": text,
            "steps": steps,
            "objects": [],
        }

    def _count_sum(self, rng: random.Random) -> dict:
        o = self.options
        circles, squares = rng.randint(1, o["max_group"]), rng.randint(1, o["max_group"])
        scene = scene_with_targets(rng, (None, "circle"), num_targets=circles, num_distractors=squares,
                                   size=o["image_size"], shapes=("circle", "square"))
        value = circles + squares
        return {
            "image": scene.image,
            "question": COUNT_SUM_QUESTION,
            "answer": str(value),
            "value": value,
            "counts": {"circle": circles, "square": squares},
            "steps": [f"{_counted(circles, 'circle')} + {_counted(squares, 'square')} = {value}"],
            "objects": [obj.to_dict() for obj in scene.objects],
        }

    def _choice(self, rng: random.Random) -> dict:
        base_kind = rng.choice(BASE_KINDS)
        ex = self._arith(rng) if base_kind == "arith" else self._count_sum(rng)
        value = ex["value"]
        k = self.options["num_choices"]
        near = [value + d for d in range(-k - 1, k + 2) if d and value + d >= 0]  # >= k - 1 of them
        values = rng.sample(near, k - 1)
        values.insert(rng.randint(0, len(values)), value)
        options = {chr(ord("A") + i): str(v) for i, v in enumerate(values)}
        letter = chr(ord("A") + values.index(value))
        return {**ex, "answer": letter, "options": options, "base_kind": base_kind}

    def make(self, seed: int) -> dict:
        """Example ``seed``: the kind is drawn first (uniform over ``kinds``), then its content."""
        rng = random.Random(seed)
        kind = rng.choice(self.kinds)
        ex = {"arith": self._arith, "count_sum": self._count_sum, "choice": self._choice}[kind](rng)
        ex.setdefault("options", None)
        ex.update(kind=kind, image_size=ex["image"].size, id=seed)
        return ex

    # -- real data ------------------------------------------------------------------------------------
    @staticmethod
    def parse_record(record: dict) -> dict:
        """One MathVista/MathVerse-style JSON object -> an example (raises BadRecord to skip it)."""
        question = record.get("question") or record.get("problem")
        if not isinstance(question, str) or not question.strip():
            raise BadRecord("no 'question' (or 'problem') text")
        answer = record.get("answer")
        if answer is None or isinstance(answer, (bool, dict, list)) or not str(answer).strip():
            raise BadRecord("no usable 'answer' (a string or a number)")
        image = require_image(record)
        raw = record.get("choices")
        if raw is None:
            raw = record.get("options")
        options = None
        if raw not in (None, [], {}, ""):
            options = normalize_options(raw)
            if options is None:
                raise BadRecord("'choices'/'options' must be a list or an object of letter -> text")
        answer = str(answer).strip()
        ex = {"image": image.strip() if isinstance(image, str) else image, "question": question.strip(), "answer": answer, "options": options,
              "kind": "choice" if options else "open", "id": record.get("id", record.get("pid")),
              # what benchmark tables break down by: MathVista's metadata (task, skills), MathVerse's version
              "metadata": record.get("metadata") if isinstance(record.get("metadata"), dict) else {},
              "problem_version": record.get("problem_version")}
        if options:
            letter = truth_letter(answer)
            if letter is not None and letter in options:
                ex["answer"] = letter  # "(C)" / "C." -> "C"
            else:
                # The answer is an option's text (MathVista's layout): use that option's letter.
                same = [k for k, v in options.items() if normalize(clean(v)) == normalize(clean(answer))]
                if not same:
                    same = [k for k, v in options.items() if compare(v, answer)[0]]
                if len(same) == 1:
                    ex["answer"], ex["answer_text"] = same[0], answer
                elif letter is not None:
                    raise BadRecord(f"answer {answer!r} is not one of the option letters {sorted(options)}")
        if isinstance(record.get("solution"), str) and record["solution"].strip():
            ex["solution"] = record["solution"].strip()
        return ex

    def examples(self, split: str):
        return self.file_or_synthetic(split, SPLIT_SEEDS, self.parse_record)

    # -- prompts and targets ----------------------------------------------------------------------
    def prompt(self, ex: dict) -> list[dict]:
        options = ex.get("options")
        text = ex["question"]
        if options and "choices" not in text.casefold():
            text += " Choices: " + " ".join(f"({k}) {v}" for k, v in options.items()) + "."
        slot = "letter" if options else ("number" if ex.get("kind") in BASE_KINDS else "answer")
        return image_prompt(ex["image"], f"{text} {self.instruction().format(slot=slot)}")

    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        if "steps" in ex:
            text = ". ".join(ex["steps"]) + "."
            if ex.get("options"):
                text += f" Option {ex['answer']}."
            return text
        return ex.get("solution") or f"The answer is {ex['answer']}."

    def hints(self, ex: dict) -> list[str]:
        """Scaf-GRPO's three tiers, least to most revealing: how to solve it (knowledge), the
        first step or the counts (planning), the answer (solution). JSONL examples have none."""
        if "steps" not in ex:
            return []
        if "expression" in ex:
            ops = set(ex["expression"].split()) & set(OPS)
            knowledge = "Do x before + and -." if "x" in ops and ops - {"x"} else "Work from left to right."
            planning = f"First: {ex['steps'][0]}."
        else:
            c = ex["counts"]
            knowledge = "Count the circles, then the squares, and add."
            planning = f"There are {_counted(c['circle'], 'circle')} and {_counted(c['square'], 'square')}."
        if ex.get("options"):
            solution = f"The value is {ex['value']}, option {ex['answer']}."
        else:
            solution = f"The answer is {ex['answer']}."
        return [knowledge, planning, solution]

    # -- evaluation -------------------------------------------------------------------------------
    @staticmethod
    def _correct(completion: str, ex: dict) -> tuple[float, bool]:
        pred = extract_answer(completion)
        if pred is None:
            return 0.0, False
        return (1.0 if compare(pred, ex["answer"], ex.get("options"))[0] else 0.0), True

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy (unparsable counts as wrong), parsed, and accuracy/<kind> for each kind in
        the batch (arith, count_sum, choice; open/choice for JSONL data)."""
        by_kind: dict[str, list[float]] = {}
        correct, parsed = [], 0
        for c, ex in zip(completions, examples):
            score, ok = self._correct(c, ex)
            correct.append(score)
            parsed += ok
            by_kind.setdefault(str(ex.get("kind", "open")), []).append(score)
        n = max(1, len(correct))
        out = {"accuracy": sum(correct) / n, "parsed": parsed / n}
        for kind, scores in sorted(by_kind.items()):
            out[f"accuracy/{kind}"] = sum(scores) / len(scores)
        return out

    def visualize(self, ex: dict, completion: str):
        """The image upscaled; for counting questions the circles and squares boxed in green; the
        true vs predicted answer written below it (red when wrong)."""
        image, draw = canvas(ex["image"], footer=FOOTER)
        for obj in ex.get("objects") or []:
            if obj["shape"] in ("circle", "square"):
                draw_box(draw, obj["box"], TRUE)
        pred = extract_answer(completion)
        score, _ = self._correct(completion, ex)
        truth = ex["answer"]
        if ex.get("options") and truth in ex["options"]:
            truth = f"{truth} ({ex['options'][truth]})"
        shown = "?" if pred is None else (pred if len(pred) <= 24 else pred[:21] + "...")
        draw_label(draw, f"{ex.get('kind', '')}: true {truth}  pred {shown}", TRUE if score else PRED)
        return image
