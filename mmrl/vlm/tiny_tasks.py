"""What each shipped tiny VLM was warm-started on, and the warning when a run asks one for a task it
never saw: RL then starts from a model that cannot read the prompts. Read by the VLM policy when a
run starts and by the builders of the tiny models (:mod:`mmrl.vlm.tiny_builders`)."""

from __future__ import annotations

from typing import Sequence

# The tiny default is warm-started on every built-in task, so RL on any of them starts from a model
# that has seen its prompts and answer formats. Counting is the main demo and takes most of the
# batches: colour counting (the default RL task) three-plus-one-and-a-half shares, a third of them
# with the chain of thought that enumerates the matches' cells; shape and colour-shape counting
# four each; every other task one.
DEFAULT_TINY_TASKS = ({"name": "counting", "options": {"query": "color"}, "weight": 3.0},
                      {"name": "counting", "options": {"query": "color", "reasoning": "enumerate"},
                       "weight": 1.5},
                      {"name": "counting", "options": {"query": "shape"}, "weight": 4.0},
                      {"name": "counting", "options": {"query": "color_shape"}, "weight": 4.0},
                      {"name": "grounding", "options": {}, "weight": 1.0},
                      {"name": "detection", "options": {}, "weight": 1.0},
                      {"name": "classification", "options": {}, "weight": 1.0},
                      {"name": "ocr", "options": {}, "weight": 1.0},
                      {"name": "chart_qa", "options": {}, "weight": 1.0},
                      {"name": "visual_math", "options": {}, "weight": 1.0},
                      {"name": "rotation", "options": {}, "weight": 1.0},
                      {"name": "jigsaw", "options": {}, "weight": 1.0})

# The tiny video default is warm-started on the synthetic clips of both video tasks.
DEFAULT_TINY_VIDEO_TASKS = ({"name": "video_qa", "options": {}, "weight": 2.0},
                            {"name": "temporal_grounding", "options": {}, "weight": 1.0})

# The tiny GUI default: clicks on named elements and the scripted solver's actions along episodes.
DEFAULT_TINY_GUI_TASKS = ({"name": "screen_grounding", "options": {}, "weight": 1.0},
                          {"name": "gui_env", "options": {}, "weight": 2.0})


# What each shipped tiny VLM was warm-started on (model.path name -> task names): each builds on the
# one it starts from. ``vqa``'s synthetic questions are the counting scenes'.
TINY_MODEL_TASKS = {"tiny": {spec["name"] for spec in DEFAULT_TINY_TASKS} | {"vqa"}}
TINY_MODEL_TASKS["tiny-video"] = TINY_MODEL_TASKS["tiny"] | {spec["name"] for spec in DEFAULT_TINY_VIDEO_TASKS}
TINY_MODEL_TASKS["tiny-gui"] = TINY_MODEL_TASKS["tiny"] | {spec["name"] for spec in DEFAULT_TINY_GUI_TASKS}
TINY_MODEL_TASKS["tiny-gui-grounding"] = TINY_MODEL_TASKS["tiny-gui"]
TINY_MODEL_TASKS["tiny-zoom"] = TINY_MODEL_TASKS["tiny"] | {"zoom_qa"}  # mmrl.tools.tiny_zoom


def registered_task_names(task) -> list[str]:
    """The registered names of the tasks ``task`` draws from: a mixture's sub-tasks (its sources
    may be named otherwise, ``{color: {task: counting}}``), else the task's sources."""
    sources = getattr(task, "sub_tasks", None)
    return [sub.name for sub in sources.values()] if sources else list(task.source_names())


def untrained_task_warning(model_path: str, task_names: Sequence[str]) -> str | None:
    """A warning when a shipped tiny model is given a task it was never warm-started on (the image
    model on clips, say): RL then starts from a model that cannot read the prompts, and the run
    trains to near-zero accuracy without any error. None for real checkpoints and known tasks."""
    known = TINY_MODEL_TASKS.get(model_path)
    missing = [name for name in task_names if known is not None and name not in known]
    if not missing:
        return None
    fits = [m for m, tasks in TINY_MODEL_TASKS.items() if set(missing) <= tasks]
    better = f"; the shipped model for it is model.path={fits[0]}" if fits else ""
    return (f"model.path={model_path} was never warm-started on {', '.join(missing)}: RL starts from a model "
            f"that cannot read these prompts, so expect task accuracy near 0{better}")
