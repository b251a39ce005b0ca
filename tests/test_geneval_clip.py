"""GenEval's CLIP colour judge (mmrl.eval_protocols.geneval_clip): the grey-masked crop, the template
averaging and argmax worked out by hand on a fake CLIP, the geneval benchmark's --clip variant on a
tiny random open_clip model, and the command line's --clip."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.eval_protocols import benchmark_table, configured
from mmrl.eval_protocols.geneval_clip import (GENEVAL_COLORS, GREY, ClipColors, ClipSetting, clip_colors, color_texts,
                                          object_crop, parse_clip)
from mmrl.data.shapes_t2i import render
from mmrl.measures.composition import detect_objects
from mmrl.registry import BENCHMARKS

needs_open_clip = pytest.mark.skipif(importlib.util.find_spec("open_clip") is None,
                                     reason="open_clip not installed (pip install 'mmrl[clip]')")

RED = {"count": 1, "color": "red", "shape": "circle", "position": None}
BLUE2 = {"count": 2, "color": "blue", "shape": "square", "position": None}


# -- the object's image: grey outside the mask, cropped to the box -------------------------------

def test_the_crop_is_the_box_with_grey_outside_the_mask():
    pixels = np.arange(5 * 6 * 3, dtype=np.uint8).reshape(5, 6, 3)  # pixel (x, y) = 3 * (6y + x) + (0, 1, 2)
    mask = np.zeros((5, 6), dtype=bool)
    mask[1, 2] = mask[2, 3] = mask[4, 0] = True  # (x=0, y=4) lies outside the box: cropped away
    crop = np.asarray(object_crop(Image.fromarray(pixels), mask, (2, 1, 4, 3)))
    assert crop.shape == (2, 2, 3)  # x 2..3, y 1..2: right/bottom exclusive, as PIL crops
    assert crop[0, 0].tolist() == [24, 25, 26]  # (x=2, y=1): 3 * (6 + 2)
    assert crop[1, 1].tolist() == [45, 46, 47]  # (x=3, y=2): 3 * (12 + 3)
    assert crop[0, 1].tolist() == crop[1, 0].tolist() == [153, 153, 153] == list(GREY)  # GenEval's "#999"
    with pytest.raises(ValueError, match=r"mask is \(6, 5\)"):
        object_crop(Image.fromarray(pixels), mask.T, (0, 0, 1, 1))


def test_the_crop_of_a_detected_object_keeps_only_its_pixels():
    """Two blue squares whose boxes are disjoint: the first one's crop is its box, every pixel blue
    (a filled square fills its box) and nothing grey; the background around it is not the mask."""
    image = render([BLUE2], 0)
    first = detect_objects(image, masks=True)[0]
    assert first["box"] == (1, 0, 10, 9) and first["mask"].sum() == first["area"] == 81
    crop = np.asarray(object_crop(image, first["mask"], first["box"]))
    assert crop.shape == (9, 9, 3) and (crop == np.asarray(image)[0:9, 1:10]).all()
    assert "mask" not in detect_objects(image)[0]  # only when asked


# -- the classifier: templates averaged per colour, argmax -----------------------------------------

class FakeClip:
    """Text embeddings chosen per prompt (2-D), image embeddings handed out in order; records calls."""

    def __init__(self, images):
        self.images, self.text_calls = list(images), []

    def embed_texts(self, texts, batch_size=32):
        self.text_calls.append(list(texts))
        rows = []
        for t in texts:
            if " red" in t:  # red's three templates: a long (10, 0) for "a photo of a red circle", then (0, 1) twice
                first = t.startswith("a photo of a red ") and not t.endswith("object")
                rows.append([10.0, 0.0] if first else [0.0, 1.0])
            elif " blue" in t:
                rows.append([1.0, 1.0])
            else:
                rows.append([0.0, -1.0])  # the other eight colours point away from every image
        return torch.tensor(rows)

    def embed_images(self, images, batch_size=32):
        out, self.images = self.images[:len(images)], self.images[len(images):]
        return torch.tensor(out)


def test_the_templates_are_genevals_for_each_colour_in_order():
    texts = color_texts("circle")
    assert len(texts) == 30 and texts[:3] == ["a photo of a red circle", "a photo of a red-colored circle",
                                              "a photo of a red object"]
    assert texts[-1] == "a photo of a white object" and GENEVAL_COLORS[1] == "orange"


def test_each_colour_is_the_normalised_mean_of_its_unit_template_embeddings_and_the_argmax_wins():
    """red = mean((1, 0), (0, 1), (0, 1)) = (1/3, 2/3) -> (1, 2)/sqrt 5 (the long (10, 0) counts once its
    length is removed); blue = (1, 1)/sqrt 2.
    Image (1, 0.2): red 1.4/sqrt 5 = 0.626 < blue 1.2/sqrt 2 = 0.849 -> blue (averaging raw
    embeddings would give red: (10/3, 2/3) -> 5.2/sqrt 26 = 1.02).
    Image (0.2, 1): red 2.2/sqrt 5 = 0.984 > blue 0.849 -> red (red's first template alone would
    give 0.2 -> blue)."""
    fake = FakeClip([[1.0, 0.2], [0.2, 1.0], [0.0, -1.0]])
    judge = ClipColors(fake)
    weights = judge.classifier("circle")
    assert weights[0].tolist() == pytest.approx([1 / math.sqrt(5), 2 / math.sqrt(5)])
    assert weights[4].tolist() == pytest.approx([1 / math.sqrt(2), 1 / math.sqrt(2)])
    crops = [Image.new("RGB", (2, 2))] * 3
    # the third image (0, -1) ties the eight other colours exactly: the first of them in order wins
    assert judge.classify(crops, ["circle"] * 3) == ["blue", "red", "orange"]
    assert len(fake.text_calls) == 1 and fake.text_calls[0] == color_texts("circle")  # built once per class
    assert judge.classify([], []) == []


def test_clip_colours_replace_the_pixel_colours_in_the_checks():
    """A rendered red circle is right by pixels; a CLIP that sees every crop as blue makes it wrong
    (no red object, an extra blue one), one that sees red keeps it right; the class word is the shape."""
    image = render([RED], 0)
    blue_eyed = FakeClip([[1.0, 0.2]])
    checks = ClipColors(blue_eyed).checks(image, [RED])
    assert checks["color_0"] is False and checks["no_extra"] is False
    assert blue_eyed.text_calls[0][0] == "a photo of a red circle"
    assert all(ClipColors(FakeClip([[0.2, 1.0]])).checks(image, [RED]).values())


# -- the setting -----------------------------------------------------------------------------------

def test_clip_setting_parses_arch_equals_checkpoint(tmp_path):
    ckpt = tmp_path / "clip.pt"
    ckpt.write_bytes(b"")
    assert parse_clip(f"ViT-L-14={ckpt}") == ClipSetting("ViT-L-14", ckpt.resolve())
    assert "CLIP ViT-L-14" in str(parse_clip(f"ViT-L-14={ckpt}"))
    with pytest.raises(ValueError, match="ARCH=CHECKPOINT"):
        parse_clip(str(ckpt))
    with pytest.raises(FileNotFoundError, match="missing.pt is not a file"):
        parse_clip(f"ViT-L-14={tmp_path / 'missing.pt'}")
    bench = configured(BENCHMARKS.get("geneval"), {"clip": f"ViT-L-14={ckpt}"})
    assert "colours by CLIP ViT-L-14" in bench.title and configured(BENCHMARKS.get("geneval"), {}).title == \
        BENCHMARKS.get("geneval").title
    with pytest.raises(ValueError, match="'screenspot_v2' takes no --clip"):
        configured(BENCHMARKS.get("screenspot_v2"), {"clip": f"ViT-L-14={ckpt}"})


# -- end to end on a tiny random CLIP ----------------------------------------------------------------

@pytest.mark.slow
@needs_open_clip
def test_the_geneval_clip_variant_scores_with_the_loaded_clip(tiny_clip):
    from mmrl.rewards import model_scorers

    name, ckpt = tiny_clip
    specs = [[RED], [BLUE2], [RED, BLUE2], [{**RED, "position": "left"}]]
    images = [render(s, i) for i, s in enumerate(specs)]
    pairs = [({"spec": s}, im) for s, im in zip(specs, images)]
    bench = configured(BENCHMARKS.get("geneval"), {"clip": f"{name}={ckpt}"})

    def table():
        return {r["cell"]: r for r in benchmark_table(bench, None, [p[1] for p in pairs], [p[0] for p in pairs])}

    rows = table()
    assert {c: r["n"] for c, r in rows.items()} == {"counting": 1, "colors": 1, "position": 1, "color_attr": 1,
                                                    "overall": 4}
    assert 0.0 <= rows["overall"]["accuracy"] <= 1.0
    # the table's verdicts are the checks of the judge over the loaded model, image by image
    judge = clip_colors(parse_clip(f"{name}={ckpt}"))
    assert isinstance(judge.clip, model_scorers.ClipModel)
    for (ex, image), cell in zip(pairs, ("colors", "counting", "color_attr", "position")):
        assert rows[cell]["accuracy"] == float(all(judge.checks(image, ex["spec"]).values()))
    assert set(judge.colors(images[0], detect_objects(images[0], masks=True))) <= set(GENEVAL_COLORS)
    model_scorers.clear_cache()  # a fresh load gives the same table
    clip_colors.cache_clear()
    assert table() == rows


@pytest.mark.slow
@needs_open_clip
def test_mmrl_eval_benchmark_geneval_with_clip(tiny_clip, tmp_path):
    from typer.testing import CliRunner

    from mmrl.cli import app

    name, ckpt = tiny_clip
    res = CliRunner().invoke(app, ["eval", "diffusion/composition_tiny", "--benchmark", "geneval", "--clip",
                                   f"{name}={ckpt}", "--num-examples", "2", "--gallery", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "g" / "benchmark_geneval.json").read_text())
    assert f"colours by CLIP {name}" in report["title"]
    assert report["settings"] == {"clip": f"{name}={ckpt}"}
    overall = {r["cell"]: r for r in report["rows"]}["overall"]
    assert overall["n"] == 2 and 0.0 <= overall["accuracy"] <= 1.0


@pytest.mark.slow
def test_the_command_line_rejects_a_bad_clip(tmp_path):
    from typer.testing import CliRunner

    from mmrl.cli import app

    def run(*args):
        return CliRunner().invoke(app, ["eval", "diffusion/composition_tiny", *args])

    bad = run("--benchmark", "geneval", "--clip", "ViT-L-14")
    assert bad.exit_code == 2 and "ARCH=CHECKPOINT" in bad.output
    missing = run("--benchmark", "geneval", "--clip", f"ViT-L-14={tmp_path / 'missing.pt'}")
    assert missing.exit_code == 2 and "missing.pt is not a file" in missing.output
    (tmp_path / "clip.pt").write_bytes(b"")
    alone = run("--clip", f"ViT-L-14={tmp_path / 'clip.pt'}")
    assert alone.exit_code == 2 and "--clip is a setting of a benchmark" in alone.output
