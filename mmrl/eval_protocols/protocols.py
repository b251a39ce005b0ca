"""The built-in benchmark protocols, each following its official evaluation script or paper table.

- ``screenspot``: SeeClick ("SeeClick: Harnessing GUI Grounding for Advanced Visual GUI Agents",
  Cheng et al., 2024), ``screenspot_test.py``: a click is right when it lies inside the element's
  box; accuracy per platform (the file: mobile / desktop / web) x element type (text / icon).
  The paper's Average is the mean of the six cells (SeeClick's row: 78.0, 52.0, 72.2, 30.0, 55.7,
  32.5 -> 53.4), not of the 1,272 examples (55.8).
- ``screenspot_v2``: the same cells on the v2 files; the Average of OS-Atlas ("OS-ATLAS: A
  Foundation Action Model for Generalist GUI Agents", Wu et al., 2024), which introduced v2, is
  over the examples (its 7B row: 95.17, 75.83, 90.72, 63.57, 90.60, 77.34 over 290 / 211 / 194 /
  140 / 234 / 203 examples -> 84.12; the cells' mean would be 82.2).
- ``screenspot_pro``: "ScreenSpot-Pro: GUI Grounding for Professional High-Resolution Computer
  Use" (Li et al., 2025), ``eval_screenspot_pro.py``: text / icon / average per application group
  (CAD, Dev, Creative, Scientific, Office, OS) and overall, every average over the examples; an
  unreadable answer is wrong (``wrong_format`` counts in the denominator).
- ``refcoco``: VLM-R1's ``test_rec_r1.py`` on its RefCOCO / RefCOCO+ / RefCOCOg files: a box is
  right when its IoU with the truth is > 0.5 (strictly); accuracy per file (split).
- ``charades_sta`` / ``activitynet_captions``: temporal grounding as the ``eval_tvg.py`` of
  TimeChat / TimeSuite scores it: R1@m = the share of queries whose predicted segment has tIoU
  >= m (m = 0.3, 0.5, 0.7); mIoU = the mean tIoU, an unreadable answer 0.
- ``video_r1``: Video-R1's evaluation files ("Video-R1: Reinforcing Video Reasoning in MLLMs",
  Feng et al., 2025, ``eval_bench.py``): the accuracy reward of each problem type (multiple
  choice and numbers exact, OCR / free-form ROUGE, regression mean relative accuracy), per file
  and per problem type.
- ``geneval``: GenEval ("GenEval: An Object-Focused Framework for Evaluating Text-to-Image
  Alignment", Ghosh et al., 2023), ``summary_scores.py``: accuracy per task (single_object,
  two_object, counting, colors, position, color_attr) and the overall score, the mean over the
  tasks. Judged by the built-in shape checker on the built-in held-out prompts (flat shapes, so
  no detector); every built-in prompt names a colour, so single_object and two_object stay empty.
  Colours are the pixel rule's by default; ``--clip ARCH=CHECKPOINT`` decides every detected
  object's colour by CLIP zero-shot classification as GenEval's ``evaluate_images.py`` does
  (:mod:`mmrl.eval_protocols.geneval_clip`), which is what its colors and color_attr tasks measure.
- ``mathvista``: MathVista ("MathVista: Evaluating Mathematical Reasoning of Foundation Models in
  Visual Contexts", Lu et al., 2024) and MathVerse-style files, answers judged by Math-Verify
  (``visual_math``'s judge): accuracy overall, per ``metadata.task`` (MathVista's FQA, GPS, MWP,
  TQA, VQA) and per ``problem_version`` (MathVerse) where the files give them.
- ``clevr_count``: SuperCLEVR / CLEVR counting as R1-V evaluates it: the answer's number equals
  the count.
"""

from __future__ import annotations

from typing import Optional

from ..measures.boxes import answer_iou
from ..measures.composition import composition_checks
from ..measures.screen import click_score
from ..measures.video_r1 import answer_tious, video_r1_accuracies
from . import ALL, Benchmark, register_benchmark
from .geneval_clip import ClipSetting, clip_colors, parse_clip

PLATFORMS = ("mobile", "desktop", "web")
SOURCE_PLATFORM = {"ios": "mobile", "android": "mobile", "macos": "desktop", "windows": "desktop"}  # else web
PRO_GROUPS = ("CAD", "Dev", "Creative", "Scientific", "Office", "OS")
GENEVAL_TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def _platform(ex: dict) -> str:
    """ScreenSpot's platform: the file's (screenspot_mobile_v2.json), else the data source's."""
    stem = str(ex.get("source_file", "")).lower()
    for p in PLATFORMS:
        if p in stem:
            return p
    return SOURCE_PLATFORM.get(str(ex.get("data_source", "")).lower(), "web")


def _clicks(task, completions, examples):
    return [{"accuracy": click_score(c, ex) or 0.0} for c, ex in zip(completions, examples)]


SCREENSPOT_CELLS = tuple(f"{p} {t}" for p in PLATFORMS for t in ("text", "icon"))

register_benchmark(Benchmark(
    "screenspot", "ScreenSpot (SeeClick's screenspot_test.py; average = mean of the six cells)", "screen_grounding",
    _clicks, lambda ex: [f"{_platform(ex)} {ex.get('data_type')}"], order=(*SCREENSPOT_CELLS, "average"),
    macro={"average": SCREENSPOT_CELLS},
    options=lambda data, root: {"eval_path": data, "image_root": root, "format": "screenspot"}))

register_benchmark(Benchmark(
    "screenspot_v2", "ScreenSpot-v2 (OS-Atlas; average over the examples)", "screen_grounding",
    _clicks, lambda ex: [f"{_platform(ex)} {ex.get('data_type')}", "average"], order=(*SCREENSPOT_CELLS, "average"),
    options=lambda data, root: {"eval_path": data, "image_root": root, "format": "screenspot"}))

register_benchmark(Benchmark(
    "screenspot_pro", "ScreenSpot-Pro (eval_screenspot_pro.py; every average over the examples)", "screen_grounding",
    _clicks, lambda ex: [f"{ex.get('group')} {ex.get('data_type')}", str(ex.get("group")),
                         f"all {ex.get('data_type')}", "average"],
    order=(*(f"{g}{t}" for g in PRO_GROUPS for t in (" text", " icon", "")), "all text", "all icon", "average"),
    options=lambda data, root: {"eval_path": data, "image_root": root, "format": "screenspot_pro"}))


def _rec(task, completions, examples):
    return [{"Acc@0.5": float((answer_iou(c, ex) or 0.0) > 0.5)} for c, ex in zip(completions, examples)]


register_benchmark(Benchmark("refcoco", "RefCOCO / RefCOCO+ / RefCOCOg (VLM-R1's test_rec_r1.py: IoU > 0.5)",
                             "grounding", _rec, lambda ex: [ALL], metrics=("Acc@0.5",), per_file=True))


def _moments(task, completions, examples):
    out = []
    for iou in answer_tious(completions, examples):
        iou = iou or 0.0
        out.append({"R1@0.3": float(iou >= 0.3), "R1@0.5": float(iou >= 0.5), "R1@0.7": float(iou >= 0.7), "mIoU": iou})
    return out


for _name, _title in (("charades_sta", "Charades-STA"), ("activitynet_captions", "ActivityNet Captions")):
    register_benchmark(Benchmark(_name, f"{_title} (R1@m: tIoU >= m; mIoU, unreadable = 0)", "temporal_grounding",
                                 _moments, lambda ex: [ALL], metrics=("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")))


def _video_r1(task, completions, examples):
    return [{"accuracy": float(s or 0.0)} for s in video_r1_accuracies(completions, examples)]


register_benchmark(Benchmark("video_r1", "Video-R1 evaluation files (eval_bench.py: the accuracy reward per problem type)",
                             "video_qa", _video_r1, lambda ex: [ALL, str(ex.get("problem_type"))], order=(ALL,),
                             per_file=True))


def geneval_task(spec: list[dict]) -> str:
    """The GenEval task a composition prompt tests: position when a group has a side, colour
    attribution for two coloured groups, counting for several of one, else colours."""
    if any(g.get("position") for g in spec):
        return "position"
    if len(spec) > 1:
        return "color_attr" if all(g.get("color") for g in spec) else "two_object"
    if spec and spec[0].get("count", 1) > 1:
        return "counting"
    return "colors" if spec and spec[0].get("color") else "single_object"


def _geneval(task, completions, examples, clip: Optional[ClipSetting] = None):
    """Every check right; with ``clip``, every object's colour decided by CLIP (GenEval's judge)."""
    checks = composition_checks if clip is None else clip_colors(clip).checks
    return [{"accuracy": float(all(checks(image, ex["spec"]).values()))} for image, ex in zip(completions, examples)]


register_benchmark(Benchmark("geneval", "GenEval-style composition (summary_scores.py: overall = mean over the tasks)",
                             "composition", _geneval, lambda ex: [geneval_task(ex["spec"])],
                             order=(*GENEVAL_TASKS, "overall"), macro={"overall": GENEVAL_TASKS},
                             options=lambda data, root: {}, needs_data=False, settings={"clip": parse_clip}))


def _task_accuracy(task, completions, examples):
    return [{"accuracy": float(task.metrics([c], [ex])["accuracy"])} for c, ex in zip(completions, examples)]


def _math_cells(ex: dict) -> list[str]:
    cells = [ALL]
    if (ex.get("metadata") or {}).get("task"):
        cells.append(str(ex["metadata"]["task"]))
    if ex.get("problem_version"):
        cells.append(str(ex["problem_version"]))
    return cells


register_benchmark(Benchmark("mathvista", "MathVista / MathVerse-style answers (Math-Verify)", "visual_math",
                             _task_accuracy, _math_cells, order=(ALL,)))
register_benchmark(Benchmark("clevr_count", "SuperCLEVR / CLEVR counting (R1-V: the number equals the count)",
                             "counting", _task_accuracy, lambda ex: [ALL]))
