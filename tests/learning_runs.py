"""Shortened recipe runs for the learning tests, through the public ``mmrl.train``."""

from __future__ import annotations

import mmrl

QUIET = ["log.progress=false", "log.save_every=0", "log.save_rollouts_every=0"]


def train_quietly(recipe: str, tmp_path, name: str, *overrides: str):
    """``recipe`` with ``overrides`` (which win over the quiet logging defaults), run in ``tmp_path``;
    prints the held-out metrics before -> after."""
    result = mmrl.train(recipe, [*QUIET, *overrides, f"log.output_dir={tmp_path}", f"log.run_name={name}"])
    print(f"{name}: held-out", {k: (round(result.before.get(k, float("nan")), 3), round(v, 3)) for k, v in result.after.items()})
    return result
