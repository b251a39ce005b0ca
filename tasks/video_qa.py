"""``video_qa``: questions about a clip, answered as Video-R1 answers them (a choice letter, a
number, free text, OCR text or a regression value), rewarded by ``video_r1_accuracy`` (Video-R1's
reward as its code computes it; ``task.rewards`` may name mmrl's more tolerant
``video_answer_accuracy`` instead).

Synthetic clips (:mod:`mmrl.data.motion`) ask two things a single frame cannot answer: which way
a shape moves (multiple choice) and how many shapes appear after the start (a number). Real data
is read in Video-R1's layout: ``problem``, ``problem_type``, ``options``, ``solution``
(``<answer>..</answer>``), ``path`` (the clip, or an image where ``data_type`` is ``image``).
"""

from __future__ import annotations

import random

from mmrl import Task, register_task, video_prompt
from mmrl.data.motion import DIRECTIONS, appearance_clip, motion_clip
from mmrl.data.records import BadRecord
from mmrl.data.scenes import position_word
from mmrl.media.draw import FOOTER, PRED, TRUE, draw_label, frame_strip
from mmrl.media.video import Clip
from mmrl.measures.video_r1 import video_r1_accuracies
from mmrl.parsing import extract_answer

SPLIT_SEEDS = {"train": 1, "eval": 2}
KINDS = ("motion", "appear_count")
LETTERS = "ABCD"
# Kept short: the tiny model's tokenizer knows few words. One instruction per Video-R1 problem type.
ANSWER_WORDS = {"multiple choice": "letter", "numerical": "number", "regression": "number",
                "OCR": "text", "free-form": "text"}


def instruction(problem_type: str, thinking: bool) -> str:
    what = ANSWER_WORDS.get(problem_type, "answer")
    return f"Answer with <think>...</think><answer>{what}</answer>." if thinking else f"Answer with <answer>{what}</answer>."


def parse_video_r1_record(record: dict) -> dict:
    """One Video-R1 record: the question (with its options for multiple choice), the problem type
    and the gold answer (the solution's ``<answer>`` content). ``question`` and ``answer`` are
    read where ``problem`` and ``solution`` are absent, as the image tasks' readers do."""
    problem = record.get("problem") or record.get("question")
    solution = record.get("solution", record.get("answer"))
    if not problem or solution is None:
        raise BadRecord("a Video-R1 record needs 'problem' and 'solution'")
    path = record.get("path") or record.get("video")
    if not path:
        raise BadRecord("no 'path' (the clip or image of the question)")
    problem_type = str(record.get("problem_type") or "free-form")
    question = str(problem).strip()
    if problem_type == "multiple choice" and record.get("options"):
        question += " Options: " + " ".join(str(o) for o in record["options"])
    answer = extract_answer(str(solution))
    key = "image" if record.get("data_type") == "image" else "video"
    return {key: path, "question": question, "problem_type": problem_type,
            "solution": str(solution), "answer": (answer if answer is not None else str(solution)).strip()}


@register_task("video_qa")
class VideoQA(Task):
    """Video questions; ``accuracy`` is the mean ``video_r1_accuracy`` (exact for choices and
    numbers, graded for regression, ROUGE and OCR answers, as Video-R1's code grades them)."""

    modality = "vlm"
    rewards = {"format": 0.5, "video_r1_accuracy": 1.0}
    success_metric = "accuracy"

    def default_options(self):
        return {
            "kinds": list(KINDS),  # synthetic questions: motion (multiple choice), appear_count (number)
            "steps": 4,  # scenes per synthetic clip, each held for 2 frames (one temporal patch)
            "fps": 2.0,
            "distractors": 2,
            "objects": 5,  # appear_count: shapes in the clip, each shown from a random step on
            "train_size": 1_000_000,
            "eval_size": 1000,
            "thinking": True,
            # Video-R1 JSON/JSONL instead of synthetic clips; clips under image_root (default: the
            # file's folder), sampled by `video` (read_video's options: fps, max_frames, ...).
            "train_path": None,
            "eval_path": None,
            "image_root": None,
            "video": {},
        }

    def __init__(self, **options):
        super().__init__(**options)
        unknown = set(self.options["kinds"]) - set(KINDS)
        if unknown or not self.options["kinds"]:
            raise ValueError(f"video_qa: kinds must be a non-empty subset of {KINDS}, got {self.options['kinds']}")

    def make(self, seed: int) -> dict:
        rng = random.Random(seed)
        o = self.options
        kind = rng.choice(list(o["kinds"]))
        if kind == "motion":
            scene, mover, direction = motion_clip(rng, o["steps"], o["distractors"], fps=o["fps"])
            letter = LETTERS[list(DIRECTIONS).index(direction)]
            options = [f"{L}. {d}" for L, d in zip(LETTERS, DIRECTIONS)]
            question = f"Which way does the {mover.color} {mover.shape} move? Options: " + " ".join(options)
            boxes = scene.boxes[scene.tracks.index(mover)]
            where = (position_word(boxes[0]), position_word(boxes[-1]))
            ex = {"problem_type": "multiple choice", "answer": letter, "options": options,
                  "thought": f"The {mover.color} {mover.shape} goes from the {where[0]} to the {where[1]}."}
        else:
            scene = appearance_clip(rng, o["steps"], o["objects"], fps=o["fps"])
            count = sum(1 for t in scene.tracks if t.visible[0] > 0)
            question = "How many shapes appear after the start?"
            ex = {"problem_type": "numerical", "answer": str(count),
                  "thought": f"I count {count} {'shape that appears' if count == 1 else 'shapes that appear'} later."}
        size = scene.frames[0].size[0] * scene.frames[0].size[1]
        clip = Clip.from_images(scene.frames, fps=scene.fps, min_pixels=size, max_pixels=size)
        return {**ex, "video": clip, "question": question, "kind": kind, "solution": f"<answer>{ex['answer']}</answer>",
                "duration": scene.duration, "id": seed}

    def examples(self, split: str):
        return self.file_or_synthetic(split, SPLIT_SEEDS, parse_video_r1_record,
                                      video_options=dict(self.options["video"]))

    def prompt(self, ex: dict) -> list[dict]:
        text = f"{ex['question']} {instruction(ex['problem_type'], self.thinking)}"
        return video_prompt(ex.get("video", ex.get("image")), text)

    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        return ex.get("thought", "I watch the video.")

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: the mean Video-R1 accuracy reward; per problem type as ``accuracy/<type>``."""
        scores = video_r1_accuracies(completions, examples)
        values = [float(s or 0.0) for s in scores]
        out = {"accuracy": sum(values) / max(1, len(values)),
               "parsed": sum(extract_answer(c) is not None for c in completions) / max(1, len(values))}
        for kind in sorted({ex["problem_type"] for ex in examples}):
            mine = [v for v, ex in zip(values, examples) if ex["problem_type"] == kind]
            out[f"accuracy/{kind}"] = sum(mine) / len(mine)
        return out

    def record(self, ex: dict, completion) -> dict:
        """The saved rollout's input picture is the frame strip (a clip is not an image)."""
        rec = super().record(ex, completion)
        return {**rec, "image": rec["visualization"]}

    def visualize(self, ex: dict, completion: str):
        """The clip as a frame strip, with the question, the true and the predicted answer."""
        media = ex.get("video", ex.get("image"))
        frames = media.images() if isinstance(media, Clip) else [media]
        strip, draw = frame_strip(frames, footer=FOOTER)
        pred = extract_answer(completion)
        right = (video_r1_accuracies([completion], [ex])[0] or 0.0) >= 1.0  # as the reward scores it
        draw_label(draw, f"{ex['question'][:90]}  true {ex['answer']}  pred {pred if pred is not None else '?'}",
                   TRUE if right else PRED)
        return strip
