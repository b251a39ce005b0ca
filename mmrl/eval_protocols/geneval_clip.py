"""GenEval's colour judge: each detected object's colour decided by CLIP zero-shot classification.

GenEval ("GenEval: An Object-Focused Framework for Evaluating Text-to-Image Alignment", Ghosh et
al., 2023) does not read colours off pixels: its ``evaluation/evaluate_images.py`` (github
djghosh13/geneval) paints every pixel outside the object's mask grey (``bgcolor`` "#999"), crops
the image to the object's box (``ImageCrops``), and classifies the crop among ten colours with
three templates per colour (``color_classification``). The text side is clip_benchmark's
``zero_shot_classifier``: each template's embedding normalised, the mean over the templates
normalised again; an image's colour is the argmax of its normalised embedding against the ten
(``run_classification``; its factor 100 does not move an argmax). GenEval's CLIP is ViT-L-14 with
OpenAI's weights; here any open_clip architecture and a local checkpoint, loaded and cached by the
``clip_score`` reward's loader (:func:`mmrl.rewards.model_scorers.load_clip`).

What is mmrl's, not GenEval's: the objects and their masks come from the built-in pixel detector
(:func:`~mmrl.measures.composition.detect_objects`), not Mask2Former; the class word in the
templates is the object's detected shape ("circle", "square"; "shape" for a blob); CLIP re-labels
the colour of every detected object and the built-in checks
(:func:`~mmrl.measures.composition.object_checks`) judge with those colours.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from ..measures.composition import detect_objects, object_checks

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
TEMPLATES = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")
GREY = (153, 153, 153)  # GenEval's bgcolor "#999"
BLOB_CLASS = "shape"  # the class word for a detected blob (neither circle nor square)


def object_crop(image: Image.Image, mask: np.ndarray, box: Sequence[int]) -> Image.Image:
    """``ImageCrops.__getitem__``: the pixels outside ``mask`` (H, W bool) grey, then the image
    cropped to ``box`` ``(x1, y1, x2, y2)``, right/bottom exclusive (PIL's crop)."""
    image = image.convert("RGB")
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != image.size[::-1]:
        raise ValueError(f"an object's mask is {mask.shape}, its image (H, W) {image.size[::-1]}")
    blank = Image.new("RGB", image.size, GREY)
    return Image.composite(image, blank, Image.fromarray(mask)).crop(tuple(int(v) for v in box))


def color_texts(classname: str) -> list[str]:
    """The 30 prompts of one class: for each colour in order, its three templates."""
    return [t.format(c=c, cls=classname) for c in GENEVAL_COLORS for t in TEMPLATES]


class ClipColors:
    """GenEval's colour judge over one CLIP model (anything with ``embed_images`` / ``embed_texts``
    returning one row per input, as :class:`mmrl.rewards.model_scorers.ClipModel`), each class's
    text classifier built once (GenEval's ``COLOR_CLASSIFIERS``)."""

    def __init__(self, clip, batch_size: int = 16):
        self.clip, self.batch_size = clip, batch_size
        self._classifiers: dict = {}

    def classifier(self, classname: str):
        """(10, D): per colour the mean of its templates' unit embeddings, normalised again."""
        import torch.nn.functional as F

        if classname not in self._classifiers:
            emb = F.normalize(self.clip.embed_texts(color_texts(classname), self.batch_size).float(), dim=-1)
            per_colour = emb.reshape(len(GENEVAL_COLORS), len(TEMPLATES), -1).mean(1)
            self._classifiers[classname] = F.normalize(per_colour, dim=-1)
        return self._classifiers[classname]

    def classify(self, crops: Sequence[Image.Image], classnames: Sequence[str]) -> list[str]:
        """Each crop's colour: the argmax over the ten of its class's classifier times its unit embedding."""
        import torch.nn.functional as F

        if not crops:
            return []
        emb = F.normalize(self.clip.embed_images(list(crops), self.batch_size).float(), dim=-1)
        return [GENEVAL_COLORS[int((self.classifier(cls) @ e).argmax())] for e, cls in zip(emb, classnames)]

    def colors(self, image: Image.Image, objects: Sequence[dict]) -> list[str]:
        """The colour of each object of ``detect_objects(image, masks=True)``."""
        crops = [object_crop(image, o["mask"], o["box"]) for o in objects]
        return self.classify(crops, [o["shape"] if o["shape"] != "blob" else BLOB_CLASS for o in objects])

    def checks(self, image: Image.Image, spec: list[dict]) -> dict[str, bool]:
        """:func:`~mmrl.measures.composition.composition_checks` with every object's colour CLIP's."""
        objects = detect_objects(image, masks=True)
        relabelled = [{**o, "color": c} for o, c in zip(objects, self.colors(image, objects))]
        return object_checks(relabelled, spec, image.size[0])


@dataclass(frozen=True)
class ClipSetting:
    """``--clip ARCH=CHECKPOINT``: an open_clip architecture and its local checkpoint file."""

    model: str
    checkpoint: Path

    def __str__(self) -> str:  # the table's title says which judge decided the colours
        return f"colours by CLIP {self.model} zero-shot ({self.checkpoint.name}; GenEval's evaluate_images.py)"


def parse_clip(value: str) -> ClipSetting:
    """``"ViT-L-14=/weights/clip.pt"`` as a :class:`ClipSetting`; the file must exist (mmrl
    downloads nothing)."""
    model, sep, path = str(value).partition("=")
    if not sep or not model.strip() or not path.strip():
        raise ValueError(f"--clip {value!r}: give ARCH=CHECKPOINT, an open_clip architecture and a local "
                         "checkpoint file, e.g. --clip ViT-L-14=/weights/vit_l_14_openai.pt")
    checkpoint = Path(path.strip()).expanduser()
    if not checkpoint.is_file():
        raise FileNotFoundError(f"--clip {value!r}: {checkpoint} is not a file. mmrl downloads nothing: fetch "
                                "the CLIP weights first (GenEval's are ViT-L-14, OpenAI's)")
    return ClipSetting(model.strip(), checkpoint.resolve())


@lru_cache(maxsize=4)
def clip_colors(setting: ClipSetting, device: str = "auto") -> ClipColors:
    """The judge for ``setting``, its model loaded once (the ``clip_score`` reward's cache)."""
    from ..core.distributed import pick_device
    from mmrl.rewards.model_scorers import load_clip

    return ClipColors(load_clip(setting.model, setting.checkpoint, pick_device(device)))
