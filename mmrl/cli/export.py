"""``mmrl export RUN_DIR OUT``: a trained policy handed on as a standard directory.

A run's checkpoints are for resuming (optimizer state, LoRA adapters apart from their base, RNG
state). Someone who only wants the model needs what the libraries load: a VLM that transformers'
``from_pretrained`` reads (LoRA merged into the weights, or with ``adapters`` the adapters alone,
which peft loads onto the base), a generator that its pipeline loader reads (the base pipeline
directory with the trained transformer in place of its own). Each export carries a model card
(``README.md``) with the run's held-out before/after table, the recipe and the data it trained on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from mmrl.runs.checkpoint import CheckpointManager

__all__ = ["export_run", "model_card"]


def export_run(run_dir: Path, out: Path, step: int | None = None, adapters: bool = False) -> Path:
    """Write run ``run_dir``'s checkpoint (the latest, or ``step``) to ``out``; returns ``out``."""
    from mmrl.api import make_policy
    from mmrl.config import ConfigError, load_config
    from mmrl.core.trainer import build_task

    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml); give the directory `mmrl train` wrote")
    manager = CheckpointManager(run_dir / "checkpoints")
    ckpt = manager.latest() if step is None else manager.step_dir(step)
    if ckpt is None or not (ckpt / "policy").exists():
        have = ", ".join(str(s) for s in manager.steps()) or "none"
        raise ConfigError(f"{run_dir}: no checkpoint{'' if step is None else f' at step {step}'} to export "
                          f"(checkpoints at steps: {have}; runs save every log.save_every steps and at the end)")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty; export into a new directory")
    # no reference model (algo.beta=0): an export needs the trained weights only, not a frozen copy
    cfg = load_config(run_dir / "config.yaml", ["resume=false", "train.device=cpu", "eval.before=false", "algo.beta=0"])
    if adapters and not cfg.model.lora.enabled:
        raise ConfigError("--adapters: this run trained no LoRA adapters (model.lora.enabled=false); "
                          "export the full weights without --adapters")
    task = build_task(cfg)
    policy = make_policy(cfg, task)
    policy.load(ckpt / "policy")
    out.mkdir(parents=True, exist_ok=True)
    policy.export_pretrained(out, adapters=adapters)
    (out / "README.md").write_text(model_card(run_dir, cfg, ckpt, adapters, policy.export_library, task.modality))
    return out


def model_card(run_dir: Path, cfg, ckpt: Path, adapters: bool, library: str, modality: str) -> str:
    """The export's README: what it is, the held-out table of the run, its recipe (with the command
    that repeats it: ``mmrl train`` needs the task's ``modality``, vlm or diffusion) and data."""
    summary = _read_json(run_dir / "summary.json")
    before, after = summary.get("before") or {}, summary.get("after") or {}
    rows = [f"| {k} | {_num(before.get(k))} | {_num(v)} |" for k, v in after.items()]
    table = "\n".join(["| held-out metric | before | after |", "|---|---|---|", *rows]) if rows else \
        "No held-out evaluation was recorded (summary.json has none: the run ended before its last eval)."
    what = "LoRA adapters (load them onto the base model with peft)" if adapters else \
        ("weights with the LoRA adapters merged" if cfg.model.lora.enabled else "full weights")
    front = {"library_name": library, "base_model": str(cfg.model.path), "tags": ["mmrl", "reinforcement-learning",
                                                                                  cfg.task.name]}
    data = {"task": cfg.task.name, "options": dict(cfg.task.options), **(summary.get("data") or {})}
    return "\n".join([
        "---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
        f"# {run_dir.name}", "",
        f"Trained with mmrl from `{cfg.model.path}` on the `{cfg.task.name}` task: advantage "
        f"`{cfg.algo.advantage}`, loss `{cfg.algo.loss_type}`, checkpoint `{ckpt.name}` "
        f"({summary.get('steps', '?')} steps run). This directory holds the {what}.", "",
        "## Held-out evaluation", "", table, "",
        "## Recipe", "", f"The run's whole config (saved as `config.yaml`, `mmrl train {modality} config.yaml` repeats "
        "the run):", "",
        "```yaml", (run_dir / "config.yaml").read_text().strip(), "```", "",
        "## Data", "", "```json", json.dumps(data, indent=2, default=str), "```", "",
    ])


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _num(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4g}" if isinstance(x, float) else str(x)
