"""Self-supervised tasks whose labels come from a transform of the image, not from people.

After "SSL4RL: Revisiting Self-supervised Learning as Intrinsic Reward for Visual-Language
Reasoning": a pretext task (here rotation prediction and a 2x2 jigsaw) gives a verifiable reward
on any pile of unlabelled images.

* ``rotation``: the image is turned clockwise by 0, 90, 180 or 270 degrees (drawn from the
  example's seed); "How far is this image turned clockwise? Options: 0, 90, 180, 270." Reward
  ``accuracy`` (numbers compare as numbers, so "90.0" is right).
* ``jigsaw``: the image is cut into a ``grid`` x ``grid`` (default 2x2) grid of tiles, shuffled by
  a permutation drawn from the seed. Places are numbered in reading order from 0 at the top left;
  the answer gives, for each tile of the shown image in reading order, the place it came from,
  e.g. "2 0 3 1" (the top-left tile was at the bottom left). Reward ``jigsaw_position``: the
  fraction of tiles placed right (see :mod:`mmrl.measures.jigsaw`).

Images: option ``image_dir`` (any folder of unlabelled images, searched recursively for jpg, jpeg,
png and webp; unreadable files are skipped and counted, ``examples(split).stats()``), each resized
to ``image_size`` square first. The folder is split into train and eval deterministically by a
hash of each file's relative path (``eval_fraction`` of the files, at least one, go to eval), or
``eval_image_dir`` gives the eval images and all of ``image_dir`` trains. One example per image;
its rotation / permutation is fixed by its seed. Without ``image_dir``: synthetic scenes from
:mod:`mmrl.data.scenes` drawn on a background that shades from light at the top left to darker
at the bottom right, with at least one (apex-up) triangle, so both the rotation and the tile
order can be read off the image (a flat background would make shuffled tiles another plausible
scene). Train and eval seeds are disjoint.

Both tasks have the ``thinking`` option: False gives an answer-only prompt and target, with reward
``{"equality": 1.0}`` for rotation and format (answer_only) 0.5 + jigsaw_position 1.0 for jigsaw.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
from PIL import Image, ImageDraw

from mmrl import SyntheticExamples, Task, register_task
from mmrl.data.images import ImageFiles, find_images
from mmrl.data.scenes import draw_object, scene_with_targets
from mmrl.data.sequence import LazySequence
from mmrl.measures.answers import layout_answer, layout_score
from mmrl.measures.jigsaw import parse_positions, tile_score
from mmrl.media.draw import FOOTER, PRED, TRUE, canvas, draw_box, draw_label
from mmrl.parsing import extract_answer

SPLIT_SEEDS = {"train": 1, "eval": 2}  # distinct seeds: eval examples are never trained on
ANGLES = (0, 90, 180, 270)
# Clockwise turn by the angle, as PIL transposes (PIL's ROTATE_90 turns counter-clockwise).
_CLOCKWISE = {90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_90}
# Kept short on purpose: the tiny model's 1k-token vocabulary is trained on these texts.
ROTATION_QUESTION = "How far is this image turned clockwise? Options: 0, 90, 180, 270."
ROTATION_FORMAT = "Answer with <think>...</think><answer>number</answer>."
ROTATION_ANSWER_ONLY = "Answer with <answer>number</answer>."
JIGSAW_FORMAT = "Answer with <think>...</think><answer>digits</answer>."
JIGSAW_ANSWER_ONLY = "Answer with <answer>digits</answer>."


def jigsaw_question(grid: int) -> str:
    n = grid * grid
    return (f"The {n} tiles of this image are mixed. Where was each tile at first? "
            f"Give {n} digits in reading order, 0 is top left.")


# -- images --------------------------------------------------------------------------------------
def shaded_background(size: int) -> Image.Image:
    """A ``size`` x ``size`` background, light at the top left: red fades going down, blue going
    right, so every region (and so every tile and every turn) looks different."""
    t = np.linspace(0.0, 1.0, size, dtype=np.float32)
    pixels = np.empty((size, size, 3), dtype=np.float32)
    pixels[..., 0] = 250 - 90 * t[:, None]  # rows: darker red further down
    pixels[..., 1] = 245
    pixels[..., 2] = 250 - 90 * t[None, :]  # columns: darker blue further right
    return Image.fromarray(np.round(pixels).astype(np.uint8), "RGB")


def ssl_scene(rng: random.Random, size: int) -> Image.Image:
    """A synthetic image for the pretext tasks: 1-2 triangles (apex up) and 1-3 other shapes on
    :func:`shaded_background`, one object per grid cell as in :mod:`mmrl.data.scenes`."""
    scene = scene_with_targets(rng, (None, "triangle"), num_targets=rng.randint(1, 2),
                               num_distractors=rng.randint(1, 3), size=size)
    image = shaded_background(size)
    draw = ImageDraw.Draw(image)
    for obj in scene.objects:
        draw_object(draw, obj)
    return image


def rotate_clockwise(image: Image.Image, angle: int) -> Image.Image:
    """``image`` turned clockwise by ``angle`` (0, 90, 180 or 270) degrees, pixel-exact."""
    if angle not in ANGLES:
        raise ValueError(f"angle must be one of {ANGLES}, got {angle!r}")
    return image.copy() if angle == 0 else image.transpose(_CLOCKWISE[angle])


def tile_box(place: int, grid: int, tile: int) -> tuple[int, int, int, int]:
    """The pixel box (right/bottom exclusive) of place ``place`` (reading order) of a grid."""
    row, col = divmod(place, grid)
    return (col * tile, row * tile, (col + 1) * tile, (row + 1) * tile)


def shuffle_tiles(image: Image.Image, permutation: Sequence[int], grid: int) -> Image.Image:
    """The image with place p showing the original tile ``permutation[p]``. The image is cut to
    ``grid * tile`` square first, ``tile = min(width, height) // grid``."""
    n = grid * grid
    if sorted(permutation) != list(range(n)):
        raise ValueError(f"not a permutation of 0..{n - 1}: {list(permutation)}")
    tile = min(image.size) // grid
    out = Image.new(image.mode, (grid * tile, grid * tile))
    for place, source in enumerate(permutation):
        out.paste(image.crop(tile_box(source, grid, tile)), tile_box(place, grid, tile)[:2])
    return out


def split_files(paths: Sequence[Path], root: Path, eval_fraction: float) -> dict[str, list[Path]]:
    """Disjoint train / eval lists: the files are ordered by a CRC-32 of their path relative to
    ``root`` (ties by path), the first ``round(n * eval_fraction)`` (at least 1, at most n - 1) are
    eval. Deterministic, and a file keeps its split while the others stay."""
    if len(paths) < 2:
        raise ValueError(f"{root}: need at least 2 images to split into train and eval "
                         f"(found {len(paths)}); or set eval_image_dir")
    keyed = sorted(paths, key=lambda p: (zlib.crc32(p.relative_to(root).as_posix().encode()), p.as_posix()))
    n_eval = min(len(paths) - 1, max(1, round(len(paths) * eval_fraction)))
    return {"eval": sorted(keyed[:n_eval]), "train": sorted(keyed[n_eval:])}


class _FromImages(LazySequence):
    """Item i: ``make(images[i], seed)`` with ``seed = split_seed * 1_000_003 + i`` (as
    :class:`mmrl.task.SyntheticExamples` numbers its examples)."""

    def __init__(self, images: ImageFiles, make, seed: int):
        self.images, self._make, self._seed = images, make, seed

    def __len__(self) -> int:
        return len(self.images)

    def item(self, i: int) -> dict:
        return self._make(self.images[i], self._seed * 1_000_003 + i)

    def usable(self, i: int) -> Optional[dict]:
        image = self.images.usable(i)
        return None if image is None else self._make(image, self._seed * 1_000_003 + i)

    def stats(self) -> dict[str, Any]:
        return self.images.stats()


class _SelfSupervised(Task):
    """Shared options and image sources of the pretext tasks; subclasses implement
    ``transform(image, rng) -> dict`` (the shown image, question, answer and label fields)."""

    modality = "vlm"
    min_size = 56  # synthetic scenes: 4x4 cells of at least 14 px

    def default_options(self):
        return {
            "image_dir": None,  # folder of unlabelled images (recursive); None: synthetic scenes
            "eval_image_dir": None,  # eval images; None: a split of image_dir
            "eval_fraction": 0.1,
            "image_size": 112,
            "train_size": 1_000_000,  # synthetic only
            "eval_size": 1000,
            "thinking": True,
        }

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        size = o["image_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < self.min_size:
            raise ValueError(f"{self.name}: image_size must be an integer >= {self.min_size}, got {size!r}")
        if not (isinstance(o["eval_fraction"], (int, float)) and 0 < o["eval_fraction"] < 1):
            raise ValueError(f"{self.name}: eval_fraction must be in (0, 1), got {o['eval_fraction']!r}")
        if o["eval_image_dir"] and not o["image_dir"]:
            raise ValueError(f"{self.name}: eval_image_dir needs image_dir (the training images)")
        self._cache: dict[str, Sequence[dict]] = {}

    def transform(self, image: Image.Image, rng: random.Random) -> dict:
        """The pretext example of ``image`` (question, answer, transformed image); each
        self-supervised task (``rotation``, ``jigsaw``) defines its own."""
        raise NotImplementedError(f"{type(self).__name__} must define transform(image, rng)")

    def make(self, seed: int) -> dict:
        """Synthetic example ``seed``: the label is drawn first, then the scene."""
        rng = random.Random(seed)
        label_rng = random.Random(rng.getrandbits(64))
        scene = ssl_scene(rng, self.options["image_size"])
        return {**self.transform(scene, label_rng), "synthetic": True, "id": seed}

    def _make_from(self, item: dict, seed: int) -> dict:
        rng = random.Random(seed)
        label_rng = random.Random(rng.getrandbits(64))
        out = self.transform(item["image"], label_rng)
        return {**out, "image_path": item["image_path"], "synthetic": False, "id": seed}

    def _files(self, split: str) -> list[Path]:
        o = self.options
        root = Path(o["image_dir"]).expanduser()
        if split == "eval" and o["eval_image_dir"]:
            root = Path(o["eval_image_dir"]).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"{self.name}: image folder not found: {root}")
        paths = find_images(root)
        if not paths:
            raise ValueError(f"{self.name}: no images (jpg, jpeg, png, webp) under {root}")
        if o["eval_image_dir"]:
            return paths
        return split_files(paths, root, o["eval_fraction"])[split]

    def examples(self, split: str):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"{self.name}: unknown split {split!r}; valid splits: {sorted(SPLIT_SEEDS)}")
        if split not in self._cache:
            o = self.options
            if o["image_dir"]:
                files = ImageFiles(self._files(split), size=o["image_size"], name=f"{self.name} {split} images")
                self._cache[split] = _FromImages(files, self._make_from, SPLIT_SEEDS[split])
            else:
                self._cache[split] = SyntheticExamples(self.make, o[f"{split}_size"], SPLIT_SEEDS[split])
        return self._cache[split]

    def _prediction(self, completion) -> Optional[str]:
        return layout_answer(completion, self.thinking)


# -- rotation ------------------------------------------------------------------------------------
@register_task("rotation")
class Rotation(_SelfSupervised):
    rewards = {"format": 0.5, "accuracy": 1.0}
    answer_only_rewards = {"equality": 1.0}
    instructions = (ROTATION_FORMAT, ROTATION_ANSWER_ONLY)

    def transform(self, image: Image.Image, rng: random.Random) -> dict:
        angle = rng.choice(ANGLES)
        shown = rotate_clockwise(image, angle)
        return {"image": shown, "question": ROTATION_QUESTION, "answer": str(angle), "angle": angle,
                "image_size": shown.size}

    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        return f"It is turned {ex['answer']}."

    def hints(self, ex: dict) -> list[str]:
        """Knowledge (what shows which way is up), planning (sideways or not), solution."""
        if ex.get("synthetic"):
            knowledge = "Triangle tips point up when the image is not turned."
        else:
            knowledge = "Find things that should stand upright."
        sideways = int(ex["angle"]) in (90, 270)
        planning = "It lies on its side." if sideways else "It is upright or upside down."
        return [knowledge, planning, f"The answer is {ex['answer']}."]

    def _scores(self, completions, examples) -> list[float]:
        return [layout_score(c, ex.get("answer"), self.thinking) for c, ex in zip(completions, examples)]

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: graded like the answer reward (unparsable is wrong); parsed: an answer was
        found (thinking: an answer block; answer-only: any text)."""
        scores = self._scores(completions, examples)
        n = max(1, len(scores))
        parsed = sum(1 for c in completions if self._prediction(c) not in (None, ""))
        return {"accuracy": sum(scores) / n, "parsed": parsed / n}

    def visualize(self, ex: dict, completion: str):
        """The shown image upscaled, with the true vs predicted turn below it (red when wrong)."""
        image, draw = canvas(ex["image"], footer=FOOTER)
        pred = self._prediction(completion)
        right = self._scores([completion], [ex])[0] == 1.0
        draw_label(draw, f"turned {ex['answer']}  pred {pred if pred is not None else '?'}", TRUE if right else PRED)
        return image


# -- jigsaw --------------------------------------------------------------------------------------
@register_task("jigsaw")
class Jigsaw(_SelfSupervised):
    rewards = {"format": 0.5, "jigsaw_position": 1.0}  # graded: no equality reward without thinking
    instructions = (JIGSAW_FORMAT, JIGSAW_ANSWER_ONLY)

    def default_options(self):
        return {**super().default_options(), "grid": 2}  # 2x2 tiles; 3 gives 3x3 (digits 0-8)

    def __init__(self, **options):
        super().__init__(**options)
        grid = self.options["grid"]
        if grid not in (2, 3):
            raise ValueError(f"jigsaw: grid must be 2 or 3 (one digit per place), got {grid!r}")

    def transform(self, image: Image.Image, rng: random.Random) -> dict:
        grid = self.options["grid"]
        permutation = list(range(grid * grid))
        rng.shuffle(permutation)
        shown = shuffle_tiles(image, permutation, grid)
        return {"image": shown, "question": jigsaw_question(grid), "answer": " ".join(map(str, permutation)),
                "permutation": tuple(permutation), "grid": grid, "image_size": shown.size}

    def reference_answer(self, ex: dict) -> str:
        return ex["answer"]

    def reasoning(self, ex: dict) -> str:
        return f"Top left came from {ex['permutation'][0]}."

    def hints(self, ex: dict) -> list[str]:
        """Knowledge (how places are numbered, what to match), planning (where the top-left tile
        came from), solution."""
        knowledge = "Places count in reading order from 0 at top left."
        if ex.get("synthetic"):
            knowledge += " The background is lightest at the top left."
        else:
            knowledge += " Match the edges of the tiles."
        planning = f"The top left tile came from place {ex['permutation'][0]}."
        return [knowledge, planning, f"The answer is {ex['answer']}."]

    def metrics(self, completions, examples) -> dict[str, float]:
        """accuracy: every tile right; tile_accuracy: mean fraction of tiles right (the
        jigsaw_position reward, unparsable = 0); parsed: the answer had one number per tile."""
        raw = [tile_score(c, ex) for c, ex in zip(completions, examples)]
        n = max(1, len(raw))
        scores = [0.0 if s is None else s for s in raw]
        return {
            "accuracy": sum(1 for s in scores if s == 1.0) / n,
            "tile_accuracy": sum(scores) / n,
            "parsed": sum(1 for s in raw if s is not None) / n,
        }

    def visualize(self, ex: dict, completion: str):
        """The shuffled image upscaled, each tile boxed green when its predicted place is right
        and red when wrong or missing, with the true vs predicted answer below."""
        image, draw = canvas(ex["image"], footer=FOOTER)
        grid = ex["grid"]
        truth = list(ex["permutation"])
        pred_text = extract_answer(completion) if isinstance(completion, str) else None
        pred = parse_positions(pred_text, len(truth)) if pred_text is not None else None
        tile = min(ex["image"].size) // grid
        for place, source in enumerate(truth):
            ok = pred is not None and pred[place] == source
            x1, y1, x2, y2 = tile_box(place, grid, tile)
            draw_box(draw, (x1 + 1, y1 + 1, x2 - 1, y2 - 1), TRUE if ok else PRED)
        shown = " ".join(map(str, pred)) if pred is not None else "?"
        draw_label(draw, f"true {ex['answer']}  pred {shown}", TRUE if pred == tuple(truth) else PRED)
        return image
