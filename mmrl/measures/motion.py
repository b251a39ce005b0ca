"""A programmatic motion checker for the synthetic clips of :mod:`mmrl.data.motion_t2v`.

GenEval ("GenEval: An Object-Focused Framework for Evaluating Text-to-Image Alignment", Ghosh et
al., 2023) checks a generated image by detecting its objects; here the same per-image detector
(:func:`mmrl.measures.composition.detect_objects`) runs on every frame and the object of the
prompt's colour is tracked over time, so "a red circle moving left" is checked for colour, shape
and the direction of its motion. VBench ("VBench: Comprehensive Benchmark Suite for Video
Generative Models", Huang et al., 2024) scores motion ("motion smoothness", "dynamic degree") with
learned optical-flow and frame-interpolation models; these scenes are flat palette shapes, so the
tracker is programmatic (no weights) and its centroid displacement is exact.

Used by the ``motion`` rewards (``rewards/motion.py``) and the ``motion_t2v`` / ``motion_i2v`` tasks'
metrics and galleries (:func:`motion_metrics`, :func:`motion_strip`).
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np
from PIL import Image

from mmrl.data.motion_t2v import DIRECTIONS, validate_motion_spec
from mmrl.measures.composition import detect_objects
from mmrl.media.draw import FOOTER, PRED, TRUE, draw_label, frame_strip

CHECKS = ("color", "shape", "direction", "steady")
STRIP_SCALE = 6  # a 16-px frame -> 96 px
STRIP_FRAMES = 8
GIVEN = (0, 90, 255)  # the border of a frame the generator was given (image-to-video)


def as_frames(clip: Any) -> list[Image.Image]:
    """A clip as a list of RGB PIL frames: a list of PIL images (or HWC uint8 arrays), one PIL
    image (a 1-frame clip), or a torch/numpy array ``(F, 3, H, W)`` (a single ``(3, H, W)`` frame
    too), float in [0, 1] or uint8. ValueError for anything else."""
    if isinstance(clip, Image.Image):
        return [clip.convert("RGB")]
    if isinstance(clip, (list, tuple)):
        frames = []
        for frame in clip:
            if isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3:
                frames.append(Image.fromarray(frame, "RGB"))  # HWC, as PIL hands out
            elif isinstance(frame, Image.Image) or hasattr(frame, "shape"):
                frames += as_frames(frame)
            else:
                _refuse(frame)
        return frames
    if hasattr(clip, "detach"):  # a torch tensor, without importing torch here (bf16 has no numpy dtype)
        clip = clip.detach().cpu()
        clip = (clip if str(clip.dtype) == "torch.uint8" else clip.float()).numpy()
    if isinstance(clip, np.ndarray) and clip.ndim in (3, 4) and clip.shape[-3] == 3:
        array = clip[None] if clip.ndim == 3 else clip
        if array.dtype != np.uint8:  # [0, 1] floats, rounded as the diffusion policy's to_pil
            array = np.round(np.clip(array.astype(np.float32), 0, 1) * 255).astype(np.uint8)
        return [Image.fromarray(np.ascontiguousarray(f.transpose(1, 2, 0)), "RGB") for f in array]
    return _refuse(clip)


def _refuse(clip: Any) -> NoReturn:
    shape = getattr(clip, "shape", None)
    raise ValueError(f"a clip is a list of PIL frames or an (F, 3, H, W) array; got {type(clip).__name__}"
                     + (f" of shape {tuple(shape)}" if shape is not None else ""))


def track_object(frames: Any, color: str, min_area: float | None = None) -> list[dict | None]:
    """Per frame, the largest detected object of ``color`` (a :func:`detect_objects` dict with
    ``cx``, ``cy``, ``shape``, ``area``, ``box``), or None where there is none."""
    out = []
    for frame in as_frames(frames):
        mine = [o for o in detect_objects(frame, min_area) if o["color"] == color]
        out.append(max(mine, key=lambda o: o["area"]) if mine else None)
    return out


def motion_checks(frames: Any, spec: dict, min_area: float | None = None,
                  min_shift: float | None = None) -> dict[str, bool]:
    """The spec's checks on a clip (``{"color", "shape", "direction"}`` spec):

    - ``color``: an object of the spec's colour in every frame;
    - ``shape``: it has the spec's shape in more than half of the frames where it is found;
    - ``direction``: it is found in the first and the last frame (and >= 2 frames), and its centroid
      moved between them at least ``min_shift`` px (default width / 8: 2 px at 16 px) along the
      spec's direction and at most half that much along the other axis (y grows downward: "up"
      is a negative dy);
    - ``steady``: it is found in >= 2 frames and never steps backwards: between consecutive frames
      where it is found, the shift along the spec's direction is >= 0 (a still object is steady,
      and fails ``direction``)."""
    validate_motion_spec(spec)
    frames = as_frames(frames)
    track = track_object(frames, spec["color"], min_area)
    found = [i for i, o in enumerate(track) if o is not None]
    ux, uy = DIRECTIONS[spec["direction"]]
    if min_shift is None:
        min_shift = frames[0].size[0] / 8 if frames else 0.0

    def along(a: dict, b: dict) -> tuple[float, float]:  # (shift along the direction, across it)
        dx, dy = b["cx"] - a["cx"], b["cy"] - a["cy"]
        return dx * ux + dy * uy, abs(dx * uy) + abs(dy * ux)

    direction = len(found) >= 2 and found[0] == 0 and found[-1] == len(frames) - 1
    if direction:
        forward, across = along(track[found[0]], track[found[-1]])
        direction = forward >= min_shift and across <= forward / 2
    steps = [along(track[i], track[j])[0] for i, j in zip(found, found[1:])]
    return {
        "color": bool(frames) and len(found) == len(frames),
        "shape": 2 * sum(track[i]["shape"] == spec["shape"] for i in found) > len(found),
        "direction": bool(direction),
        "steady": bool(steps) and all(s >= -1e-9 for s in steps),
    }


def motion_score(frames: Any, spec: dict, min_area: float | None = None, min_shift: float | None = None) -> float:
    """The fraction of :func:`motion_checks` passed, in [0, 1] (strict: all of them passed)."""
    checks = motion_checks(frames, spec, min_area, min_shift)
    return sum(checks.values()) / len(checks)


def checks_or_failed(completion: Any, spec: dict) -> dict[str, bool]:
    """:func:`motion_checks` of one completion; all failed for one that is not a clip or an image."""
    try:
        return motion_checks(completion, spec)
    except ValueError:
        return dict.fromkeys(CHECKS, False)


def motion_metrics(completions: Any, specs: list[dict]) -> dict[str, float]:
    """A motion task's metrics: ``motion_accuracy`` (every check passed) and each check's pass rate."""
    results = [checks_or_failed(c, spec) for c, spec in zip(completions, specs)]
    out = {"motion_accuracy": float(np.mean([all(r.values()) for r in results])) if results else 0.0}
    out.update({f"check/{k}": float(np.mean([r[k] for r in results])) if results else 0.0 for k in CHECKS})
    return out


def motion_strip(completion: Any, spec: dict, label: str, given_first: bool = False) -> Image.Image | None:
    """A clip's gallery picture: its frames side by side, the tracked centroids as dots joined by a
    line (green when the direction check passes, red otherwise), ``label`` below; with
    ``given_first`` the first frame (the one an image-to-video model was given) framed in blue and
    marked "given". None for a completion that is not a clip."""
    try:
        frames = as_frames(completion)
    except ValueError:
        return None
    if not frames:
        return None
    ok = checks_or_failed(frames, spec)["direction"]
    if len(frames) > STRIP_FRAMES:  # the frames a strip shows, tracked on those (the given first one stays first)
        frames = [frames[round(i * (len(frames) - 1) / (STRIP_FRAMES - 1))] for i in range(STRIP_FRAMES)]
    image, draw = frame_strip(frames, scale=STRIP_SCALE, max_frames=STRIP_FRAMES, footer=FOOTER)
    side = frames[0].size[0] * STRIP_SCALE
    pitch = side + 2  # frame_strip's frame width plus its 2-px gap
    points = [(i * pitch + o["cx"] * STRIP_SCALE, o["cy"] * STRIP_SCALE)
              for i, o in enumerate(track_object(frames, spec["color"])) if o is not None]
    color = TRUE if ok else PRED
    if len(points) > 1:
        draw.line(points, fill=color, width=2)
    for x, y in points:
        draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color, outline=(0, 0, 0))
    if given_first:
        height = frames[0].size[1] * STRIP_SCALE
        draw.rectangle([0, 0, side - 1, height - 1], outline=GIVEN, width=3)
        draw.rectangle([3, 3, 41, 14], fill=GIVEN)
        draw.text((6, 3), "given", fill=(255, 255, 255))
    draw_label(draw, label)
    return image
