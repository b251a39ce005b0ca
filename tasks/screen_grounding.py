"""``screen_grounding``: "Click the Bluetooth toggle" on a screenshot, answered with a point (or a box).

Examples come from ScreenSpot / ScreenSpot-v2 files (``format: screenspot``, boxes ``[x, y, w,
h]``), ScreenSpot-Pro files (``format: screenspot_pro``, ``[x1, y1, x2, y2]``), read as they ship
by :mod:`mmrl.data.screenspot`, or, without a path, from random screens of the synthetic GUI
environment (:mod:`mmrl.envs`: every element of a screen can be asked for). Labels are element
boxes in original screenshot pixels; the policy answers in its own coordinate space (Qwen2.5-VL:
resized-image pixels, Qwen2-VL / Qwen3-VL: 0-1000), converted back before scoring, so the frame
is right on 1170x2532 phones and 2560x1440 desktops alike.

Rewards: ``click_accuracy`` (the ScreenSpot criterion: the point inside the element) and
``format``; ``answer: box`` asks for the element's box and scores ``iou`` and ``gui_g2_coverage``
(GUI-G², with its Gaussian point reward ``gui_g2_point`` available by weight). Metrics:
``point_accuracy`` (a box answer: its centre), ``parsed``, and ``mean_iou`` for box answers.
"""

from __future__ import annotations

import logging
import random

from mmrl import Task, register_task
from mmrl.data.images import load_image
from mmrl.data.screenspot import read_screenspot, read_screenspot_pro
from mmrl.data.sequence import LazySequence, SkippingSequence
from mmrl.envs import make_env
from mmrl.measures.boxes import answer_box, answer_iou
from mmrl.measures.screen import answer_point, click_score
from mmrl.media.coords import box_problem, pixels_to_prediction
from mmrl.media.draw import FOOTER, PRED, TRUE, canvas, draw_box, draw_label, draw_point

log = logging.getLogger(__name__)

SPLIT_SEEDS = {"train": 1, "eval": 2}
READERS = {"screenspot": read_screenspot, "screenspot_pro": read_screenspot_pro}
INSTRUCTIONS = {"point": "Answer with <answer>[x, y]</answer>.", "box": "Answer with <answer>[x1, y1, x2, y2]</answer>."}


@register_task("screen_grounding")
class ScreenGrounding(Task):
    """See the module docstring."""

    modality = "vlm"
    rewards = {"click_accuracy": 1.0, "format": 0.1}
    reward_kwargs = {"format": {"mode": "answer_only"}}
    success_metric = "point_accuracy"

    def default_options(self):
        return {
            "answer": "point",  # point | box
            "train_path": None,  # ScreenSpot-style JSON file or folder; None: synthetic screens
            "eval_path": None,
            "format": "screenspot",  # screenspot (v1/v2, [x, y, w, h]) | screenspot_pro ([x1, y1, x2, y2])
            "image_root": None,  # where img_filename paths start (default: the JSON file's folder)
            "env": "synthetic_gui",  # the environment whose random screens are the synthetic examples
            "env_options": {},
            "train_size": 1_000_000,
            "eval_size": 500,
        }

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["answer"] not in INSTRUCTIONS:
            raise ValueError(f"screen_grounding: answer must be point or box, got {self.options['answer']!r}")
        if self.options["format"] not in READERS:
            raise ValueError(f"screen_grounding: format must be one of {sorted(READERS)}, got {self.options['format']!r}")
        if self.options["answer"] == "box":
            self.rewards = {"iou": 1.0, "gui_g2_coverage": 0.5, "format": 0.1}
        self._splits: dict = {}

    def examples(self, split: str):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"screen_grounding: unknown split {split!r}; valid splits: {sorted(SPLIT_SEEDS)}")
        if split not in self._splits:
            path = self.options[f"{split}_path"]
            if path:
                records = READERS[self.options["format"]](path, self.options["image_root"])
                self._splits[split] = ScreenFiles(records)
            else:
                self._splits[split] = SyntheticScreens(self.options["env"], self.options["env_options"] or {},
                                                       self.options[f"{split}_size"], SPLIT_SEEDS[split])
        return self._splits[split]

    def prompt(self, ex: dict) -> list[dict]:
        text = f"{ex['instruction'].rstrip('.')}. {INSTRUCTIONS[self.options['answer']]}"
        return [{"role": "user", "content": [{"type": "image", "image": ex["image"]}, {"type": "text", "text": text}]}]

    def file_record(self, ex: dict, media: str) -> dict:
        """A ScreenSpot entry: ``img_filename``, ``bbox`` as [x, y, w, h] in original pixels."""
        x1, y1, x2, y2 = ex["box"]
        return {"img_filename": media, "bbox": [x1, y1, x2 - x1, y2 - y1], "instruction": ex["instruction"]}

    def target(self, ex: dict) -> str:
        """The element's centre (or box) in the policy's space (``pred_space``/``frame``)."""
        x1, y1, x2, y2 = ex["box"]
        if self.options["answer"] == "box":
            coords = pixels_to_prediction((x1, y1, x2, y2), ex)
        else:
            coords = pixels_to_prediction(((x1 + x2) / 2, (y1 + y2) / 2), ex)
        return "<answer>[" + ", ".join(str(int(round(v))) for v in coords) + "]</answer>"

    def metrics(self, completions, examples) -> dict[str, float]:
        """point_accuracy: the click (a box answer: its centre) inside the element; parsed: an
        answer with a point was read; mean_iou for box answers (unparsable: 0)."""
        scores = [click_score(c, ex) for c, ex in zip(completions, examples)]
        n = max(1, len(scores))
        out = {"point_accuracy": sum(s or 0.0 for s in scores) / n,
               "parsed": sum(s is not None for s in scores) / n}
        if self.options["answer"] == "box":
            out["mean_iou"] = sum(answer_iou(c, ex) or 0.0 for c, ex in zip(completions, examples)) / n
        return out

    def visualize(self, ex: dict, completion: str):
        """The screenshot with the element's box (green) and the answer (red: click or box)."""
        image = ex["image"]
        scale = max(1, min(4, 448 // max(image.size)))
        shrink = max(1.0, max(image.size) / 896)  # very large screens are drawn at most 896 px
        if shrink > 1:
            image = image.resize((round(image.width / shrink), round(image.height / shrink)))
        picture, draw = canvas(image, scale=scale, footer=FOOTER)
        draw_box(draw, [v / shrink for v in ex["box"]], TRUE, scale=scale)
        if self.options["answer"] == "box" and (box := answer_box(completion, ex)) is not None:
            draw_box(draw, [v / shrink for v in box], PRED, scale=scale)
        point = answer_point(completion, ex)
        if point is not None:
            draw_point(draw, [v / shrink for v in point], PRED, scale=scale)
        draw_label(draw, ex["instruction"][:60])
        return picture


class SyntheticScreens(LazySequence):
    """Item i: a random screen of the environment (seeded by split and i) and one of its elements."""

    def __init__(self, env: str, env_options: dict, size: int, seed: int):
        self.env = make_env(env, **env_options)
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def item(self, i: int) -> dict:
        rng = random.Random(self.seed * 1_000_003 + i)
        # Every app screen has a Back button, and a decoy app's screen nothing else: the element
        # asked for is another one, drawn from the first of a few screens that has one.
        for _ in range(8):
            obs = self.env.random_screen(rng)
            candidates = [e for e in obs.elements if e["name"] != "Back button"]
            if candidates:
                break
        element = rng.choice(candidates or obs.elements)
        return {"image": obs.image, "instruction": f"Click the {element['name']}", "box": tuple(element["box"]),
                "element": element["name"], "image_size": tuple(obs.image.size), "id": i}


class ScreenFiles(SkippingSequence):
    """ScreenSpot records with their screenshots loaded on access. A screenshot that does not open
    is counted in ``bad_images``, an entry whose box lies off its screenshot (a file without
    ``img_size`` is checked only now) in ``bad_targets``, each by its ``file:line (entry N)``;
    training then uses the next entry, evaluation skips it (:class:`mmrl.data.sequence.SkippingSequence`)."""

    def __init__(self, records):
        self.records = records
        self.bad_images: dict[str, str] = {}
        self.bad_targets: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.records)

    def usable(self, i: int):
        record, where = self.records[i], self.records.where[i]
        try:
            image = load_image(record["image"])
        except Exception as exc:  # PIL raises many types for corrupt files ("image file is truncated")
            if where not in self.bad_images:
                self.bad_images[where] = f"{type(exc).__name__}: {exc}"
                log.warning("%s: cannot open the screenshot %s (%s); skipped", where, record["image"], exc)
            return None
        problem = box_problem(record["box"], *image.size)
        if problem is not None:
            if where not in self.bad_targets:
                self.bad_targets[where] = problem
                log.warning("%s skipped: %s", where, problem)
            return None
        return {**record, "image": image, "image_size": tuple(image.size), "box": tuple(record["box"])}

    def nothing_usable(self) -> str:
        problems = {**self.bad_images, **self.bad_targets}
        return f"no ScreenSpot entry can be used: no screenshot opens or no box lies on it (e.g. {next(iter(problems.items()))})"

    def stats(self) -> dict:
        """The file's counts (``skipped_lines``; ``bad_images``: missing screenshots, and those that
        do not open) and ``bad_targets``."""
        out = self.records.stats()
        out.update(bad_images=out["bad_images"] + len(self.bad_images), bad_targets=len(self.bad_targets))
        return out
