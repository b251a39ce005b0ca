"""``gui_actions``: the next action of a GUI episode, one step at a time, with the episode's earlier
actions in the prompt (UI-R1 / GUI-R1 single-step action prediction).

Data: AndroidControl or GUI-Odyssey episodes (``train_path`` / ``eval_path``, a file or folder,
``format`` android_control | gui_odyssey; read by :mod:`mmrl.data.gui_episodes`), or without a path
a small synthetic stand-in: three-step episodes on a scene of coloured shapes ("Tap the red circle,
type cat, then finish"), so the task runs anywhere.

The answer is one JSON action of :mod:`mmrl.measures.gui`'s space in ``<answer>``, points in the
policy's coordinate space (``ex["pred_space"]``/``ex["frame"]``, recorded by the trainer: Qwen2.5-VL
resized-image pixels, Qwen2-VL / Qwen3-VL 0-1000); labels stay in original pixels and rewards and
metrics convert. Earlier actions in the prompt are written in the same space as the answer.
Rewards, UI-R1's recipe with mmrl's checks: ``gui_action_type`` + ``gui_action_args`` + ``format``. The
papers' own rewards (``ui_r1_action_type``, ``ui_r1_coord``, ``gui_r1``) read only their papers' answer
format (``[{'action': 'click', ...}]``, single quotes), not the JSON action this task asks for.
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw

from mmrl import Task, register_task
from mmrl.data.gui_episodes import FORMATS, read_episodes
from mmrl.data.gui_steps import StepExamples, episode_steps, format_history
from mmrl.data.scenes import position_word, random_scene
from mmrl.measures.gui import format_action, normalize_action, parse_action, pixel_point
from mmrl.measures.gui_match import action_match
from mmrl.media.coords import pixels_to_prediction
from mmrl.media.draw import FOOTER, PRED, TRUE, VIS_SCALE, canvas, draw_box, draw_point
from mmrl.task import SyntheticExamples, image_prompt

SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
ACTIONS = ("Actions: click or long_press (point), type (text), scroll (direction up, down, left or right; "
           "down shows what is below), open_app (app), navigate_back, navigate_home, wait, "
           "terminate (status success or failure).")
FORMAT_INSTRUCTION = ('Answer with <think>...</think><answer>{"action": ...}</answer>: one JSON action, '
                      "points [x, y] in {space}.")
ANSWER_ONLY_INSTRUCTION = 'Answer with <answer>{"action": ...}</answer>: one JSON action, points [x, y] in {space}.'
SPACE_WORDS = {"rel1000": "0-1000 coordinates of the image", "norm": "0-1 coordinates of the image"}
DEFAULT_SPACE_WORDS = "the image's pixel coordinates"
WORDS = ("cat", "dog", "sun", "map", "tea", "bus", "red", "box")
VIS_SIDE = 448  # galleries draw screenshots at most this tall / wide
MIN_VIS_WIDTH = 320  # and at least this wide, for the action texts below


def _verb(action: dict) -> str:
    return action["action"].replace("_", " ")


@register_task("gui_actions")
class GuiActions(Task):
    """One step of a GUI episode: the screenshot, the goal and the earlier actions in; the next
    action out. ``success_metric`` is ``step_success`` (type and arguments right)."""

    modality = "vlm"
    instructions = (FORMAT_INSTRUCTION, ANSWER_ONLY_INSTRUCTION)  # with a {space} to fill
    rewards = {"gui_action_type": 1.0, "gui_action_args": 1.0, "format": 1.0}
    success_metric = "step_success"

    def default_options(self):
        return {
            "train_path": None,  # AndroidControl / GUI-Odyssey episode file or folder
            "eval_path": None,
            "format": "android_control",  # android_control | gui_odyssey
            "image_root": None,  # where screenshot paths start (default: see mmrl.data.gui_episodes)
            "strict": False,  # True: the first malformed entry or missing screenshot is an error
            "history_length": 4,  # earlier actions shown in the prompt (UI-R1 / GUI-Odyssey: 4)
            "step_instruction": False,  # True: add the step's low-level instruction (AndroidControl-Low)
            "thinking": True,  # False: answer-only prompt and target, format mode answer_only
            "train_size": 1_000_000,  # synthetic examples without a path
            "eval_size": 200,
            "image_size": 112,  # side of a synthetic screen
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        if o["format"] not in FORMATS:
            raise ValueError(f"gui_actions: format must be one of {', '.join(FORMATS)}, got {o['format']!r}")
        h = o["history_length"]
        if not isinstance(h, int) or isinstance(h, bool) or h < 0:
            raise ValueError(f"gui_actions: history_length must be a whole number >= 0, got {h!r}")
        if o.get("fields"):
            raise ValueError("gui_actions: the fields option is not used; episode files are read in their "
                             "AndroidControl / GUI-Odyssey layouts (see mmrl.data.gui_episodes)")
        for name in ("strict", "step_instruction"):
            self.bool_option(name)

    # -- data -----------------------------------------------------------------------------------
    def examples(self, split: str):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"gui_actions: unknown split {split!r}; valid splits: {sorted(SPLIT_SEEDS)}")
        path = self.options[f"{split}_path"]
        if not path:
            return SyntheticExamples(self.make, self.options[f"{split}_size"], SPLIT_SEEDS[split])
        cache = self.__dict__.setdefault("_file_splits", {})
        if split not in cache:
            o = self.options
            episodes = read_episodes(path, o["image_root"], format=o["format"], strict=o["strict"])
            cache[split] = StepExamples(episode_steps(episodes, o["history_length"]),
                                        name=f"gui_actions {split} ({path})", episodes=episodes)
        return cache[split]

    def make(self, seed: int) -> dict:
        """A step of a synthetic three-step episode on one screen of 2-4 coloured shapes: tap the
        named shape (its box is the target element), type a word, finish."""
        rng = random.Random(seed)
        size = self.options["image_size"]
        scene = random_scene(rng, rng.randint(2, 4), size=size, unique=True)
        obj = rng.choice(scene.objects)
        word = rng.choice(WORDS)
        x1, y1, x2, y2 = obj.box
        actions = [{"action": "click", "point": [(x1 + x2) / 2, (y1 + y2) / 2], "bbox": [x1, y1, x2, y2]},
                   {"action": "type", "text": word}, {"action": "terminate", "status": "success"}]
        episode = {"episode_id": f"synthetic-{seed}",
                   "instruction": f"Tap the {obj.color} {obj.shape}, type {word}, then finish",
                   "steps": [{"image": scene.image, "action": a, "image_size": scene.image.size} for a in actions]}
        ex = episode_steps([episode], self.options["history_length"])[rng.randrange(len(actions))]
        return {**ex, "query": {"color": obj.color, "shape": obj.shape}, "id": seed}

    # -- prompting ------------------------------------------------------------------------------
    def _point(self, point, ex):
        return [float(v) for v in pixels_to_prediction(point, ex)]

    def text(self, ex: dict) -> str:
        """The prompt's text: task, (step instruction,) earlier actions in the policy's space, the
        action space and the answer format."""
        goal = str(ex["instruction"]).strip().rstrip(".")
        parts = [f"Task: {goal}."]
        step = ex.get("step_instruction")
        if self.options["step_instruction"] and step:
            parts.append(f"Step: {str(step).strip().rstrip('.')}.")
        parts.append(f"Previous actions: {format_history(ex, lambda p: self._point(p, ex))}.")
        template = self.instruction()
        space = SPACE_WORDS.get(ex.get("pred_space") if ex.get("frame") is not None else None, DEFAULT_SPACE_WORDS)
        parts += [ACTIONS, template.replace("{space}", space)]
        return " ".join(parts)

    def prompt(self, ex: dict) -> list[dict]:
        return image_prompt(ex["image"], self.text(ex))

    def reference_answer(self, ex: dict) -> str:
        """The labelled action as the policy should write it (point in its space, integers)."""
        action = normalize_action(ex["action"])
        if "point" in action:
            action["point"] = self._point(action["point"], ex)
        return format_action(action)

    def reasoning(self, ex: dict) -> str:
        action, query = ex["action"], ex.get("query")
        if query and action["action"] == "click":
            size = ex.get("image_size") or ex["image"].size
            return f"The {query['color']} {query['shape']} is at the {position_word(action['bbox'], size)}."
        if ex.get("step_instruction"):
            return str(ex["step_instruction"]).strip()
        return f"Next I {_verb(action)}."

    def hints(self, ex: dict) -> list[str]:
        """The action type, then the whole action."""
        return [f"The next action is {ex['action']['action']}.", f"The answer is {self.reference_answer(ex)}."]

    # -- evaluation -----------------------------------------------------------------------------
    def metrics(self, completions, examples) -> dict[str, float]:
        """type_accuracy: the action type is right; step_success: type and arguments (click on the
        element / within 14% of the screen, text F1 >= 0.5, same direction / status); parsed: the
        answer holds a readable action. Unreadable answers count as wrong."""
        n = max(1, len(completions))
        types = success = parsed = 0.0
        for c, ex in zip(completions, examples):
            pred = parse_action(c)
            if pred is None:
                continue
            parsed += 1
            m = action_match(pred, ex)
            types += m["type"]
            success += m["type"] * m["args"]
        return {"step_success": success / n, "type_accuracy": types / n, "parsed": parsed / n}

    def record(self, ex: dict, completion) -> dict:
        return {"image": ex.get("image"), "visualization": self.visualize(ex, completion),
                "prompt": self.text(ex), "answer": format_action(ex["action"])}

    def visualize(self, ex: dict, completion: str):
        """The screenshot (upscaled up to 4x when small, shrunk to 448 px when larger) with the
        labelled click and target box in green, the predicted click in red, and the labelled and
        predicted actions written below."""
        image = ex["image"]
        w, h = image.size
        if max(w, h) <= VIS_SIDE:
            scale = max(1, min(VIS_SCALE, VIS_SIDE // max(w, h)))
        else:
            scale = VIS_SIDE / max(w, h)
            image = image.resize((max(1, round(w * scale)), max(1, round(h * scale))))
        big, draw = canvas(image, scale if isinstance(scale, int) else 1, footer=2 * FOOTER)
        if big.size[0] < MIN_VIS_WIDTH:  # room for the action texts beside a narrow phone screen
            wide = Image.new("RGB", (MIN_VIS_WIDTH, big.size[1]), (255, 255, 255))
            wide.paste(big, (0, 0))
            big, draw = wide, ImageDraw.Draw(wide)
        s = float(scale)
        truth = ex["action"]
        if truth.get("bbox") is not None:
            draw_box(draw, truth["bbox"], TRUE, scale=s)
        if "point" in truth:
            draw_point(draw, truth["point"], TRUE, scale=s)
        pred = parse_action(completion)
        point = pixel_point(pred, ex) if pred is not None and "point" in pred else None
        if point is not None:
            draw_point(draw, point, PRED, scale=s)
        chars = max(8, big.size[0] // 6 - 1)
        top = big.size[1] - 2 * FOOTER
        draw.text((4, top + 3), f"true: {format_action(truth)}"[:chars], fill=TRUE)
        draw.text((4, top + FOOTER + 3), f"pred: {format_action(pred) if pred else 'unreadable'}"[:chars], fill=PRED)
        return big
