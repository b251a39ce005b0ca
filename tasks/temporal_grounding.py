"""``temporal_grounding``: when in the clip does something happen? Answered as start and end
seconds, rewarded by temporal IoU (``tiou``, TimeZero / VideoChat-R1's reward).

Synthetic clips (:mod:`mmrl.data.motion`) show shapes over their own runs of steps; the question
names one by colour and shape. Real data is read as the datasets ship it: Charades-STA ``.txt``
(``VIDEO start end##sentence``; clips ``<image_root>/<VIDEO><video_ext>``) and ActivityNet
Captions ``.json`` (one example per sentence), or JSONL records with ``video``, ``sentence``
(or ``problem``) and ``start``/``end`` (or ``segment``/``timestamp``).
"""

from __future__ import annotations

import random

from mmrl import Task, register_task, video_prompt
from mmrl.data.motion import appearance_clip
from mmrl.data.records import BadRecord
from mmrl.media.draw import FOOTER, PRED, TIMELINE, TRUE, draw_label, draw_segment, frame_strip
from mmrl.media.video import Clip
from mmrl.measures.temporal import parse_segment
from mmrl.measures.video_r1 import answer_tious
from mmrl.parsing import extract_answer

SPLIT_SEEDS = {"train": 1, "eval": 2}
FORMAT_INSTRUCTION = "Answer with <think>...</think><answer>start to end</answer> in seconds."
ANSWER_ONLY_INSTRUCTION = "Answer with <answer>start to end</answer> in seconds."


def format_seconds(value: float) -> str:
    return f"{float(value):g}"


def parse_grounding_record(record: dict, video_ext: str = ".mp4") -> dict:
    """One temporal grounding record (Charades-STA / ActivityNet sources give ``video``,
    ``start``, ``end``, ``sentence``; ``problem``, ``query`` or ``question`` are read as the
    sentence too)."""
    video = record.get("video") or record.get("path")
    sentence = record.get("sentence") or record.get("problem") or record.get("query") or record.get("question")
    if not video or not sentence:
        raise BadRecord("a temporal grounding record needs 'video' and 'sentence'")
    segment = record.get("segment") or record.get("timestamp")
    if segment is None and "start" in record and "end" in record:
        segment = (record["start"], record["end"])
    try:
        start, end = (float(v) for v in segment)
    except (TypeError, ValueError):
        raise BadRecord(f"no usable segment (start, end): {segment!r}") from None
    if not 0 <= start < end or end == float("inf"):
        raise BadRecord(f"the segment must have 0 <= start < end, got ({start}, {end})")
    if "." not in str(video).rsplit("/", 1)[-1]:
        video = f"{video}{video_ext}"
    sentence = str(sentence).strip().rstrip(".")
    return {"video": video, "question": f"When does this happen: {sentence}?", "segment": (start, end),
            "answer": f"{format_seconds(start)} to {format_seconds(end)}"}


def check_segment_in_clip(ex: dict, slack: float = 0.5) -> dict:
    """Once the clip is open: a segment that starts after the clip ends, or ends more than
    ``slack`` seconds after it, cannot be a target (a :class:`BadRecord`, skipped and counted)."""
    duration = ex.get("video_duration")
    start, end = ex["segment"]
    if duration and (start >= duration or end > duration + slack):
        raise BadRecord(f"the segment ({start:g}, {end:g}) s lies outside the {duration:g} s clip")
    return ex


@register_task("temporal_grounding")
class TemporalGrounding(Task):
    """Time segments; ``accuracy`` is the share with tIoU >= 0.5 and ``mean_tiou`` the mean."""

    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)
    rewards = {"format": 0.5, "tiou": 1.0}
    success_metric = "accuracy"

    def default_options(self):
        return {
            "steps": 4,
            "fps": 2.0,
            "objects": 3,
            "train_size": 1_000_000,
            "eval_size": 1000,
            "thinking": True,
            "train_path": None,  # Charades-STA .txt, ActivityNet Captions .json, or JSONL
            "eval_path": None,
            "image_root": None,  # the clips' folder (default: the annotation file's)
            "video_ext": ".mp4",  # Charades-STA / ActivityNet name clips by id
            "video": {},  # read_video options: fps, max_frames, max_pixels, ...
        }

    def make(self, seed: int) -> dict:
        rng = random.Random(seed)
        o = self.options
        scene = appearance_clip(rng, o["steps"], o["objects"], fps=o["fps"])
        track = rng.choice(scene.tracks)
        start, end = scene.segment(track)
        size = scene.frames[0].size[0] * scene.frames[0].size[1]
        return {
            "video": Clip.from_images(scene.frames, fps=scene.fps, min_pixels=size, max_pixels=size),
            "question": f"When is the {track.color} {track.shape} shown?",
            "segment": (start, end),
            "answer": f"{format_seconds(start)} to {format_seconds(end)}",
            "query": {"color": track.color, "shape": track.shape},
            "duration": scene.duration,
            "id": seed,
        }

    def examples(self, split: str):
        ext = self.options["video_ext"]
        return self.file_or_synthetic(split, SPLIT_SEEDS, lambda r: parse_grounding_record(r, ext),
                                      video_options=dict(self.options["video"]), finish=check_segment_in_clip)

    def prompt(self, ex: dict) -> list[dict]:
        return video_prompt(ex["video"], f"{ex['question']} {self.instruction()}")

    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        q = ex.get("query")
        thing = f"the {q['color']} {q['shape']}" if q else "it"
        return f"I see {thing} from {ex['answer']} seconds."

    def metrics(self, completions, examples) -> dict[str, float]:
        ious = answer_tious(completions, examples)
        n = max(1, len(ious))
        return {"accuracy": sum(1.0 for v in ious if v is not None and v >= 0.5) / n,
                "mean_tiou": sum(v or 0.0 for v in ious) / n,
                "parsed": sum(v is not None for v in ious) / n}

    def record(self, ex: dict, completion) -> dict:
        rec = super().record(ex, completion)
        return {**rec, "image": rec["visualization"]}

    def visualize(self, ex: dict, completion: str):
        """A frame strip over two timelines: the true segment (green), the predicted one (red)."""
        clip = ex["video"]
        strip, draw = frame_strip(clip.images(), footer=2 * TIMELINE + FOOTER)
        height = strip.size[1]
        duration = ex.get("duration") or clip.duration
        top = height - FOOTER - 2 * TIMELINE
        draw_segment(draw, ex["segment"], duration, top, TRUE)
        answer = extract_answer(completion)
        pred = parse_segment(answer) if answer is not None else None
        if pred is not None:
            draw_segment(draw, pred, duration, top + TIMELINE, PRED)
        draw_label(draw, f"{ex['question'][:80]}  true {ex['answer']}  pred {answer if answer is not None else '?'}")
        return strip
