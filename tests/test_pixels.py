"""Images decoded as the model's own library decodes them (mmrl/media/pixels.py): transparency on
white, as transformers' convert_to_rgb and qwen-vl-utils' to_rgb; 16-bit grey scaled, not clipped.
Real PNG files written here, every expected pixel worked out by hand."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
from PIL import Image

from mmrl.data.images import load_image, open_image
from mmrl.media import pixels
from mmrl.media.pixels import to_rgb
from mmrl.media.video import Clip


def _rgba_png(path):
    # half-transparent orange, fully transparent black, opaque dark blue
    Image.fromarray(np.array([[[200, 100, 0, 128], [0, 0, 0, 0], [10, 20, 30, 255]]], np.uint8)).save(path)
    return path


# c * a/255 + 255 * (1 - a/255), a = 128: 200 -> 100.4 + 127 = 227, 100 -> 50.2 + 127 = 177, 0 -> 127;
# a = 0: white; a = 255: the colour itself
RGBA_ON_WHITE = [[[227, 177, 127], [255, 255, 255], [10, 20, 30]]]


def _la_png(path):
    im = Image.new("LA", (3, 1))
    im.putdata([(50, 0), (50, 255), (100, 51)])  # 100 * 0.2 + 255 * 0.8 = 20 + 204 = 224
    im.save(path)
    return path


LA_ON_WHITE = [[[255] * 3, [50] * 3, [224] * 3]]


def _palette_trns_png(path):
    im = Image.new("P", (2, 1))
    im.putpalette([255, 0, 0, 0, 0, 255])  # index 0 red (transparent by tRNS), index 1 blue
    im.putdata([0, 1])
    im.save(path, transparency=0)
    return path


PALETTE_ON_WHITE = [[[255, 255, 255], [0, 0, 255]]]


def test_transparent_pngs_are_composited_on_white(tmp_path):
    for make, expected, mode in ((_rgba_png, RGBA_ON_WHITE, "RGBA"), (_la_png, LA_ON_WHITE, "LA"),
                                 (_palette_trns_png, PALETTE_ON_WHITE, "P")):
        path = make(tmp_path / f"{mode}.png")
        with Image.open(path) as im:
            assert im.mode == mode
        image = load_image(path)
        assert image.mode == "RGB" and np.asarray(image).tolist() == expected, mode
        # the same pixels whichever way a record gives the image: a path, bytes, a PIL image
        assert np.asarray(open_image(path.name, tmp_path)[0]).tolist() == expected
        assert np.asarray(open_image({"bytes": path.read_bytes()}, tmp_path)[0]).tolist() == expected
        assert np.asarray(open_image(Image.open(path), tmp_path)[0]).tolist() == expected
    # what PIL's bare convert gives: black (or the palette's red) where the file is transparent
    assert np.asarray(Image.open(tmp_path / "RGBA.png").convert("RGB"))[0, 1].tolist() == [0, 0, 0]
    assert np.asarray(Image.open(tmp_path / "P.png").convert("RGB"))[0, 0].tolist() == [255, 0, 0]


def test_video_frames_are_converted_the_same_way(tmp_path):
    path = _la_png(tmp_path / "la.png")
    from mmrl.media.video import _rgb_array

    assert _rgb_array(path).tolist() == LA_ON_WHITE and _rgb_array(Image.open(path)).tolist() == LA_ON_WHITE
    clip = Clip.from_images([Image.new("LA", (56, 56), (0, 0)), Image.new("LA", (56, 56), (0, 0))],
                            max_pixels=56 * 56, min_pixels=56 * 56)
    assert clip.frames.min() == 255  # fully transparent grey frames are white, as qwen-vl-utils' RGBA frames


def test_an_rgb_image_is_returned_as_it_is():
    image = Image.new("RGB", (4, 4), (1, 2, 3))
    assert to_rgb(image) is image


def test_parity_with_transformers_convert_to_rgb(tmp_path):
    image_transforms = pytest.importorskip("transformers.image_transforms")
    for make in (_rgba_png, _la_png, _palette_trns_png):
        path = make(tmp_path / f"{make.__name__}.png")
        theirs = image_transforms.convert_to_rgb(Image.open(path), return_numpy=True)
        assert np.array_equal(np.asarray(load_image(path)), theirs), make.__name__
    grey = Image.new("L", (3, 2), 77)
    assert np.array_equal(np.asarray(to_rgb(grey)), image_transforms.convert_to_rgb(grey, return_numpy=True))


def test_parity_with_qwen_vl_utils_to_rgb(tmp_path):
    try:
        from qwen_vl_utils.vision_process import to_rgb as qwen_to_rgb
    except ImportError as exc:  # qwen-vl-utils imports torchvision at import time
        pytest.skip(f"qwen_vl_utils does not import here: {exc}")
    path = _rgba_png(tmp_path / "rgba.png")  # qwen-vl-utils composites RGBA only (paste with the alpha as mask)
    ours, theirs = np.asarray(load_image(path), np.int16), np.asarray(qwen_to_rgb(Image.open(path)), np.int16)
    assert np.abs(ours - theirs).max() <= 1  # paste and alpha_composite round differently by at most 1


def test_16bit_grey_png_is_scaled_not_clipped(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(pixels, "_warned_16bit", False)
    path = tmp_path / "depth.png"
    Image.fromarray(np.array([[0, 255, 256, 1000, 32768, 65535]], np.uint16)).save(path)
    with Image.open(path) as im:
        assert im.mode == "I;16"
        # PIL (hence transformers and qwen-vl-utils, which convert through it) clips at 255
        assert np.asarray(im.convert("RGB"))[0, :, 0].tolist() == [0, 255, 255, 255, 255, 255]
    with caplog.at_level(logging.WARNING):
        image = load_image(path)
        load_image(path)
    # value >> 8: 255 -> 0, 256 -> 1, 1000 -> 3 (1000 / 256 = 3.9), 32768 -> 128, 65535 -> 255
    assert image.mode == "RGB" and np.asarray(image)[0, :, 0].tolist() == [0, 0, 1, 3, 128, 255]
    assert np.asarray(image)[0, 4].tolist() == [128, 128, 128]
    warnings = [r.getMessage() for r in caplog.records if "16-bit" in r.getMessage()]
    assert len(warnings) == 1 and str(path) in warnings[0] and "qwen-vl-utils" in warnings[0]
    # mode I (32-bit, as older Pillow opens 16-bit PNGs): the same scale, values outside 0-65535 clipped
    wide = Image.fromarray(np.array([[-5, 512, 70000]], np.int32))
    assert wide.mode == "I" and np.asarray(to_rgb(wide))[0, :, 0].tolist() == [0, 2, 255]


def test_16bit_png_bytes_in_a_record(tmp_path):
    buffer = io.BytesIO()
    Image.fromarray(np.full((2, 2), 512, np.uint16)).save(buffer, format="PNG")
    image, path = open_image(buffer.getvalue(), tmp_path)
    assert path is None and np.asarray(image).tolist() == [[[2, 2, 2]] * 2] * 2
