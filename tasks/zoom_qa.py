"""``zoom_qa``: "thinking with images". Read a detail too small to see at the image budget: zoom in.

Synthetic examples: a large canvas (1024 x 1024 by default) holding several small framed digits,
one framed in red; the question asks for the digit in the red frame. The digits are drawn with
PIL's bitmap font at 1x (about 7 px high), so under the tiny recipes' image budget
(``vlm.max_pixels`` 12544, the canvas seen at 112 x 112) the target digit is under 1 px high and
cannot be read; its red frame still leaves a trace to find. A ``zoom_in`` call on the frame shows
it at full resolution (set the tool's ``min_pixels`` to the policy's ``vlm.max_pixels``). Train and
eval examples come from distinct seeds (held out). Each example keeps the target's frame
(``target_box``, original pixels) for the ``crop_iou`` reward, and the reference trajectory
(:meth:`ZoomQA.reference_turns`: a zoom call on the frame, then the answer) for a warm start.

``detail: pattern`` (with a ``grid``; the tiny default, configs/vlm/zoom_qa_tiny.yaml): each of
1 + ``distractors`` cells holds a square filled with a two-colour texture of period 2 px
(:data:`PATTERNS`: horizontal stripes, vertical stripes or a checkerboard), half of its pixels of
each colour, so every texture has the same mean colour and shrinking the canvas by an even factor
leaves a flat square (its contrast fades in from the edges, :func:`draw_pattern`); the question
names the target's cell ('Which pattern fills the square in cell "B1"?', quoted as the call quotes
it: the same tokens). ``zoom_cell`` on that cell returns it at full resolution, where the texture
is plain; the answer is the texture's name. ``distractor_pattern`` gives the other squares random
textures or the target's; with the latter any zoom shows the answer, the tiny recipe's setting:
the tiny model learned when to zoom but not which cell (docs/thinking-with-images.md, "Recipes").

Real data: ``train_path`` / ``eval_path`` name a DeepEyes parquet file
(:mod:`mmrl.data.deepeyes`; its system prompt with DeepEyes' tool list is kept), an HR-Bench table
(:mod:`mmrl.data.hrbench`, multiple choice; told apart by its option columns) or a V* Bench folder
(:mod:`mmrl.data.vstar`, multiple choice).

Rollouts: a :class:`~mmrl.tools.ToolUseTask`, so each example is rolled out as multi-turn
trajectories whose ``zoom_in`` calls run and whose crops come back as the next turn
(the agent loop with :mod:`mmrl.tools.interaction`; the tool, budget and over-turn options are the ToolUseTask's).
Rewards: DeepEyes' formula with a rule judge (``deepeyes_rule_judge``); ``crop_iou`` and Pixel
Reasoner's terms can be added in the config. See docs/thinking-with-images.md.
"""

from __future__ import annotations

import random
import string
import zlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmrl import register_task
from mmrl.data.deepeyes import parse_deepeyes_record
from mmrl.data.hrbench import is_hrbench_record, parse_hrbench_record
from mmrl.data.vstar import VSTAR_CATEGORIES, VStarExamples
from mmrl.measures.tool_use import crop_iou, deepeyes_parts, images_returned, tool_use_metrics
from mmrl.media.coords import pixels_to_prediction
from mmrl.media.draw import PRED, TRUE, bitmap_font, canvas, draw_box
from mmrl.tools import ToolUseTask, call_text, cell_name

SPLIT_SEEDS = {"train": 31, "eval": 32}  # distinct seeds: eval examples are never trained on
TARGET_COLOR, TARGET_NAME = (220, 0, 0), "red"
DISTRACTOR_COLORS = ((0, 60, 200), (0, 150, 0), (40, 40, 40), (150, 0, 170), (0, 150, 160))
GLYPH_W, GLYPH_H = 6, 11  # the bitmap font's cell, in canvas pixels
PAD, BORDER = 3, 2  # around the digit, inside the frame
INSTRUCTION = ("Zoom in with the zoom_in tool if the image is too small to read. "
               "Answer with <think>...</think><answer>digit</answer>.")
# detail: pattern. Each texture takes the dark colour where its rule of (x, y), canvas pixels, is 1.
PATTERNS = {"horizontal": lambda x, y: y % 2, "vertical": lambda x, y: x % 2,
            "checkerboard": lambda x, y: (x + y) % 2}
DETAILS = ("digit", "pattern")
PATTERN_RAMP = 16  # px over which a pattern's contrast fades in from its square's edges (draw_pattern)
VSTAR_INSTRUCTION = ("Think first, call zoom_in if needed, then answer with the option's letter: "
                     "<think>...</think><answer>letter</answer>.")


def frame_size(scale: int, border: int = BORDER) -> tuple[int, int]:
    """(w, h) of a framed digit drawn at ``scale`` with a ``border`` px frame."""
    return (GLYPH_W * scale + 2 * (PAD + border), GLYPH_H * scale + 2 * (PAD + border))


def draw_framed_digit(image: Image.Image, digit: str, xy: tuple[int, int], color, scale: int,
                      border: int = BORDER) -> tuple[int, int, int, int]:
    """Draw ``digit`` framed in ``color`` with its top-left corner at ``xy``; the frame's box."""
    w, h = frame_size(scale, border)
    x, y = xy
    draw = ImageDraw.Draw(image)
    draw.rectangle((x, y, x + w - 1, y + h - 1), outline=color, width=border)
    glyph = Image.new("RGB", (GLYPH_W, GLYPH_H), image.getpixel((x + border, y + border)))
    ImageDraw.Draw(glyph).text((0, 0), digit, font=bitmap_font(), fill=(0, 0, 0))
    if scale > 1:
        glyph = glyph.resize((GLYPH_W * scale, GLYPH_H * scale), resample=Image.NEAREST)
    image.paste(glyph, (x + border + PAD, y + border + PAD))
    return (x, y, x + w, y + h)


def draw_pattern(image: Image.Image, pattern: str, box: tuple[int, int, int, int], dark, light,
                 ramp: int = PATTERN_RAMP) -> None:
    """Fill ``box`` (pixels) of ``image`` with ``pattern`` (:data:`PATTERNS`, phased on the canvas's
    own pixel grid) between ``dark`` and ``light``: their mean plus or minus half their difference,
    the contrast faded in over ``ramp`` px from the square's edges. Without the fade, the rows at an
    edge of horizontal stripes (light at the top, dark at the bottom) leave a trace in the shrunk
    image that a checkerboard does not."""
    x1, y1, x2, y2 = box
    y, x = np.mgrid[y1:y2, x1:x2]
    sign = np.where(PATTERNS[pattern](x, y) == 1, -1.0, 1.0)
    edge = np.minimum(np.minimum(x - x1, x2 - 1 - x), np.minimum(y - y1, y2 - 1 - y))
    fade = np.minimum(1.0, (edge + 0.5) / max(1, ramp))
    mean, half = (np.add(dark, light) / 2.0), (np.subtract(light, dark) / 2.0)
    pixels = mean + (sign * fade)[..., None] * half
    image.paste(Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB"), (x1, y1))


def parse_record(record: dict) -> dict:
    """An HR-Bench row (option columns A, B, ...) or a DeepEyes row."""
    return parse_hrbench_record(record) if is_hrbench_record(record) else parse_deepeyes_record(record)


def _free(box, taken, margin: int = 8) -> bool:
    x1, y1, x2, y2 = box
    return all(x2 + margin <= a or x1 >= c + margin or y2 + margin <= b or y1 >= d + margin for a, b, c, d in taken)


@register_task("zoom_qa")
class ZoomQA(ToolUseTask):
    modality = "vlm"
    rewards = {"deepeyes_rule_judge": 1.0}
    metric_keys = ("answer", "options", "target_box", "target_boxes")  # read by trajectory_metrics

    def default_options(self):
        return {
            **super().default_options(),  # the tools, the budget, over-turn masking
            "canvas_size": 1024,
            "distractors": 8,
            "glyph_scale": 1,  # 1: ~7 px digits, unreadable at 112 x 112; larger is easier
            "train_size": 1_000_000,
            "eval_size": 500,
            "train_path": None,  # a DeepEyes parquet file, an HR-Bench table or a V* Bench folder
            "eval_path": None,
            "shuffle_options": False,  # V*: show the options in an order fixed by the example's id
            # a grid x grid layout (one framed digit per cell, the tool zoom_cell) for a model that
            # cannot regress boxes; None: digits anywhere, the tool zoom_in
            "grid": None,
            # what the target is: "digit" (a framed digit, the red one) or "pattern" (with a grid:
            # a textured square in the cell the question names; see the module docstring)
            "detail": "digit",
            "pattern_size": 64,  # px, the side of a pattern's square (detail: pattern)
            # the distractor squares' textures (detail: pattern): "random" (zooming on another cell
            # misleads) or "same" as the target's (any cell shows the answer: where to look does not
            # matter, only whether to)
            "distractor_pattern": "random",
            "frame_width": BORDER,  # px; a wider frame keeps the target's colour visible when shrunk
            "thinking": True,  # a <think> block before each call and the answer
            # the share of reference trajectories (the SFT warm start) that zoom before answering;
            # the rest answer at once (a guess: the digit cannot be read), so RL can raise the share
            "reference_look_rate": 1.0,
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        if isinstance(o["glyph_scale"], bool) or not isinstance(o["glyph_scale"], int) or not 1 <= o["glyph_scale"] <= 8:
            raise ValueError(f"zoom_qa: glyph_scale must be an int in [1, 8], got {o['glyph_scale']!r}")
        if isinstance(o["frame_width"], bool) or not isinstance(o["frame_width"], int) or not 1 <= o["frame_width"] <= 16:
            raise ValueError(f"zoom_qa: frame_width must be an int in [1, 16], got {o['frame_width']!r}")
        w, h = frame_size(o["glyph_scale"], o["frame_width"])
        if not (isinstance(o["canvas_size"], int) and o["canvas_size"] >= 4 * max(w, h)):
            raise ValueError(f"zoom_qa: canvas_size must be an int of at least {4 * max(w, h)}, got {o['canvas_size']!r}")
        if not (isinstance(o["distractors"], int) and 0 <= o["distractors"] <= 40):
            raise ValueError(f"zoom_qa: distractors must be an int in [0, 40], got {o['distractors']!r}")
        grid = o["grid"]
        if grid is not None:
            if isinstance(grid, bool) or not isinstance(grid, int) or not 2 <= grid <= 26:
                raise ValueError(f"zoom_qa: grid must be null or an int in [2, 26], got {grid!r}")
            if o["canvas_size"] // grid < max(w, h) + 8 or o["distractors"] + 1 > grid * grid:
                raise ValueError(f"zoom_qa: a {grid}x{grid} grid needs cells of at least {max(w, h) + 8} px "
                                 f"(canvas_size {o['canvas_size']}) and at most {grid * grid - 1} distractors")
        if o["detail"] not in DETAILS:
            raise ValueError(f"zoom_qa: detail must be one of {list(DETAILS)}, got {o['detail']!r}")
        if o["detail"] == "pattern":
            side = o["pattern_size"]
            if grid is None:
                raise ValueError("zoom_qa: detail: pattern needs a grid (the question names the target's cell)")
            if isinstance(side, bool) or not isinstance(side, int) or not 4 <= side <= o["canvas_size"] // grid - 8:
                raise ValueError(f"zoom_qa: pattern_size must be an int in [4, {o['canvas_size'] // grid - 8}] "
                                 f"(a cell less 8 px), got {side!r}")
        if o["distractor_pattern"] not in ("random", "same"):
            raise ValueError(f"zoom_qa: distractor_pattern must be 'random' or 'same', got {o['distractor_pattern']!r}")
        if not (isinstance(o["reference_look_rate"], (int, float)) and 0 <= o["reference_look_rate"] <= 1):
            raise ValueError(f"zoom_qa: reference_look_rate must be in [0, 1], got {o['reference_look_rate']!r}")

    # -- data -----------------------------------------------------------------------------------
    def make(self, seed: int) -> dict:
        if self.options["detail"] == "pattern":
            return self.make_pattern(seed)
        rng = random.Random(seed)
        o = self.options
        size, scale = o["canvas_size"], int(o["glyph_scale"])
        w, h = frame_size(scale, o["frame_width"])
        background = tuple(rng.randint(215, 250) for _ in range(3))
        image = Image.new("RGB", (size, size), background)
        taken: list = []
        boxes = []
        grid = o["grid"]
        cells = rng.sample(range(grid * grid), 1 + o["distractors"]) if grid else []
        for k in range(1 + o["distractors"]):
            for _ in range(200):
                if grid:  # anywhere inside its own cell, 4 px from the cell's edges
                    cell, side = cells[k], size // grid
                    x0, y0 = (cell % grid) * side, (cell // grid) * side
                    x, y = rng.randint(x0 + 4, x0 + side - w - 4), rng.randint(y0 + 4, y0 + side - h - 4)
                else:
                    x, y = rng.randint(8, size - w - 8), rng.randint(8, size - h - 8)
                if _free((x, y, x + w, y + h), taken, margin=0 if grid else 8):
                    break
            else:
                continue  # a crowded canvas: fewer distractors
            color = TARGET_COLOR if k == 0 else rng.choice(DISTRACTOR_COLORS)
            digit = rng.choice(string.digits)
            box = draw_framed_digit(image, digit, (x, y), color, scale, o["frame_width"])
            taken.append(box)
            boxes.append((box, digit))
        (target, answer), others = boxes[0], boxes[1:]
        return {"image": image, "image_size": image.size,
                "question": f"What digit is in the {TARGET_NAME} frame?", "answer": answer,
                "target_box": target, "distractor_boxes": [b for b, _ in others], "id": seed}

    def make_pattern(self, seed: int) -> dict:
        """A ``detail: pattern`` example: textured squares in distinct cells, the first the target."""
        rng = random.Random(seed)
        o = self.options
        size, grid, side = o["canvas_size"], o["grid"], o["pattern_size"]
        cell_side = size // grid
        background = tuple(rng.randint(215, 250) for _ in range(3))
        image = Image.new("RGB", (size, size), background)
        boxes: list = []
        for cell in rng.sample(range(grid * grid), 1 + o["distractors"]):
            x0, y0 = (cell % grid) * cell_side, (cell // grid) * cell_side
            x, y = rng.randint(x0 + 4, x0 + cell_side - side - 4), rng.randint(y0 + 4, y0 + cell_side - side - 4)
            pattern = rng.choice(sorted(PATTERNS))
            if boxes and o["distractor_pattern"] == "same":
                pattern = boxes[0][1]
            dark = tuple(rng.randint(0, 90) for _ in range(3))
            light = tuple(rng.randint(150, 255) for _ in range(3))
            draw_pattern(image, pattern, (x, y, x + side, y + side), dark, light)
            boxes.append(((x, y, x + side, y + side), pattern))
        (target, answer), others = boxes[0], boxes[1:]
        cell = cell_name(target, grid, size, size)
        return {"image": image, "image_size": image.size, "question": f'Which pattern fills the square in cell "{cell}"?',
                "answer": answer, "target_box": target, "distractor_boxes": [b for b, _ in others], "id": seed}

    def examples(self, split: str):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"zoom_qa: unknown split {split!r}; valid splits: {sorted(SPLIT_SEEDS)}")
        path = self.options.get(f"{split}_path")
        if path and any((Path(path).expanduser() / c).is_dir() for c in VSTAR_CATEGORIES):
            cache = self.__dict__.setdefault("_vstar", {})
            if split not in cache:
                cache[split] = VStarExamples(path, shuffle_options=self.options["shuffle_options"])
            return cache[split]
        return self.file_or_synthetic(split, SPLIT_SEEDS, parse_record)

    # -- prompts and references -----------------------------------------------------------------
    def prompt(self, ex: dict) -> list[dict]:
        """The image and question with the instruction; a DeepEyes row keeps its system prompt
        (its tool list) and user text; a V* or HR-Bench example lists its options as "A. ..."."""
        if ex.get("prompt_text") is not None:
            messages = [{"role": "system", "content": ex["system"]}] if ex.get("system") else []
            text = ex["prompt_text"].replace("<image>", "").strip()
            return messages + [{"role": "user", "content": [{"type": "image", "image": ex["image"]},
                                                            {"type": "text", "text": text}]}]
        if ex.get("options"):
            options = "\n".join(f"{string.ascii_uppercase[i]}. {o}" for i, o in enumerate(ex["options"]))
            text = f"Question: {ex['question']}\nOptions:\n{options}\n{VSTAR_INSTRUCTION}"
        elif self.options["grid"]:
            g = self.options["grid"]
            what = "digit" if self.options["detail"] == "digit" else "pattern"
            layout = f"<think>...</think><answer>{what}</answer>" if self.thinking else f"<answer>{what}</answer>"
            names = f" ({', '.join(sorted(PATTERNS))})" if what == "pattern" else ""
            text = (f"{ex['question']} Too small? Call zoom_cell on a cell of the {g}x{g} grid "
                    f"(rows A-{string.ascii_uppercase[g - 1]}, columns 1-{g}). Answer with {layout}{names}.")
        else:
            text = f"{ex['question']} {INSTRUCTION}"
        return [{"role": "user", "content": [{"type": "image", "image": ex["image"]}, {"type": "text", "text": text}]}]

    def reference_answer(self, ex: dict) -> str:
        return ex.get("answer_letter") or str(ex["answer"])

    def reasoning(self, ex: dict) -> str:
        return f"The zoomed image shows {ex['answer']}." if "target_box" in ex else "I read the answer."

    def zoom_call(self, ex: dict) -> str:
        """The reference zoom call: ``zoom_in`` on the target's frame, in the policy's coordinate
        frame (``pred_space`` / ``frame`` when the trainer recorded them, else pixels); with a
        ``grid``, ``zoom_cell`` on the target's cell."""
        if self.options["grid"]:
            return call_text("zoom_cell", {"cell": cell_name(ex["target_box"], self.options["grid"], *ex["image"].size)})
        box = [round(v) for v in pixels_to_prediction(ex["target_box"], ex)]
        return call_text("zoom_in", {"bbox_2d": box, "label": f"the {TARGET_NAME} frame"})

    def looks(self, ex: dict) -> bool:
        """Whether the reference trajectory of ``ex`` zooms (``reference_look_rate`` of the
        examples, chosen by the example's id so a resumed warm start sees the same)."""
        rate = float(self.options["reference_look_rate"])
        return rate >= 1 or zlib.crc32(str(ex.get("id")).encode()) % 1000 < rate * 1000

    def reference_turns(self, ex: dict) -> list[str]:
        """The assistant turns of a reference trajectory (for a multi-turn warm start): a zoom on
        the target's frame, then, after the tool's image, the answer (:meth:`target`); for the
        examples that do not look (:meth:`looks`), the answer at once."""
        if "target_box" not in ex or not self.looks(ex):
            return [self.target(ex)]
        what = f"The {TARGET_NAME} frame" if self.options["detail"] == "digit" else "The square"
        thought = f"<think>{what} is too small to read; zoom in on it.</think>" if self.thinking else ""
        return [thought + self.zoom_call(ex), self.target(ex)]

    # -- evaluation -----------------------------------------------------------------------------
    def trajectory_metrics(self, completions, examples) -> dict[str, float]:
        """Over whole trajectories: accuracy (DeepEyes' accuracy term, rule-based; a V* answer may be the option's letter
        or text), crop_iou (mean over examples with a target; 0 without a crop), the tool-use
        metrics (:func:`mmrl.measures.tool_use.tool_use_metrics`) and ``tool/right_with_tool``
        (the share of right answers whose trajectory got a tool image back)."""
        n = max(1, len(examples))
        parts = [deepeyes_parts(c, ex) for c, ex in zip(completions, examples)]
        ious = [v for v in (crop_iou(ex) for ex in examples) if v is not None]
        out = {"accuracy": sum(p["accuracy"] for p in parts if p) / n,
               "format_error": sum(1.0 for p in parts if p and p["format"] < 0) / n}
        if ious:
            out["crop_iou"] = sum(ious) / len(ious)
        right = [ex for p, ex in zip(parts, examples) if p and p["accuracy"] > 0.5]
        if right:  # DeepEyes' tool-use analysis: how many right answers looked again
            out["tool/right_with_tool"] = sum(1.0 for ex in right if images_returned(ex) > 0) / len(right)
        return {**out, **tool_use_metrics(examples)}

    def visualize(self, ex: dict, completion: str):
        """The canvas with the target's frame in green and the crops in red (scale 1), and the
        last crop's zoomed view beside it (what the model was shown, at the canvas's height)."""
        image, draw = canvas(ex["image"], scale=1)
        for box in ex.get("target_boxes") or ([ex["target_box"]] if "target_box" in ex else []):
            draw_box(draw, box, TRUE, scale=1)
        crops = [c["box"] for c in ex.get("tool_calls") or [] if isinstance(c, dict) and c.get("ok") and c.get("box")]
        for box in crops:
            draw_box(draw, box, PRED, scale=1)
        if not crops:
            return image
        zoom = ex["image"].crop(tuple(int(round(v)) for v in crops[-1]))
        side = ex["image"].height
        zoom = zoom.resize((max(1, round(zoom.width * side / zoom.height)), side), resample=Image.NEAREST)
        both = Image.new("RGB", (image.width + 4 + zoom.width, image.height), (255, 255, 255))
        both.paste(image, (0, 0))
        both.paste(zoom, (image.width + 4, 0))
        return both
