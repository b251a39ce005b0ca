"""The tiny zoom default's warm start (``mmrl build-tiny zoom``, ``model.path=tiny-zoom``): the
shipped tiny VLM fine-tuned by ``mmrl sft`` on the reference trajectories of the recipe
configs/vlm/zoom_qa_tiny.yaml (``zoom_qa`` with ``detail: pattern``), its vision tower trained too.

The shipped tower was pre-trained on the counting scenes' cells and does not tell textures of
period 2 px apart: the nearest class centroid of its outputs named none of 36 zoomed squares
(12 draws of colours and place x 3 textures) right; trained along with the language model, the
shipped warm start's tower names 29 of 36, and the model, shown the zoomed cell, 60 of 60 held-out
textures (measured 2026-11-27 on the earlier build of the tiny default; rebuilt from the current one
on 2026-11-28, RL takes it from 0.32 to 1.00 as before). The warm start leaves RL the choice to look:
``reference_look_rate`` (0.4) of the references zoom, the rest answer at once (a guess: the
texture cannot be seen in the whole image).

Two stages, as measured on 2026-11-27 (2 CPU cores, one thread): 300 steps from the tiny default
(seed 0) left a model that, shown the zoomed cell, answered "horizontal" every time (0.37 of 60
held-out examples right); 150 more steps from it (seed 1, the schedule warmed up again) read 60 of
60. Whether reading appears by step 300 varied from run to run (1.00, 0.72, 1.00 on other variants
of the task), so the shipped warm start is the two-stage one."""

from __future__ import annotations

import tempfile
from pathlib import Path

TINY_ZOOM_RECIPE = {"sft_steps": 300, "more_steps": 150, "batch_size": 32, "lr": 1e-3}
ZOOM_RECIPE = "vlm/zoom_qa_tiny"


def warm_start_overrides(sft_steps: int, batch_size: int, lr: float, seed: int) -> list[str]:
    """The ``mmrl sft`` overrides of one stage of the warm start (from the tiny default)."""
    return ["model.path=tiny", f"train.steps={sft_steps}", f"train.prompts_per_step={batch_size}",
            f"train.learning_rate={lr}", f"train.seed={seed}", "vlm.freeze_vision=false", "eval.num_examples=100"]


def build_tiny_zoom(out: str | Path, sft_steps: int = TINY_ZOOM_RECIPE["sft_steps"],
                    more_steps: int = TINY_ZOOM_RECIPE["more_steps"], batch_size: int = TINY_ZOOM_RECIPE["batch_size"],
                    lr: float = TINY_ZOOM_RECIPE["lr"], seed: int = 0, progress: bool = True) -> Path:
    """``mmrl sft vlm/zoom_qa_tiny`` from the tiny default with :func:`warm_start_overrides` for
    ``sft_steps`` (``seed``), then ``more_steps`` more from its model (``seed + 1``; 0: none); the
    model saved to ``out`` (through a staging directory: a build that dies leaves the old one)."""
    from mmrl.vlm.sft_run import sft
    from mmrl.vlm.tiny_builders import publish

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="mmrl-tiny-zoom-") as runs:
        logging = [f"log.output_dir={runs}", f"log.progress={str(progress).lower()}", "log.tensorboard=false"]
        model = sft(ZOOM_RECIPE, [*warm_start_overrides(sft_steps, batch_size, lr, seed), *logging,
                                  "log.run_name=warm"]).model_dir
        if more_steps > 0:
            model = sft(ZOOM_RECIPE, [*warm_start_overrides(more_steps, batch_size, lr, seed + 1), *logging,
                                      f"model.path={model}", "log.run_name=more"]).model_dir
        return publish(model, out)
