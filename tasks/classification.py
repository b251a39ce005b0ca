"""``classification``: pick the class of an image from a list of options given in the prompt.

CLS-RL (and its answer-only variant No-Thinking-CLS-RL) from "Think or Not Think: A Study of
Explicit Thinking in Rule-Based Visual Reinforcement Fine-Tuning": the prompt lists the classes,
the model names one, a rule checks it::

    Which shape is this? Options: circle, square, triangle. Answer with <think>...</think><answer>option</answer>.

Option ``thinking`` picks the mode. True: ``<think>..</think><answer>label</answer>``, rewards
format 0.5 + accuracy 1.0. False (No-Thinking-CLS-RL): answer-only prompt and target, reward
``{"equality": 1.0}`` only, so the policy is pushed to answer directly.

Where the images come from, per split (train / eval):

* nothing given (default): synthetic, one large coloured shape (:mod:`mmrl.data.scenes`); its class
  is its shape (``label: shape``, options circle, square, triangle) or its colour (``label: color``,
  options blue, green, red, yellow). Deterministic by seed; train and eval seeds are disjoint.
* ``train_dir`` / ``eval_dir``: an image folder with one subfolder per class (``root/cat/1.jpg``);
  the classes are the sorted subfolder names (or option ``classes``: only those, in that order).
  Images (jpg, jpeg, png, webp) are found recursively inside each class folder and opened on
  access (:class:`mmrl.data.images.ImageFiles`); an unreadable one is skipped and counted
  (``examples(split).stats()``).
* ``train_path`` / ``eval_path``: JSONL, one ``{"image": "a.jpg", "label": "cat"}`` per line, image
  paths relative to ``image_root`` (default: the file's folder). Bad lines are skipped and counted.
  The classes are option ``classes`` (lines with another label are skipped) or, by default, the
  labels seen in the file, sorted.

A split with a folder or JSONL source needs the other split to have one too (synthetic eval
examples would have other classes). Real images are resized to ``image_size`` square (``null``
keeps their size). Each example carries its option list in ``ex["classes"]``; set ``classes`` to
pin the same list for both splits when their folders/files might differ.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from mmrl import SyntheticExamples, Task, register_task
from mmrl.data.images import IMAGE_EXTENSIONS, ImageFiles, find_images
from mmrl.data.records import BadRecord, require_image
from mmrl.data.scenes import COLORS, SHAPES, SceneObject, render_scene
from mmrl.data.sequence import LazySequence, split_stats, usable_item
from mmrl.measures.answers import layout_answer, layout_score
from mmrl.media.draw import FOOTER, PRED, TRUE, canvas, draw_box, draw_label
from mmrl.parsing import normalize

LABELS = ("shape", "color")
SYNTHETIC_CLASSES = {"shape": tuple(SHAPES), "color": tuple(sorted(COLORS))}
SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
# Kept short on purpose: the tiny model's 1k-token vocabulary is trained on these texts.
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>option</answer>."
# thinking=False (No-Thinking-CLS-RL): the model answers directly, no reasoning block.
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>option</answer>."
QUESTIONS = {"shape": "Which shape is this?", "color": "Which color is this?", "class": "What is in this image?"}
# Planning-tier hints for synthetic shapes: a cue that does not name the answer.
SHAPE_CUES = {"circle": "It is round, with no corners.", "square": "It has four corners.",
              "triangle": "It has three corners."}
OBJECT_FRACTION = (0.45, 0.8)  # side of the synthetic object, as a fraction of the image side


def image_folder(root: str | Path, classes: Optional[Sequence[str]] = None, size: Optional[int] = None) -> ImageFiles:
    """An :class:`ImageFiles` over ``root/<class>/**/<image>``, ``meta`` = ``{"label": class}``.

    ``classes``: the subfolders to use, in that order (default: all, sorted by name); its
    ``classes`` attribute is the list used."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    subdirs = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if classes is None:
        classes = subdirs
    else:
        missing = [c for c in classes if c not in subdirs]
        if missing:
            raise ValueError(f"{root}: no subfolder for class(es) {missing}; subfolders: {subdirs}")
    if not classes:
        raise ValueError(f"{root} has no class subfolders (expected {root}/<class>/<image>)")
    paths, meta = [], []
    for c in classes:
        for p in find_images(root / c):
            paths.append(p)
            meta.append({"label": c})
    if not paths:
        raise ValueError(f"{root} has no images ({', '.join(IMAGE_EXTENSIONS)}) in its class subfolders")
    files = ImageFiles(paths, meta, size=size, name=str(root))
    files.classes = list(classes)
    return files


def _label(record: dict) -> str:
    label = record.get("label", record.get("answer"))
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        raise BadRecord(f"'label' must be a string or a number, got {label!r}")
    label = str(label).strip()
    if not label:
        raise BadRecord("empty 'label'")
    return label


class _Labelled(LazySequence):
    """A split's examples: ``base`` items (with ``image`` and ``label``) given ``answer``,
    ``classes`` and ``question``, and resized to ``size`` square when ``size``."""

    def __init__(self, base: Sequence[dict], classes: Sequence[str], question: str, size: Optional[int]):
        self.base, self.classes, self.question, self.size = base, list(classes), question, size

    def __len__(self) -> int:
        return len(self.base)

    def item(self, i: int) -> dict:
        return self._labelled(self.base[i])

    def usable(self, i: int) -> Optional[dict]:
        ex = usable_item(self.base, i)
        return None if ex is None else self._labelled(ex)

    def _labelled(self, ex: dict) -> dict:
        ex = dict(ex)
        if self.size and ex["image"].size != (self.size, self.size):
            ex["image"] = ex["image"].resize((self.size, self.size))
            ex["image_size"] = ex["image"].size
        ex["answer"] = ex["label"]
        ex["classes"] = self.classes
        ex["label_kind"] = "class"
        ex["question"] = f"{self.question} Options: {', '.join(self.classes)}."
        return ex

    def stats(self) -> dict[str, Any]:
        return split_stats(self.base)


@register_task("classification")
class Classification(Task):
    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "accuracy": 1.0}
    answer_only_rewards = {"equality": 1.0}

    def default_options(self):
        return {
            "label": "shape",  # synthetic: the class is the object's "shape" or its "color"
            "image_size": 112,  # synthetic image side; real images are resized to it (null: keep)
            "train_size": 1_000_000,  # synthetic only; readers use all their examples
            "eval_size": 1000,
            "thinking": True,  # False: answer-only prompt and target, equality reward (No-Thinking-CLS-RL)
            "train_dir": None,  # image folder with one subfolder per class
            "eval_dir": None,
            "train_path": None,  # JSONL {"image": ..., "label": ...}
            "eval_path": None,
            "image_root": None,  # JSONL image paths are relative to it (default: the file's folder)
            "classes": None,  # the option list (default: subfolder names / labels seen, sorted)
            "question": None,  # question for real data (default "What is in this image?")
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        if o["label"] not in LABELS:
            raise ValueError(f"classification: label must be one of {LABELS}, got {o['label']!r}")
        size = o["image_size"]
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 16):
            raise ValueError(f"classification: image_size must be an integer >= 16 or null, got {size!r}")
        classes = o["classes"]
        if classes is not None:
            if isinstance(classes, str) or not all(isinstance(c, str) and c.strip() for c in classes):
                raise ValueError(f"classification: classes must be a list of non-empty names, got {classes!r}")
            if len(set(classes)) != len(classes) or not classes:
                raise ValueError(f"classification: classes must be distinct and not empty, got {classes!r}")
            o["classes"] = [c.strip() for c in classes]
        real = {}
        for split in SPLIT_SEEDS:
            d, p = o[f"{split}_dir"], o[f"{split}_path"]
            if d and p:
                raise ValueError(f"classification: give {split}_dir or {split}_path, not both")
            real[split] = bool(d or p)
        if any(real.values()) and not all(real.values()):
            missing = [s for s, r in real.items() if not r]
            raise ValueError(
                f"classification: set {missing[0]}_dir or {missing[0]}_path too; synthetic {missing[0]} "
                "examples would not have the same classes as the real ones"
            )
        if not any(real.values()) and o["classes"] is not None:
            unknown = [c for c in o["classes"] if c not in SYNTHETIC_CLASSES[o["label"]]]
            if unknown:
                raise ValueError(
                    f"classification: synthetic {o['label']} classes are {SYNTHETIC_CLASSES[o['label']]}; got {unknown}"
                )
        self._cache: dict[str, Sequence[dict]] = {}

    # -- data ---------------------------------------------------------------------------------
    def make(self, seed: int) -> dict:
        """Synthetic example ``seed``: the class is drawn first (uniform), then the other attribute,
        the object's side (45-80% of the image) and its position."""
        rng = random.Random(seed)
        o = self.options
        kind = o["label"]
        classes = list(o["classes"] or SYNTHETIC_CLASSES[kind])
        label = rng.choice(classes)
        if kind == "shape":
            shape, color = label, rng.choice(list(COLORS))
        else:
            shape, color = rng.choice(SHAPES), label
        size = o["image_size"] or 112
        side = rng.randint(int(size * OBJECT_FRACTION[0]), int(size * OBJECT_FRACTION[1]))
        x1, y1 = rng.randint(0, size - side), rng.randint(0, size - side)
        obj = SceneObject(shape, color, (x1, y1, x1 + side, y1 + side))
        scene = render_scene([obj], size)
        return {
            "image": scene.image,
            "question": f"{QUESTIONS[kind]} Options: {', '.join(classes)}.",
            "answer": label,
            "classes": classes,
            "label_kind": kind,
            "object": obj.to_dict(),
            "box": tuple(obj.box),
            "image_size": scene.image.size,
            "id": seed,
        }

    def examples(self, split: str):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"classification: unknown split {split!r}; valid splits: {sorted(SPLIT_SEEDS)}")
        if split in self._cache:
            return self._cache[split]
        o = self.options
        question = o["question"] or QUESTIONS["class"]
        if o[f"{split}_dir"]:
            files = image_folder(o[f"{split}_dir"], o["classes"], o["image_size"])
            out = _Labelled(files, files.classes, question, None)
        elif o[f"{split}_path"]:
            out = self._from_file(o[f"{split}_path"], question, split)
        else:
            out = SyntheticExamples(self.make, o[f"{split}_size"], SPLIT_SEEDS[split])
        self._cache[split] = out
        return out

    def _from_file(self, path, question: str, split: str) -> _Labelled:
        wanted = self.options["classes"]
        seen: set[str] = set()

        def parse(record: dict) -> dict:
            image = require_image(record)
            label = _label(record)
            if wanted is not None and label not in wanted:
                raise BadRecord(f"label {label!r} is not one of the classes {wanted}")
            seen.add(label)
            return {"image": image, "label": label}

        data = self.read_examples(path, parse, split)
        return _Labelled(data, wanted or sorted(seen), question, self.options["image_size"])

    # -- prompting ------------------------------------------------------------------------------

    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        obj = ex.get("object")
        return f"It is a {obj['color']} {obj['shape']}." if obj else f"This is {ex['answer']}."

    def hints(self, ex: dict) -> list[str]:
        """Scaf-GRPO's three tiers: what to look at (knowledge), a cue that narrows the options
        without naming the answer (planning), the answer (solution)."""
        label, kind = ex["answer"], ex.get("label_kind", "class")
        classes = list(ex.get("classes") or [])
        if kind == "shape":
            knowledge = "Look at the outline, not the color."
        elif kind == "color":
            knowledge = "Look at the color, not the outline."
        else:
            knowledge = "Answer with one of the options, as written."
        if kind == "shape" and label in SHAPE_CUES:
            planning = SHAPE_CUES[label]
        elif len(classes) >= 3 and label in classes:
            wrong = classes[(classes.index(label) + 1) % len(classes)]  # a fixed wrong option
            planning = f"It is not {wrong}."
        else:
            planning = "Look at the whole image."
        return [knowledge, planning, f"The answer is {label}."]

    # -- evaluation -----------------------------------------------------------------------------
    def _scores(self, completions, examples) -> list[float]:
        """Per-sample correctness, exactly as the task's answer reward grades it (accuracy with
        thinking, equality without); unparsable is wrong."""
        return [layout_score(c, ex.get("answer"), self.thinking) for c, ex in zip(completions, examples)]

    def _prediction(self, completion) -> Optional[str]:
        return layout_answer(completion, self.thinking)

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: graded like the answer reward; ``accuracy/<class>``: the same over the
        examples of each class present in the batch; valid_option: the answer is one of the
        listed options (up to case, spaces and a final period)."""
        scores = self._scores(completions, examples)
        n = max(1, len(scores))
        out = {"accuracy": sum(scores) / n}
        per_class: dict[str, list[float]] = {}
        valid = 0
        for c, ex, s in zip(completions, examples, scores):
            per_class.setdefault(str(ex["answer"]), []).append(s)
            pred = self._prediction(c)
            if pred is not None and normalize(pred) in {normalize(k) for k in ex.get("classes", ())}:
                valid += 1
        for label in sorted(per_class):
            out[f"accuracy/{label}"] = sum(per_class[label]) / len(per_class[label])
        out["valid_option"] = valid / n
        return out

    def visualize(self, ex: dict, completion: str):
        """The image upscaled, the object boxed in green (synthetic), and the true vs predicted
        class written below it (red when wrong)."""
        image, draw = canvas(ex["image"], footer=FOOTER)
        if ex.get("box") is not None:
            draw_box(draw, ex["box"], TRUE)
        pred = self._prediction(completion)
        right = self._scores([completion], [ex])[0] == 1.0
        draw_label(draw, f"true {ex['answer']}  pred {pred if pred is not None else '?'}", TRUE if right else PRED)
        return image
