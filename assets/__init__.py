"""Files shipped with mmrl: the tiny built-in checkpoints (rebuilt by ``mmrl build-tiny``)."""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent


def asset_path(name: str) -> Path:
    """Path of a shipped asset, e.g. ``asset_path("tiny-qwen2.5-vl")``."""
    return ASSETS_DIR / name
