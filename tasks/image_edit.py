"""Image editing: a source image and an instruction in, the edited image out (issue 56).

A prompt is a :class:`mmrl.GenerationPrompt` (the instruction, the source image), so the task needs
an editing generator (``model.path=tiny-edit``, FLUX.1-Kontext, Qwen-Image-Edit).

Synthetic by default (:mod:`mmrl.data.shape_edits`, what the tiny editing generator learns on):
recolour / move / add a shape in a 16x16 scene, each with its target and the ground-truth edit
region; ``edit_success`` verifies an edit from pixels (:mod:`mmrl.measures.edits`). Held-out
instructions: a fixed fifth of the instruction strings (by a stable hash) only ever appears in the
eval split, in new scenes.

Files (``train_path`` / ``eval_path``): records with the source ``image`` (a path, bytes, ...), the
``instruction`` and optionally ``mask`` (an image whose white pixels are the edit region; the
preservation reward and metric then score only outside it). ``format`` reads two public edit
benchmarks as they ship (it sets ``fields``; keys given in ``fields`` win):

- ``imgedit``: ImgEdit's Basic benchmark (PKU-YuanGroup/ImgEdit, ``Benchmark/Basic/basic_edit.json``:
  ``{"1082": {"id": "animal/000342021.jpg", "prompt": "...", "edit_type": "alter"}, ...}``); set
  ``image_root`` to the folder of its original images;
- ``gedit``: GEdit-Bench (stepfun-ai's parquet / ``datasets`` folder: ``key``, ``task_type``,
  ``instruction``, ``instruction_language``, ``input_image``, ``input_image_raw``, ...): the raw input
  image and the instruction (English and Chinese rows alike).

Those have no targets: their metric is ``preservation`` alone; train them with ``edit_instruction``
(a VLM judge) and ``edit_preservation`` as the rewards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from mmrl import GenerationPrompt, Task, register_task
from mmrl.data.images import open_image
from mmrl.data.records import BadRecord, require_image
from mmrl.data.shape_edits import EDIT_SIZE, KINDS, edit_example
from mmrl.measures.edits import CHECKS, edit_checks, masked_preservation
from mmrl.media.draw import FOOTER, draw_label, frame_strip
from mmrl.task import SyntheticExamples, is_held_out

FORMATS = {"imgedit": {"image": "id", "instruction": "prompt"},
           "gedit": {"image": "input_image_raw", "instruction": "instruction"}}
KEPT_KEYS = ("key", "edit_type", "task_type", "instruction_language")  # the benchmarks' categories, for reports
VIS_SCALE = 6  # a 16-px image -> 96 px


def _result(completion) -> Image.Image | None:
    return completion if isinstance(completion, Image.Image) else None


@register_task("image_edit")
class ImageEdit(Task):
    modality = "diffusion"
    rewards = {"edit_score": 1.0, "edit_preservation": 0.5}
    success_metric = "edit_success"

    def default_options(self):
        return {"train_size": 20000, "eval_size": 64, "size": EDIT_SIZE, "kinds": list(KINDS),
                "train_path": None, "eval_path": None, "format": None}

    def __init__(self, **options):
        super().__init__(**options)
        fmt = self.options["format"]
        if fmt is not None:
            if fmt not in FORMATS:
                raise ValueError(f"image_edit: task.options.format={fmt!r}; known: {sorted(FORMATS)} (or leave it "
                                 "out and map keys with task.options.fields)")
            self.options["fields"] = {**FORMATS[fmt], **(self.options["fields"] or {})}
        kinds = self.options["kinds"]
        if not kinds or set(kinds) - set(KINDS):
            raise ValueError(f"image_edit: task.options.kinds={kinds!r}; give some of {list(KINDS)}")

    # -- data -----------------------------------------------------------------------------------
    def examples(self, split: str):
        seeds = {"train": 31, "eval": 32}
        if split in seeds and not self.options.get(f"{split}_path"):
            return SyntheticExamples(lambda seed: self._synthetic(seed, split == "eval"), self.options[f"{split}_size"],
                                     seeds[split])
        return self.file_or_synthetic(split, seeds, self._parse, finish=self._finish(split))

    def _synthetic(self, seed: int, held_out: bool) -> dict:
        """A synthetic edit whose instruction is one of the held-out ones exactly when ``held_out``."""
        rng = np.random.default_rng(seed)
        while True:
            ex = edit_example(rng, self.options["size"], tuple(self.options["kinds"]))
            if is_held_out(ex["instruction"]) == held_out:
                return {**ex, "image": ex["source"]}

    def _parse(self, record: dict) -> dict:
        text = record.get("instruction")
        if not isinstance(text, str) or not text.strip():
            raise BadRecord("no 'instruction' text (another key can be named with task.options.fields.instruction, "
                            "or task.options.format: imgedit | gedit)")
        kept = {k: record[k] for k in KEPT_KEYS if record.get(k) is not None}
        return {**kept, "image": require_image(record), "instruction": text.strip(), "prompt": text.strip(),
                "mask": record.get("mask")}

    def _finish(self, split: str):
        """Opens an example's mask (white: the edit region) at the image's size, from the folder
        image paths start at; the opened image becomes the source."""
        path = self.options.get(f"{split}_path")
        root = self.options.get("image_root") or (Path(path) if path and Path(path).is_dir() else Path(str(path)).parent)

        def finish(ex: dict) -> dict:
            ex["source"] = ex["image"].convert("RGB")
            if ex.get("mask") is not None:
                mask, _ = open_image(ex["mask"], Path(root).expanduser())
                if mask.size != ex["source"].size:
                    raise BadRecord(f"its mask is {mask.size[0]}x{mask.size[1]}, its image "
                                    f"{ex['source'].size[0]}x{ex['source'].size[1]}")
                ex["mask"] = np.asarray(mask.convert("L")) >= 128
            return ex

        return finish

    def prompt(self, ex: dict) -> GenerationPrompt:
        return GenerationPrompt(ex["instruction"], ex["source"])

    def build_prompt(self, ex: dict) -> GenerationPrompt:
        return self.prompt(ex)

    # -- evaluation -----------------------------------------------------------------------------
    def metrics(self, completions: Sequence, examples: Sequence[dict]) -> dict[str, float]:
        """``edit_success`` (every check of :func:`mmrl.measures.edits.edit_checks` passed) and each
        check's pass rate over the synthetic examples (those with an ``edit``); ``preservation``
        (:func:`masked_preservation`) over all. A completion that is not an image fails everything."""
        checks, kept = [], []
        for completion, ex in zip(completions, examples):
            image = _result(completion)
            if "edit" in ex:
                checks.append(edit_checks(image, ex) if image is not None else dict.fromkeys(CHECKS, False))
            kept.append(masked_preservation(image, ex["source"], ex.get("mask")) if image is not None else 0.0)
        out = {"preservation": float(np.mean(kept)) if kept else 0.0}
        if checks:
            out["edit_success"] = float(np.mean([all(c.values()) for c in checks]))
            out.update({f"check/{k}": float(np.mean([c[k] for c in checks])) for k in CHECKS})
        return out

    def visualize(self, ex: dict, completion):
        """source | result | target (when the example has one), the instruction below."""
        image = _result(completion)
        if image is None:
            return None
        frames = [ex["source"], image.resize(ex["source"].size, Image.BICUBIC) if image.size != ex["source"].size
                  else image] + ([ex["target"]] if ex.get("target") is not None else [])
        canvas, draw = frame_strip(frames, scale=VIS_SCALE, max_frames=3, footer=FOOTER)
        draw_label(draw, ex["instruction"])
        return canvas
