"""``vqa``: open visual questions from any JSONL file, labelled or not (test-time RL).

With answers in the file (``{"image", "question", "answer"}``) it trains like any task (format +
accuracy). Without them (``labels: false``, or a file whose lines have no ``answer``), it is the
test-time RL setting of "TTRV: Test-Time Reinforcement Learning for Vision Language Models": the
rewards are label-free (``ttrv_agreement`` + ``ttrv_low_entropy`` over each group's answers), so a
model can be adapted on an unlabelled eval set. The synthetic default asks how many shapes a scene
has, so the label-free mode can be tried (and checked against the hidden counts) without data.
"""

from __future__ import annotations

import random
from typing import Optional

from mmrl import Task, register_task
from mmrl.data.records import BadRecord, require_image
from mmrl.data.scenes import random_scene
from mmrl.data.sequence import LazySequence, split_stats, usable_item
from mmrl.parsing import answer_correct, extract_answer

SPLIT_SEEDS = {"train": 21, "eval": 22}
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>answer</answer>."
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>answer</answer>."
LABEL_FREE_REWARDS = {"format": 0.5, "ttrv_agreement": 1.0, "ttrv_low_entropy": 0.2}


def parse_vqa_record(record: dict) -> dict:
    image = require_image(record)
    question = record.get("question") or record.get("problem")
    if not question:
        raise BadRecord("no 'question' (or 'problem') text")
    ex = {"image": image, "question": str(question).strip()}
    if record.get("id") is not None:  # e.g. a GQA question's id, the key of its record
        ex["id"] = record["id"]
    answer = record.get("answer", record.get("solution"))
    if answer is not None:
        ex["answer"] = str(answer).strip()
    return ex


@register_task("vqa")
class VQA(Task):
    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "accuracy": 1.0}

    def default_options(self):
        return {
            "labels": True,  # False: ignore any answers, train with the label-free TTRV rewards
            "thinking": True,
            "train_path": None,
            "eval_path": None,
            "image_root": None,
            "image_size": 112,
            "train_size": 1_000_000,
            "eval_size": 1000,
        }

    def __init__(self, **options):
        super().__init__(**options)
        if not self.bool_option("labels"):
            self.rewards = dict(LABEL_FREE_REWARDS)

    def make(self, seed: int) -> dict:
        rng = random.Random(seed)
        n = rng.randint(1, 6)
        scene = random_scene(rng, n, size=self.options["image_size"])
        return {"image": scene.image, "question": "How many shapes are there?", "answer": str(n),
                "image_size": scene.image.size}

    def examples(self, split: str):
        data = self.file_or_synthetic(split, SPLIT_SEEDS, parse_vqa_record)  # a file is read once
        return data if self.options["labels"] else _Unlabelled(data)


    def reference_answer(self, ex: dict) -> str:
        if "answer" not in ex:
            raise ValueError("vqa: this example has no answer (label-free data has no reference completion)")
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        return "I look at the image."

    def metrics(self, completions, examples) -> dict[str, float]:
        """parsed: share with an answer block; accuracy only where examples carry answers (in
        label-free mode the synthetic answers stay hidden from the rewards but are used here as
        ``hidden_answer`` to show whether test-time RL helps)."""
        n = max(1, len(completions))
        preds = [extract_answer(c) for c in completions]
        out = {"parsed": sum(p is not None for p in preds) / n}
        truths = [ex.get("answer", ex.get("hidden_answer")) for ex in examples]
        if all(t is not None for t in truths) and truths:
            out["accuracy"] = sum(0.0 if p is None else answer_correct(p, t) for p, t in zip(preds, truths)) / n
        return out


class _Unlabelled(LazySequence):
    """A view of a dataset without its answers (kept as ``hidden_answer`` for metrics only)."""

    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def item(self, i: int) -> dict:
        return _hide_answer(self.data[i])

    def usable(self, i: int) -> Optional[dict]:
        ex = usable_item(self.data, i)
        return None if ex is None else _hide_answer(ex)

    def stats(self) -> dict:
        return split_stats(self.data)

    def __getattr__(self, name):  # skipped, bad_images, source sizes ...
        return getattr(self.data, name)


def _hide_answer(ex: dict) -> dict:
    ex = dict(ex)
    if "answer" in ex:
        ex["hidden_answer"] = ex.pop("answer")
    return ex
