"""Moved: ``mmrl sft``'s run is :mod:`mmrl.vlm.sft_run` (its command body :mod:`mmrl.cli_sft`). This name
stays only until :mod:`mmrl.tools.tiny_zoom` imports ``sft`` from there; then delete it."""

from .vlm.sft_run import sft  # noqa: F401
