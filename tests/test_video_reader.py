"""Video clips sampled as qwen-vl-utils samples them: frame indices, frame sizes, the frames themselves,
frame folders and lists, unreadable files, and videos in data files (FileExamples).

Every clip is written here with PyAV (no downloads): frame i is filled with ``PALETTE[i]``, so which
source frame a decoded frame is can be read back from its colour, and carries a black-and-white
checkerboard in its lower right quarter, so resizing (bicubic, antialiased) shows in the pixels."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.data.records import FileExamples
from mmrl.media import video as V
from mmrl.media.video import Clip, VideoReadError, frame_size, read_video, sample_frame_indices

av = pytest.importorskip("av")
pytest.importorskip("torchvision")

PALETTE = [(8 * i, 255 - 8 * i, (37 * i) % 256) for i in range(40)]  # frame i's colour


def frame_image(i, size=(64, 48)) -> np.ndarray:
    """Frame i: PALETTE[i] with a checkerboard of 4-pixel squares in the lower right quarter."""
    w, h = size
    image = np.full((h, w, 3), PALETTE[i], np.uint8)
    ys, xs = np.mgrid[h // 2:h, w // 2:w]
    image[h // 2:, w // 2:] = (((ys // 4 + xs // 4) % 2) * 255)[..., None]
    return image


def write_clip(path, frames=30, fps=10, size=(64, 48)):
    """An H.264 mp4 of ``frames`` frames at ``fps``, frame i filled with PALETTE[i]."""
    w, h = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": "0"}
        for i in range(frames):
            image = frame_image(i, size)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def frame_ids(frames: torch.Tensor) -> list[int]:
    """The palette index nearest to the mean colour of each frame's upper left (H.264's YUV round trip
    moves it a few levels)."""
    h, w = frames.shape[2:]
    means = frames[:, :, : h // 3, : w // 3].float().mean(dim=(2, 3))
    return torch.cdist(means, torch.tensor(PALETTE, dtype=torch.float)).argmin(dim=1).tolist()


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("clips") / "a.mp4")


def backend_param(name):
    module = {"decord": "decord", "pyav": "av"}[name]
    try:
        __import__(module)
        return pytest.param(name)
    except ImportError:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"{module} does not import here"))


BACKENDS = [backend_param("decord"), backend_param("pyav")]


# -- hand-worked cases ---------------------------------------------------------------------------

def test_hand_computed_indices_and_size():
    # 30 frames at 10 fps = 3 s; at fps 2: 3 * 2 = 6 frames (within [4, 30], even);
    # linspace(0, 29, 6) = 0, 5.8, 11.6, 17.4, 23.2, 29 -> rounded 0, 6, 12, 17, 23, 29.
    assert sample_frame_indices(30, 10.0, fps=2) == [0, 6, 12, 17, 23, 29]
    # fps 1: 3 frames, raised to min_frames 4; linspace(0, 29, 4) = 0, 9.67, 19.33, 29.
    assert sample_frame_indices(30, 10.0, fps=1) == [0, 10, 19, 29]
    # nframes 9 rounds to an even count as Python rounds: round(9 / 2) * 2 = round(4.5) * 2 = 8;
    # linspace(0, 29, 8) = 0, 4.14, 8.29, 12.43, 16.57, 20.71, 24.86, 29.
    assert sample_frame_indices(30, 10.0, nframes=9) == [0, 4, 8, 12, 17, 21, 25, 29]
    # 0.5 s .. 2.5 s: frames ceil(5) = 5 .. floor(25) = 25, 21 frames = 2.1 s -> 4.2 -> 4;
    # linspace(5, 25, 4) = 5, 11.67, 18.33, 25.
    assert sample_frame_indices(30, 10.0, video_start=0.5, video_end=2.5) == [5, 12, 18, 25]
    # 48 x 64, 6 frames: budget min(768 * 784, total / 6 * 2) = 602112 per frame; rounded to 28s
    # 56 x 56 = 3136 < min_pixels 100352, so scaled up by sqrt(100352 / 3072) = 5.7155:
    # ceil(48 * 5.7155 / 28) * 28 = 10 * 28 = 280, ceil(64 * 5.7155 / 28) * 28 = 14 * 28 = 392.
    assert frame_size(48, 64, 6) == (280, 392)
    # 1080 x 1920, 768 frames: total 90316800 / 768 * 2 = 235200 per frame;
    # beta = sqrt(1080 * 1920 / 235200) = 2.9692, floor(1080 / 2.9692 / 28) * 28 = 12 * 28 = 336,
    # floor(1920 / 2.9692 / 28) * 28 = 23 * 28 = 644.
    assert frame_size(1080, 1920, 768) == (336, 644)


def test_too_short_or_empty_ranges_raise():
    with pytest.raises(ValueError, match="cannot sample"):
        sample_frame_indices(1, 10.0)
    with pytest.raises(ValueError, match="leaves no frames"):
        sample_frame_indices(30, 10.0, video_start=2.0, video_end=1.0)


def test_reuses_transformers_smart_resize_with_the_expected_signature():
    import inspect

    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    assert list(inspect.signature(smart_resize).parameters)[:5] == [
        "height", "width", "factor", "min_pixels", "max_pixels"]


# -- parity with qwen-vl-utils -------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen():
    return pytest.importorskip("qwen_vl_utils.vision_process")


INDEX_GRID = [
    (30, 10.0, {}), (30, 10.0, {"fps": 4}), (30, 10.0, {"fps": 0.5}), (300, 29.97, {}),
    (7201, 23.976, {}), (100000, 30.0, {}), (100000, 30.0, {"max_frames": 65}), (9, 30.0, {}),
    (5, 25.0, {"min_frames": 8}), (120, 24.0, {"nframes": 11}), (120, 24.0, {"nframes": 2}),
    (120, 24.0, {"fps": 8, "min_frames": 3, "max_frames": 17}), (301, 30.0, {"video_start": 1.5}),
    (301, 30.0, {"video_end": 4.2}), (301, 30.0, {"video_start": 2.01, "video_end": 9.99}),
    (301, 30.0, {"video_start": -3.0, "video_end": 100.0}), (60, 12.5, {"video_start": 1.0, "nframes": 6}),
    (1, 10.0, {}), (3, 10.0, {"nframes": 6}), (30, 10.0, {"video_start": 2.0, "video_end": 1.0}),
]


def qwen_indices(qwen, total, fps, ele):
    start, end, count = qwen.calculate_video_frame_range(ele, total, fps)
    n = qwen.smart_nframes(ele, total_frames=count, video_fps=fps)
    return torch.linspace(start, end, n).round().long().tolist()


@pytest.mark.parametrize("total,fps,ele", INDEX_GRID)
def test_indices_match_qwen_vl_utils(qwen, total, fps, ele):
    try:
        expected = qwen_indices(qwen, total, fps, ele)
    except ValueError:
        with pytest.raises(ValueError):
            sample_frame_indices(total, fps, **ele)
        return
    assert sample_frame_indices(total, fps, **ele) == expected


SIZE_GRID = [(48, 64, 6), (1080, 1920, 16), (1080, 1920, 768), (720, 1280, 300), (360, 640, 2),
             (100, 3000, 8), (2000, 50, 4), (28, 28, 4), (1, 150, 4), (479, 853, 64), (4000, 3000, 32)]
BUDGETS = [{}, {"max_pixels": 256 * 28 * 28}, {"min_pixels": 16 * 28 * 28}, {"total_pixels": 20480 * 28 * 28},
           {"min_pixels": 64 * 28 * 28, "max_pixels": 4096 * 28 * 28, "total_pixels": 24576 * 28 * 28}]


def qwen_frame_size(qwen, monkeypatch, height, width, nframes, budget, image_patch_size=14):
    """The size fetch_video resizes a (nframes, 3, height, width) video to: its reader and resize
    are replaced, so its own budget arithmetic and smart_resize run on a video that is never built."""
    sizes = []
    video = torch.zeros(1, 1, 1, 1, dtype=torch.uint8).expand(nframes, 3, height, width)
    fake_read = lambda ele: (video, {"frames_indices": list(range(nframes))}, 2.0)  # noqa: E731
    monkeypatch.setitem(qwen.VIDEO_READER_BACKENDS, qwen.get_video_reader_backend(), fake_read)
    monkeypatch.setattr(qwen.transforms.functional, "resize",
                        lambda v, size, **kw: sizes.append(tuple(size)) or torch.zeros(0))
    qwen.fetch_video({"video": "never-read.mp4", **budget}, image_patch_size=image_patch_size)
    monkeypatch.undo()
    return sizes[0]


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda b: ",".join(b) or "defaults")
def test_frame_sizes_match_qwen_vl_utils(qwen, monkeypatch, budget):
    for height, width, nframes in SIZE_GRID:
        expected = qwen_frame_size(qwen, monkeypatch, height, width, nframes, budget)
        assert frame_size(height, width, nframes, **budget) == expected, (height, width, nframes)


def test_frame_sizes_match_qwen_vl_utils_for_patch_16(qwen, monkeypatch):
    """Qwen3-VL (patch 16, factor 32): the caller passes its budgets, fetch_video derives them."""
    budget = {"min_pixels": 128 * 32 * 32, "total_pixels": int(128000 * 32 * 32 * 0.9)}
    for height, width, nframes in SIZE_GRID:
        expected = qwen_frame_size(qwen, monkeypatch, height, width, nframes, budget, image_patch_size=16)
        assert frame_size(height, width, nframes, max_pixels=768 * 32 * 32, factor=32, **budget) == expected


READ_SETTINGS = [{}, {"fps": 4}, {"fps": 1}, {"nframes": 10}, {"min_frames": 10}, {"fps": 4, "max_frames": 5},
                 {"video_start": 0.5, "video_end": 2.5}, {"video_start": 1.05}, {"video_end": 2.0, "fps": 3},
                 {"max_pixels": 64 * 28 * 28, "min_pixels": 16 * 28 * 28}]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("settings", READ_SETTINGS,
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "defaults")
def test_read_video_matches_fetch_video(qwen, clip_path, backend, settings):
    expected, meta = qwen.fetch_video({"video": str(clip_path), **settings}, return_video_metadata=True)
    _, sample_fps = qwen.fetch_video({"video": str(clip_path), **settings}, return_video_sample_fps=True)
    clip = read_video(clip_path, backend=backend, **settings)
    assert clip.backend == backend
    assert clip.indices == list(meta["frames_indices"])
    assert clip.frames.dtype == torch.uint8 and clip.frames.shape == expected.shape
    assert frame_ids(clip.frames) == clip.indices  # the frames decoded are the frames sampled
    # and look as qwen-vl-utils' do: its decoder is decord here, PyAV bundles another FFmpeg
    assert (clip.frames.float() - expected).abs().max() <= (0 if backend == qwen.get_video_reader_backend() else 2)
    assert clip.sample_fps == pytest.approx(sample_fps)
    assert clip.timestamps == pytest.approx([i / 10 for i in clip.indices])
    assert clip.source_fps == pytest.approx(10.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_video_literal(clip_path, backend):
    clip = read_video(clip_path, backend=backend, video_start=0.5, video_end=2.5)
    assert clip.indices == [5, 12, 18, 25] and frame_ids(clip.frames) == [5, 12, 18, 25]
    assert clip.timestamps == pytest.approx([0.5, 1.2, 1.8, 2.5])
    assert clip.duration == pytest.approx(2.1)  # frames 5..25: 21 frames at 10 fps
    assert clip.sample_fps == pytest.approx(4 / 21 * 10)
    assert tuple(clip.frames.shape) == (4, 3, 280, 392)
    images = clip.images()
    assert len(images) == 4 and images[0].size == (392, 280) and images[0].mode == "RGB"


def test_decord_failure_falls_back_to_pyav(clip_path, monkeypatch, caplog):
    """... warned once per file: a clip read every epoch goes straight to PyAV after the first time."""
    decord = pytest.importorskip("decord")
    monkeypatch.setattr(V, "_FAILED", {})
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("decord cannot read this one")

    monkeypatch.setattr(decord, "VideoReader", broken)
    with caplog.at_level("WARNING", logger="mmrl.media.video"):
        for _ in range(3):
            clip = read_video(clip_path, backend="auto")
            assert clip.backend == "pyav" and clip.indices == [0, 6, 12, 17, 23, 29]
    warnings = [r.getMessage() for r in caplog.records if "cannot decode it" in r.getMessage()]
    assert len(warnings) == 1 and str(clip_path) in warnings[0] and len(calls) == 1
    # a file neither decoder reads: the error still names both decoders' reasons, every time
    bad = clip_path.parent / "bad.mp4"
    bad.write_bytes(b"not a video at all" * 10)
    for _ in range(2):
        with pytest.raises(VideoReadError, match=r"decord: RuntimeError: decord cannot read this one; pyav: "):
            read_video(bad, backend="auto")
    assert len([r for r in caplog.records if "cannot decode it" in r.getMessage()]) == 2  # one per file


# -- frame folders and lists ----------------------------------------------------------------------

def test_folder_of_frames_is_padded_to_an_even_count(tmp_path):
    for i in range(5):
        Image.new("RGB", (64, 48), PALETTE[i]).save(tmp_path / f"frame_{i:03d}.png")
    (tmp_path / "notes.txt").write_text("not a frame")
    clip = read_video(tmp_path, fps=1.0)
    assert frame_ids(clip.frames) == [0, 1, 2, 3, 4, 4]  # 5 frames, the last repeated
    assert torch.equal(clip.frames[4], clip.frames[5])
    assert clip.indices == [0, 1, 2, 3, 4, 5] and clip.timestamps == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert clip.sample_fps == 1.0 and clip.duration == 5.0
    assert tuple(clip.frames.shape[2:]) == frame_size(48, 64, 6) == (280, 392)
    small = read_video(tmp_path, fps=1.0, min_pixels=4 * 28 * 28, max_pixels=8 * 28 * 28)
    # 48 x 64 rounds to 56 x 56 = 3136 pixels, within [4 * 784, 8 * 784]: kept (aspect 1.33 -> 1).
    assert tuple(small.frames.shape[2:]) == (56, 56)
    (tmp_path / "empty").mkdir()
    with pytest.raises(VideoReadError, match="holds no frame images"):
        read_video(tmp_path / "empty")


def test_list_of_images_matches_qwen_vl_utils(qwen):
    # qwen-vl-utils first resizes each listed image on its own (fetch_image, PIL, to multiples of 56:
    # it passes the factor 28 as image_patch_size), then the stack to the video budget; mmrl resizes
    # once. 112 x 168 is a multiple of 56 within that image budget, so its first resize keeps it
    # and the two agree pixel for pixel.
    images = [Image.fromarray(frame_image(i, (168, 112))) for i in range(3)]
    expected, sample_fps = qwen.fetch_video({"video": images, "sample_fps": 3.0}, return_video_sample_fps=True)
    clip = read_video(images, fps=3.0)
    # 112 x 168 = 18816 < 100352 pixels: scaled by sqrt(100352 / 18816) = 2.3094, rounded up to 28s:
    # ceil(112 * 2.3094 / 28) * 28 = 10 * 28 = 280, ceil(168 * 2.3094 / 28) * 28 = 14 * 28 = 392.
    assert tuple(clip.frames.shape) == tuple(expected.shape) == (4, 3, 280, 392)
    assert torch.equal(clip.frames.float(), expected)
    assert clip.sample_fps == sample_fps == 3.0 and clip.timestamps == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert frame_ids(clip.frames) == [0, 1, 2, 2]


def test_from_images_takes_arrays_paths_and_rgba(tmp_path):
    Image.new("RGB", (64, 48), PALETTE[1]).save(tmp_path / "one.png")
    transparent = Image.new("RGBA", (64, 48), (0, 0, 0, 0))  # over white, as qwen-vl-utils
    clip = Clip.from_images([np.full((48, 64, 3), PALETTE[0], np.uint8), tmp_path / "one.png", transparent],
                            fps=2.0, max_pixels=8 * 28 * 28, min_pixels=4 * 28 * 28)
    assert tuple(clip.frames.shape) == (4, 3, 56, 56)
    assert frame_ids(clip.frames[:2]) == [0, 1] and clip.frames[2].min() == 255
    mixed = Clip.from_images([Image.new("RGB", (64, 48), PALETTE[0]), Image.new("RGB", (30, 90), PALETTE[1])])
    assert tuple(mixed.frames.shape) == (2, 3, 280, 392) and frame_ids(mixed.frames) == [0, 1]  # the first's size
    with pytest.raises(VideoReadError, match="empty"):
        Clip.from_images([])
    with pytest.raises(VideoReadError, match="missing.png"):
        Clip.from_images([tmp_path / "missing.png"])


def test_missing_torchvision_says_how_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torchvision.transforms", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[video\]"'):
        Clip.from_images([Image.new("RGB", (64, 48))] * 2)


# -- unreadable files ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, clip_path):
    folder = tmp_path_factory.mktemp("bad")
    (folder / "random.mp4").write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    (folder / "zero.mp4").write_bytes(b"")
    (folder / "text.mp4").write_text("this is not a video\n")
    (folder / "truncated.mp4").write_bytes(clip_path.read_bytes()[:1500])
    write_clip(folder / "one_frame.mp4", frames=1)
    return folder


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,message", [("random.mp4", "cannot decode video"), ("zero.mp4", "is empty"),
                                          ("text.mp4", "cannot decode video"), ("truncated.mp4", "cannot decode"),
                                          ("missing.mp4", "no video file"), ("one_frame.mp4", "cannot sample")])
def test_unreadable_videos_raise_naming_the_path(bad_files, backend, name, message):
    path = bad_files / name
    with pytest.raises(VideoReadError, match=message) as info:
        read_video(path, backend=backend)
    assert str(path) in str(info.value)


def test_backend_names_are_checked(clip_path):
    assert set(V.video_backends()) <= {"decord", "pyav"} and "pyav" in V.video_backends()
    with pytest.raises(ValueError, match="backend='ffmpeg'"):
        read_video(clip_path, backend="ffmpeg")


# -- videos in data files --------------------------------------------------------------------------

def parse(record):
    return {"video": record["video"], "question": record["q"]}


def test_file_examples_read_videos_and_skip_bad_ones(tmp_path, caplog):
    write_clip(tmp_path / "a.mp4", frames=30, fps=10)
    write_clip(tmp_path / "b.mp4", frames=20, fps=5)
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 truncated nonsense")
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(3):
        Image.new("RGB", (64, 48), PALETTE[i]).save(frames / f"{i}.png")
    lines = [{"video": "a.mp4", "q": "first"},            # 1 ok
             {"video": "broken.mp4", "q": "corrupt"},     # 2 counted on access
             {"video": "missing.mp4", "q": "missing"},    # 3 skipped at indexing
             {"video": "b.mp4", "q": "second"},           # 4 ok
             {"video": ["frames/0.png", "frames/1.png", "frames/2.png"], "q": "frames"}]  # 5 ok
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    ds = FileExamples(path, parse, video_options={"fps": 4, "backend": "pyav"})
    assert len(ds) == 4
    assert ds.skipped == [(3, f"video {tmp_path / 'missing.mp4'} does not exist (paths start at {tmp_path})")]
    assert f"{path}:3 skipped" in caplog.text
    first = ds[0]
    assert isinstance(first["video"], Clip) and first["video_path"] == str(tmp_path / "a.mp4")
    assert first["video_duration"] == pytest.approx(3.0) and len(first["video"].indices) == 12  # 3 s at fps 4
    second = ds[1]  # the corrupt clip: the next example instead, counted, no exception
    assert second["question"] == "second" and len(second["video"].indices) == 16  # 4 s at fps 4
    assert list(ds.bad_images) == [f"{path}:2"] and "broken.mp4" in ds.bad_images[f"{path}:2"]
    assert "cannot open the video" in caplog.text
    listed = ds[3]
    assert frame_ids(listed["video"].frames) == [0, 1, 2, 2] and listed["video_duration"] == pytest.approx(0.75)
    assert listed["video_path"] == [str(frames / f"{i}.png") for i in range(3)]
    assert ds.stats() == {"examples": 4, "skipped_lines": 1, "bad_images": 1, "bad_targets": 0}
    with pytest.raises(ValueError, match="video_options: unknown key 'fsp'"):
        FileExamples(path, parse, video_options={"fsp": 4})
