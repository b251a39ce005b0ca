"""GUI episodes as single-step examples: each step with a screenshot and an action becomes one
example carrying the episode's goal and its earlier actions (the history a prompt shows), and
:class:`StepExamples` opens the screenshots on access, fitting the labels to the opened image.

The episodes are those :mod:`mmrl.data.gui_episodes` reads (AndroidControl, GUI-Odyssey), whose
steps keep ``action`` or ``image`` None where the file had none usable: such a step is part of
later steps' history but makes no example (:func:`is_usable_step`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..measures.gui import format_action, history_text
from ..media.coords import box_problem, point_problem
from .images import load_image
from .sequence import SkippingSequence

log = logging.getLogger(__name__)


# -- flattening ------------------------------------------------------------------------------------
def history_entry(step: Mapping) -> Any:
    """How a step appears in later steps' history: its action (a dict, points in pixels), or for a
    step without one its ``history_text``."""
    action = step.get("action")
    if action is not None:
        return {k: v for k, v in action.items() if k != "bbox"}
    return step.get("history_text") or json.dumps(step.get("raw_action"), ensure_ascii=False, default=str)


def format_history(ex: Mapping, convert: Optional[Callable[[Sequence[float]], Sequence[float]]] = None) -> str:
    """An example's history for a prompt, as :func:`mmrl.measures.gui.history_text` writes it
    (``"Step 3: {...}; Step 4: {...}"``, numbered from the episode's start; "none"), each action by
    :func:`mmrl.measures.gui.format_action` with its point passed through ``convert`` (e.g. to the
    policy's coordinate space) when given."""
    entries = []
    for entry in ex.get("history_actions") or ():
        if isinstance(entry, Mapping):
            if convert is not None and "point" in entry:
                entry = {**entry, "point": list(convert(entry["point"]))}
            entry = format_action(entry)
        entries.append(str(entry))
    start = int(ex.get("history_start") or 0)
    return history_text([""] * start + entries, len(entries))


def episode_steps(episodes: Sequence[Mapping], history_length: int = 4) -> list[dict]:
    """Single-step examples of ``episodes``, one per step with a screenshot and an action, in order:
    ``{"image" (path), "instruction", "history", "history_actions", "history_start", "action",
    "image_size" (when known), "source_episode", "step_index", "num_steps", "step_instruction" /
    "accessibility_tree" (when the step has them)}``. The episode's id is ``source_episode``, not
    ``episode_id``: that key marks the rows of environment episodes in the trainer
    (``mmrl.core.episodes``), which these single steps are not.

    ``history`` holds the last ``history_length`` earlier actions of the episode formatted by
    :func:`mmrl.measures.gui.format_action` (points in pixels; a step without an action as its
    ``history_text``), ``history_actions`` the same as action dicts (to re-format in a policy's
    coordinate space: :func:`format_history`), ``history_start`` how many earlier steps were cut
    (so prompts number steps from the episode's start)."""
    if not isinstance(history_length, int) or isinstance(history_length, bool) or history_length < 0:
        raise ValueError(f"history_length must be a whole number >= 0, got {history_length!r}")
    out = []
    for ep in episodes:
        steps = ep["steps"]
        earlier: list[Any] = []
        for k, step in enumerate(steps):
            if is_usable_step(step):
                start = max(0, k - history_length)
                shown = earlier[start:] if history_length else []
                ex = {"image": step["image"], "instruction": ep["instruction"],
                      "history": [format_action(a) if isinstance(a, Mapping) else a for a in shown],
                      "history_actions": list(shown), "history_start": k - len(shown), "action": step["action"],
                      "source_episode": ep["episode_id"], "step_index": k, "num_steps": len(steps)}
                for key in ("image_size", "step_instruction", "accessibility_tree"):
                    if step.get(key) is not None:
                        ex[key] = step[key]
                out.append(ex)
            earlier.append(history_entry(step))
    return out


def is_usable_step(step: Mapping) -> bool:
    """A step that makes an example: it has a screenshot and an action."""
    return step.get("image") is not None and step.get("action") is not None


# -- opening ---------------------------------------------------------------------------------------
def fit_to_image(ex: dict, size: Sequence[float]) -> dict:
    """``ex`` with ``image_size`` = ``size`` (the opened screenshot's) and, when the recorded size
    differs, the action's point and ``bbox`` rescaled to it (x by the width ratio, y by the
    height ratio)."""
    w, h = float(size[0]), float(size[1])
    old = ex.get("image_size")
    ex = {**ex, "image_size": (int(size[0]), int(size[1]))}
    if old is None or (float(old[0]), float(old[1])) == (w, h):
        return ex
    sx, sy = w / float(old[0]), h / float(old[1])
    action = dict(ex["action"])
    if "point" in action:
        action["point"] = [action["point"][0] * sx, action["point"][1] * sy]
    if action.get("bbox") is not None:
        b = action["bbox"]
        action["bbox"] = [b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy]
    ex["action"] = action
    return ex


class StepExamples(SkippingSequence):
    """Step examples (:func:`episode_steps`) whose screenshot is opened on access: item i is the
    example with ``image`` an RGB PIL image, ``image_path`` and ``image_size`` its size (labels
    rescaled by :func:`fit_to_image` if it differs from the recorded one), then ``finish(ex)``.
    An unreadable screenshot is counted in ``bad_images``, a click or box off the screenshot (or
    not finite, or inverted) in ``bad_targets`` (each warned once), and the next example is
    returned instead (evaluation skips it), so indexing never raises for bad data (but for none usable).
    ``episodes``: the :class:`mmrl.data.gui_episodes.GuiEpisodes` they came from, whose counts
    :meth:`stats` includes."""

    def __init__(self, steps: Sequence[dict], finish: Optional[Callable[[dict], dict]] = None,
                 name: str = "GUI steps", episodes: Optional[Any] = None):
        if not steps:
            raise ValueError(f"{name}: no step with a screenshot and an action")
        self.steps, self.finish, self.name, self.episodes = list(steps), finish or (lambda ex: ex), name, episodes
        self.bad_images: dict[str, str] = {}
        self.bad_targets: dict[str, str] = {}  # step -> why its click cannot be a target

    def __len__(self) -> int:
        return len(self.steps)

    def usable(self, i: int) -> Optional[dict]:
        ex = self.steps[i]
        try:
            image = load_image(Path(ex["image"]))
        except Exception as exc:  # PIL raises many types for corrupt files
            if ex["image"] not in self.bad_images:
                self.bad_images[ex["image"]] = f"{type(exc).__name__}: {exc}"
                log.warning("%s: cannot open screenshot %s (%s); skipped", self.name, ex["image"], exc)
            return None
        out = fit_to_image({**ex, "image": image, "image_path": ex["image"]}, image.size)
        problem = _target_problem(out)
        if problem is not None:
            where = f"{ex.get('source_episode', '?')} step {ex.get('step_index', '?')}"
            if where not in self.bad_targets:
                self.bad_targets[where] = problem
                log.warning("%s: %s skipped: %s", self.name, where, problem)
            return None
        return self.finish(out)

    def nothing_usable(self) -> str:
        problems = {**self.bad_images, **self.bad_targets}
        return (f"{self.name}: no step could be used (a screenshot that does not open or a click off "
                f"it; e.g. {next(iter(problems.items()))})")

    def stats(self) -> dict[str, Any]:
        out = dict(self.episodes.stats()) if self.episodes is not None else {}
        out.update(examples=len(self), bad_images=out.get("bad_images", 0) + len(self.bad_images),
                   bad_targets=out.get("bad_targets", 0) + len(self.bad_targets))
        return out


def _target_problem(ex: Mapping) -> Optional[str]:
    """Why a step's click (or bbox) cannot be trained on: off the screenshot, not finite, inverted."""
    w, h = ex["image_size"]
    action = ex.get("action") or {}
    if action.get("point") is not None:
        problem = point_problem(action["point"], w, h)
        if problem:
            return problem
    if action.get("bbox") is not None:
        return box_problem(action["bbox"], w, h)
    return None
