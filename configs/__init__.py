"""YAML recipes shipped with mmrl (``configs/vlm/*.yaml``)."""

from pathlib import Path

CONFIGS_DIR = Path(__file__).resolve().parent
