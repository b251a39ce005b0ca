"""The config of every start of a run, and what a resume may change.

``config.yaml`` is the config the run is training with now; ``config_history/`` keeps the resolved
config of every start (``000-start.yaml``, ``001-resume-step-40.yaml``, ...), so a run that was
resumed with other settings says so. A resume compares its config with the run's: any difference
is printed and refused unless ``allow_config_change=true`` (``--allow-config-change``), and the
keys that define what is being trained (:data:`FIXED_KEYS`) are refused always; the keys that only
change how the run is watched (:data:`FREE_KEYS`) may always differ. A hub id's ``model.revision``
is saved as the commit the run loaded (:func:`mmrl.config.hub.pin_revision`), so a resume, which takes the
run's ``config.yaml``, loads the same weights even after the repo moved on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..config import load_config, recipe_of, save_config
from mmrl.config.hub import pin_revision

# What is trained: a checkpoint of one of these means nothing under another value.
FIXED_KEYS = ("model.path", "model.revision", "model.lora", "task.name", "task.options", "rollout.num_generations",
              "plugins")
# How the run is watched or run, not what it computes (log.*: what is written, and how often).
FREE_KEYS = ("resume", "allow_config_change", "log", "train.threads", "train.distributed_timeout",
             "train.oom_grow_back_steps", "train.device")
HISTORY_DIR = "config_history"


class ConfigChangeError(ValueError):
    """A resume with a config that differs from the run's."""


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dataclass) as ``{"algo.epsilon": 0.2, ...}``; dicts and lists are leaves' values
    below their key, so ``task.options.query`` is its own key."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: value}


def _under(key: str, roots: tuple[str, ...]) -> bool:
    return any(key == r or key.startswith(r + ".") for r in roots)


def config_changes(old, new) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for every key whose value differs (missing: None)."""
    a, b = flatten(old), flatten(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_resume_config(run_dir: Path, cfg) -> None:
    """Refuse a resume of ``run_dir`` whose config differs from the one the run trained with
    (module docstring); nothing to check for a run that has not started yet."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return
    changes = [c for c in config_changes(load_config(path), pin_revision(cfg)) if not _under(c[0], FREE_KEYS)]
    if not changes:
        return
    lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, old, new in changes)
    fixed = [k for k, _, _ in changes if _under(k, FIXED_KEYS)]
    if fixed:
        raise ConfigChangeError(f"cannot resume {run_dir} with another {', '.join(fixed)} (the checkpoint trains "
                                f"that model, task and group size); start a new run (another log.run_name). "
                                f"Differences from the run's config.yaml:\n{lines}")
    if not cfg.allow_config_change:
        raise ConfigChangeError(f"the config differs from the one {run_dir} trained with:\n{lines}\nadd "
                                "--allow-config-change (allow_config_change=true) to continue with these changes; "
                                f"to continue unchanged, resume without them (`mmrl train --resume {run_dir}` "
                                "takes the run's own config.yaml)")


def record_start(run_dir: Path, cfg, resumed_from: int = 0) -> Path:
    """Write ``config.yaml`` and this start's copy in ``config_history/``, a hub id's revision pinned
    to its commit, the copy's first line ``# recipe: NAME`` when the config says (``recipe_of``);
    returns the copy."""
    run_dir, recipe, cfg = Path(run_dir), recipe_of(cfg), pin_revision(cfg)
    save_config(cfg, run_dir / "config.yaml")
    history = run_dir / HISTORY_DIR
    history.mkdir(exist_ok=True)
    number = len(list(history.glob("*.yaml")))
    name = f"{number:03d}-" + (f"resume-step-{resumed_from}" if resumed_from else "start") + ".yaml"
    return save_config(cfg, history / name, comment=f"recipe: {recipe}" if recipe else "")
