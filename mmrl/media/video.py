"""Video clips read and sampled the way Qwen-VL models are fed them.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL see clips prepared by qwen-vl-utils' ``process_vision_info``: an
even number of frames at ``fps`` (2 a second, within [4, 768]) spread evenly over the (optionally
trimmed) video, each resized to multiples of 28 pixels within a per-frame budget that shrinks as the
clip grows. A policy trained on clips sampled any other way sees inputs it is not served, so the
rules here are qwen-vl-utils' own (``tests/test_video_reader.py`` checks parity with it); only the
decoders differ (decord, else PyAV). The defaults are those of patch 14 / merge 2 (factor 28):
Qwen3-VL (patch 16, factor 32) passes ``factor`` and its own pixel budgets.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from .pixels import to_rgb

log = logging.getLogger(__name__)

FPS = 2.0
FRAME_FACTOR = 2
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
_VIDEO_MIN_TOKENS, _VIDEO_MAX_TOKENS = 128, 768  # qwen-vl-utils' VIDEO_{MIN,MAX}_TOKEN_NUM
VIDEO_MIN_PIXELS = _VIDEO_MIN_TOKENS * 28 * 28
VIDEO_MAX_PIXELS = _VIDEO_MAX_TOKENS * 28 * 28
VIDEO_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)  # qwen-vl-utils' MODEL_SEQ_LEN budget across frames

BACKENDS = ("decord", "pyav")
_INSTALL = 'pip install -e ".[video]"'


class VideoReadError(ValueError):
    """A video that is missing, cannot be decoded or has too few frames; the message names it."""


@dataclass
class Clip:
    """Frames sampled from a video, with where they came from (see :func:`read_video`)."""

    frames: torch.Tensor  # uint8 [T, C, H, W], RGB, resized to the pixel budget
    timestamps: list[float]  # seconds in the source of each frame
    sample_fps: float  # nframes / total_frames * source_fps (Qwen2.5-VL's second_per_grid_ts source)
    indices: list[int]  # source frame indices sampled
    source_fps: float
    duration: float  # seconds of the (possibly trimmed) source
    backend: str = ""  # the decoder that read it ("images" for frame lists)

    def images(self) -> list:
        """The frames as PIL images (for galleries)."""
        from PIL import Image

        return [Image.fromarray(f.permute(1, 2, 0).numpy()) for f in self.frames]

    @classmethod
    def from_images(cls, images: Sequence[Any], fps: float = FPS, min_pixels: int = VIDEO_MIN_PIXELS,
                    max_pixels: int = VIDEO_MAX_PIXELS, total_pixels: int = VIDEO_TOTAL_PIXELS,
                    factor: int = 28) -> "Clip":
        """The frames of a clip at ``fps`` (PIL images, HWC uint8 arrays or image paths), all kept,
        padded to a multiple of FRAME_FACTOR by repeating the last one (qwen-vl-utils' list input)
        and resized to the budget of the first frame's size."""
        arrays = [_rgb_array(im) for im in images]
        if not arrays:
            raise VideoReadError("a clip needs at least one frame; the list of frames is empty")
        n = len(arrays)
        arrays += [arrays[-1]] * (_ceil_by(n, FRAME_FACTOR) - n)
        size = frame_size(*arrays[0].shape[:2], len(arrays), min_pixels, max_pixels, total_pixels, factor)
        indices = list(range(len(arrays)))  # qwen-vl-utils' frames_indices for lists, padding included
        return cls(_resize_arrays(arrays, size), [i / fps for i in indices], float(fps), indices,
                   float(fps), n / fps, "images")


def _round_by(x: float, k: int) -> int:
    return round(x / k) * k


def _ceil_by(x: float, k: int) -> int:
    return math.ceil(x / k) * k


def _floor_by(x: float, k: int) -> int:
    return math.floor(x / k) * k


def frame_range(total_frames: int, source_fps: float, video_start: Optional[float] = None,
                video_end: Optional[float] = None) -> tuple[int, int, int]:
    """(first, last, count) of the source frames within [video_start, video_end] seconds
    (qwen-vl-utils' ``calculate_video_frame_range``: start rounded up, end down)."""
    if source_fps <= 0:
        raise ValueError(f"the video's fps must be positive, got {source_fps}")
    if total_frames <= 0:
        raise ValueError(f"the video has no frames ({total_frames})")
    if video_start is None and video_end is None:
        return 0, total_frames - 1, total_frames
    length = total_frames / source_fps
    start = math.ceil(max(0.0, min(video_start, length)) * source_fps) if video_start is not None else 0
    end = total_frames - 1
    if video_end is not None:
        end = min(math.floor(max(0.0, min(video_end, length)) * source_fps), total_frames - 1)
    if start >= end:
        raise ValueError(f"video_start={video_start} .. video_end={video_end} leaves no frames (start frame "
                         f"{start} >= end frame {end}; {total_frames} frames at {source_fps:g} fps)")
    return start, end, end - start + 1


def frame_count(total_frames: int, source_fps: float, fps: Optional[float] = FPS, nframes: Optional[int] = None,
                min_frames: int = FPS_MIN_FRAMES, max_frames: int = FPS_MAX_FRAMES) -> int:
    """How many frames to sample (qwen-vl-utils' ``smart_nframes``): ``nframes`` rounded to even, else
    ``total_frames / source_fps * fps`` clamped to [min_frames, max_frames] and the video, floored to even."""
    if nframes is not None:
        n = _round_by(nframes, FRAME_FACTOR)
    else:
        lo, hi = _ceil_by(min_frames, FRAME_FACTOR), _floor_by(max_frames, FRAME_FACTOR)
        wanted = total_frames / source_fps * (FPS if fps is None else fps)
        n = _floor_by(min(max(wanted, lo), hi, total_frames), FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total_frames:
        raise ValueError(f"cannot sample {n} frames from {total_frames} (Qwen-VL needs an even count "
                         f"from {FRAME_FACTOR} up to the video's frame count)")
    return n


def sample_frame_indices(total_frames: int, source_fps: float, fps: Optional[float] = FPS,
                         nframes: Optional[int] = None, min_frames: int = FPS_MIN_FRAMES,
                         max_frames: int = FPS_MAX_FRAMES, video_start: Optional[float] = None,
                         video_end: Optional[float] = None) -> list[int]:
    """Source frame indices to sample, evenly spaced over the trimmed range:
    ``torch.linspace(first, last, frame_count(...)).round()``, as qwen-vl-utils' decord reader."""
    start, end, total = frame_range(total_frames, source_fps, video_start, video_end)
    n = frame_count(total, source_fps, fps, nframes, min_frames, max_frames)
    return torch.linspace(start, end, n).round().long().tolist()


@functools.cache
def _smart_resize() -> Callable:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    return smart_resize


def frame_size(height: int, width: int, nframes: int, min_pixels: int = VIDEO_MIN_PIXELS,
               max_pixels: int = VIDEO_MAX_PIXELS, total_pixels: int = VIDEO_TOTAL_PIXELS,
               factor: int = 28) -> tuple[int, int]:
    """(height, width) of each of ``nframes`` frames: fetch_video's budget, per frame at most
    ``total_pixels / nframes * FRAME_FACTOR`` (capped at 768 tokens, at least 1.05 min_pixels) and at
    most ``max_pixels``, then transformers' ``smart_resize`` (multiples of ``factor``, aspect kept)."""
    cap = _VIDEO_MAX_TOKENS * factor * factor
    budget = max(min(cap, total_pixels / nframes * FRAME_FACTOR), int(min_pixels * 1.05))
    return _smart_resize()(height, width, factor=factor, min_pixels=min_pixels, max_pixels=min(max_pixels, budget))


def _resize(video: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [T, C, H, W] resized as qwen-vl-utils does (bicubic, antialiased), still uint8."""
    try:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F
    except ImportError as exc:
        raise ImportError(f"reading video needs torchvision: {_INSTALL}") from exc
    out = F.resize(video, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
    return out if out.dtype == torch.uint8 else out.round().clamp(0, 255).to(torch.uint8)


def _resize_arrays(arrays: list[np.ndarray], size: tuple[int, int]) -> torch.Tensor:
    if all(a.shape == arrays[0].shape for a in arrays):
        return _resize(torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2), size)
    return torch.cat([_resize(torch.from_numpy(a).permute(2, 0, 1)[None], size) for a in arrays])


def _rgb_array(image: Any) -> np.ndarray:
    """HWC uint8 RGB of a PIL image (converted by :func:`mmrl.media.pixels.to_rgb`: transparency on
    white, as transformers and qwen-vl-utils), an array or an image path."""
    from PIL import Image

    if isinstance(image, (str, Path)):
        try:
            with Image.open(image) as im:
                im.load()
                return _rgb_array(im)
        except OSError as exc:
            raise VideoReadError(f"cannot open frame image {image}: {exc}") from exc
    if isinstance(image, Image.Image):
        return np.array(to_rgb(image))
    array = np.array(image)  # a writable copy, for torch.from_numpy
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"a frame array must be uint8 [H, W, 3] RGB, got {array.dtype} {list(array.shape)}")
    return array


@functools.cache
def _importable(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def video_backends() -> list[str]:
    """The decoders that import here, in the order "auto" tries them."""
    return [name for name, module in (("decord", "decord"), ("pyav", "av")) if _importable(module)]


def _read_decord(path: Path, sample: Callable) -> tuple[np.ndarray, list[int], int, float]:
    import decord

    reader = decord.VideoReader(str(path))
    total, fps = len(reader), float(reader.get_avg_fps())
    indices = sample(total, fps)
    return reader.get_batch(indices).asnumpy(), indices, total, fps


def _read_pyav(path: Path, sample: Callable) -> tuple[np.ndarray, list[int], int, float]:
    import av

    with av.open(str(path)) as container:
        if not container.streams.video:
            raise VideoReadError(f"{path} has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        total = stream.frames or sum(1 for p in container.demux(stream) if p.size)
        indices = sample(total, fps)
        if not stream.frames:
            container.seek(0)
        wanted, last, got = set(indices), max(indices), {}
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                got[i] = frame.to_ndarray(format="rgb24")
            if i >= last:
                break
    if not got:
        raise VideoReadError(f"{path}: no frame could be decoded")
    if len(got) < len(wanted):  # the header promised more frames than decode: repeat the last one
        log.warning("%s: %d of %d sampled frames missing; repeating the last decoded one", path,
                    len(wanted) - len(got), len(wanted))
    kept = [got[i] if i in got else got[max(k for k in got if k <= i)] for i in indices]
    return np.stack(kept), indices, total, fps


_DECODERS = {"decord": _read_decord, "pyav": _read_pyav}


def _decoders(backend: str) -> list[str]:
    """The decoders to try in order: decord falls back to PyAV (as qwen-vl-utils' to torchvision)."""
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"backend={backend!r}: use one of auto, {', '.join(BACKENDS)}")
    available = video_backends()
    if backend != "auto" and backend not in available:
        raise ImportError(f"video backend {backend!r} does not import here: {_INSTALL}")
    order = [b for b in {"auto": BACKENDS, "decord": BACKENDS, "pyav": ("pyav",)}[backend] if b in available]
    if not order:
        raise ImportError(f"reading video needs decord or PyAV: {_INSTALL}")
    return order


# (decoder, path) -> its error, for files a decoder could not read: a clip read again (every epoch,
# every eval) goes straight to the next decoder, and the fallback is warned once per file.
_FAILED: dict[tuple[str, str], str] = {}


def _decode(path: Path, backend: str, sample: Callable) -> tuple[str, tuple]:
    errors, names = [], _decoders(backend)
    for k, name in enumerate(names):
        known = _FAILED.get((name, str(path)))
        if known is not None and k + 1 < len(names):
            errors.append(known)
            continue
        try:
            return name, _DECODERS[name](path, sample)
        except VideoReadError:
            raise
        except Exception as exc:  # decoders raise many types for bad files
            errors.append(f"{name}: {type(exc).__name__}: {str(exc).strip()[:200]}")
            if k + 1 < len(names):
                _FAILED[(name, str(path))] = errors[-1]
                log.warning("%s: %s cannot decode it (%s); trying %s (for this file from now on)",
                            path, name, exc, names[k + 1])
    raise VideoReadError(f"cannot decode video {path} ({'; '.join(errors)}); check that it plays "
                         f"(ffprobe {path}), re-encode it (ffmpeg -i IN -c:v libx264 OUT.mp4) or drop it")


def _local_path(source: Any) -> Path:
    text = str(source)
    return Path(text[7:] if text.startswith("file://") else text).expanduser()


def _frame_files(folder: Path) -> list[Path]:
    """The image files of a folder of frames, sorted by name."""
    from mmrl.data.images import IMAGE_EXTENSIONS

    files = sorted(p for p in folder.iterdir()
                   if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() and not p.name.startswith("."))
    if not files:
        raise VideoReadError(f"{folder} holds no frame images ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def read_video(source: Any, fps: Optional[float] = FPS, nframes: Optional[int] = None,
               min_frames: int = FPS_MIN_FRAMES, max_frames: int = FPS_MAX_FRAMES,
               min_pixels: int = VIDEO_MIN_PIXELS, max_pixels: int = VIDEO_MAX_PIXELS,
               total_pixels: int = VIDEO_TOTAL_PIXELS, video_start: Optional[float] = None,
               video_end: Optional[float] = None, backend: str = "auto", factor: int = 28) -> Clip:
    """A :class:`Clip` of a video file (frames sampled by :func:`sample_frame_indices`), of a folder
    of frame images (sorted by name) or of a list of frames (images or paths); frames of folders and
    lists are all kept, at ``fps`` (qwen-vl-utils' list input: ``nframes``, ``min/max_frames`` and
    ``video_start/end`` do not apply). ``backend``: "auto" (decord, else PyAV), "decord" (falls back
    to PyAV on a file it cannot read) or "pyav". Raises :class:`VideoReadError` naming the path."""
    budget = dict(min_pixels=min_pixels, max_pixels=max_pixels, total_pixels=total_pixels, factor=factor)
    if isinstance(source, (list, tuple)):
        return Clip.from_images(source, fps=FPS if fps is None else fps, **budget)
    path = _local_path(source)
    if not path.exists():
        raise VideoReadError(f"no video file {path}; check the path (relative paths start at image_root)")
    if path.is_dir():
        return Clip.from_images(_frame_files(path), fps=FPS if fps is None else fps, **budget)
    if path.stat().st_size == 0:
        raise VideoReadError(f"video {path} is empty (0 bytes); re-copy it or drop it")

    def sample(total: int, source_fps: float) -> list[int]:
        try:
            return sample_frame_indices(total, source_fps, fps, nframes, min_frames, max_frames,
                                        video_start, video_end)
        except ValueError as exc:
            raise VideoReadError(f"video {path} ({total} frames at {source_fps:g} fps): {exc}") from exc

    name, (array, indices, total, source_fps) = _decode(path, backend, sample)
    count = frame_range(total, source_fps, video_start, video_end)[2]
    video = torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2)
    frames = _resize(video, frame_size(video.shape[2], video.shape[3], len(indices), **budget))
    return Clip(frames, [i / source_fps for i in indices], len(indices) / max(count, 1e-6) * source_fps,
                indices, source_fps, count / source_fps, name)
