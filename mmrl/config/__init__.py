"""Load, validate and save run configs (the schema lives in :mod:`mmrl.config.schema`, where the
values come from, recipes and overrides with their origins, in :mod:`mmrl.config.sources`).

A run is configured by a YAML recipe plus dotted command-line overrides::

    mmrl train vlm --config configs/vlm/counting_tiny.yaml algo.epsilon_high=0.28 plugins=[my_task.py]

Why this module does its own key checking instead of leaning on OmegaConf's struct mode: a typo
in a recipe (``epslion``) or a key at the wrong nesting level (``epsilon: 0.2`` at the top) must
stop the run *before* minutes of model loading, and the message must say which key, where it
came from (file and line, or the command line) and what was probably meant. OmegaConf still does
the merging and the type conversion; we only wrap its errors with that context.

Recipes may inherit with ``base: other.yaml`` (relative to the recipe, or a built-in recipe name
such as ``vlm/counting_tiny``); the base is applied first, the recipe's own keys on top.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mmrl.config.keys import INDEX, classify, expected_type
from mmrl.config.schema import Config
from mmrl.config.sources import (  # ConfigError and the recipe lookup are part of this module's API
    ConfigError,
    Item,
    builtin_config_names,
    builtin_config_path,
    override_items,
    resolve_recipe,
    yaml_items,
)

__all__ = [
    "ConfigError",
    "load_config",
    "save_config",
    "check_unused_keys",
    "config_to_dict",
    "recipe_of",
    "builtin_config_path",
    "builtin_config_names",
]


def _apply(cfg: Any, item: Item, locations: dict[str, str]) -> None:
    try:
        OmegaConf.update(cfg, item.key, item.value, merge=not item.replace)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or item.key
        if not str(key).startswith(item.key):
            key = item.key
        value = getattr(exc, "value", item.value) if key != item.key else item.value
        where = item.where if key == item.key else locations.get(key, item.where)  # the item's own line
        hint = ""
        if typing.get_origin(classify(key).type if classify(key) else None) is list:
            example = value if isinstance(value, (str, int, float)) else "a, b"
            hint = f" (write a list, e.g. {key}=[{example}])"
        raise ConfigError(
            f"invalid value {value!r} for config key '{key}' ({where}): expected {expected_type(key)}{hint}"
        ) from None


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


_TASK_SPECIFIC = ("task.options", "task.rewards", "task.reward_kwargs")


def _source(where: str) -> str:
    """The file (or "the command line") an item came from, without its line."""
    return where.split(", line")[0] if not where.startswith("on the command line") else "command line"


def _drop_options_of_replaced_task(items: list[Item], name: str) -> list[Item]:
    """When a recipe (or the command line) switches ``task.name`` away from its base's task, the
    base's task options, rewards and reward kwargs belong to the old task: drop them, so
    ``base: counting_tiny.yaml`` + ``task.name: grounding`` does not hand counting's ``query``
    option to grounding. Items from the same source as the switch are kept."""
    out: list[Item] = []
    for item in items:
        if item.key == "task.name" and item.value != name:
            here = _source(item.where)
            out = [it for it in out if not (it.key.startswith(_TASK_SPECIFIC) and _source(it.where) != here)]
            name = item.value
        out.append(item)
    return out


def load_config(
    path: Union[str, Path, None] = None,
    overrides: Sequence[str] = (),
    base: Optional[Config] = None,
) -> Config:
    """Build a typed :class:`Config`: defaults (or ``base``) <- YAML recipe <- dotted overrides.

    ``path`` is a YAML file or a built-in recipe name (``vlm/counting_tiny``). Raises
    :class:`ConfigError` naming the offending key, where it came from and the likely intended key.
    """
    if isinstance(overrides, str):
        overrides = [overrides]  # a lone "a.b=c" would otherwise be iterated per character
    items: list[Item] = []
    locations: dict[str, str] = {}
    if path is not None:
        recipe = resolve_recipe(path)
        if recipe is None:
            raise ConfigError(f"config file not found: {path}")
        yaml_items(recipe, items, locations)
    for ov in overrides:
        override_items(ov, items, locations)

    items = _drop_options_of_replaced_task(items, (base or Config()).task.name)
    cfg = OmegaConf.structured(base if base is not None else Config)
    for item in items:
        _apply(cfg, item, locations)
    try:
        out = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:  # e.g. a ${interpolation} that does not resolve
        key = getattr(exc, "full_key", "") or "?"
        raise ConfigError(f"cannot resolve config key '{key}' ({locations.get(key, 'config')}): {exc.msg if hasattr(exc, 'msg') else exc}") from None
    assert isinstance(out, Config)
    out._recipe = _recipe_name(recipe) if path is not None else recipe_of(base)  # not a field: see recipe_of
    return out


def _recipe_name(path: Path) -> str:
    from mmrl.configs import CONFIGS_DIR

    path = path.resolve()
    try:
        return path.relative_to(CONFIGS_DIR.resolve()).with_suffix("").as_posix()
    except ValueError:
        return str(path)


def recipe_of(cfg: Optional[Config]) -> Optional[str]:
    """The recipe :func:`load_config` built ``cfg`` from (or its ``base`` was built from): a built-in
    recipe's name (``vlm/counting_tiny``) or a file's absolute path; None for a config made
    otherwise, or copied since (``dataclasses.replace``). The run records it (``config_history/``)
    for its report's diff."""
    return getattr(cfg, "_recipe", None)


def check_unused_keys(cfg: Config, keys: Sequence[str], who: str) -> None:
    """Refuse config keys that mean nothing for this run instead of silently ignoring them.

    ``keys`` are dotted keys (``rollout.temperature``) or whole sections (``diffusion``); any of
    them set to something other than its default is a :class:`ConfigError` naming each such key
    and ``who`` (e.g. "a DiffusionPolicy") that does not read it.
    """
    defaults = config_to_dict(Config())
    current = config_to_dict(cfg)

    def value(tree: dict, key: str) -> Any:
        for part in key.split("."):
            tree = tree[part]
        return tree

    changed: list[str] = []
    for key in keys:
        now, default = value(current, key), value(defaults, key)
        if isinstance(now, dict) and key in INDEX and INDEX[key].kind == "section":
            changed += [f"{key}.{k}={now[k]!r}" for k in now if now[k] != default.get(k)]
        elif now != default:
            changed.append(f"{key}={now!r}")
    if changed:
        raise ConfigError(f"{', '.join(changed)}: not used by {who} (it applies to another kind of model); "
                          "remove the key(s) or train the model kind they belong to")


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of a config (interpolations resolved), e.g. for logging hyperparameters."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def save_config(cfg: Config, path: Union[str, Path], comment: str = "") -> Path:
    """Write the fully resolved config as YAML, so a run directory records exactly what ran.

    The file loads back with :func:`load_config` to an equal ``Config``. Written to a temporary
    file and renamed, so a crash never leaves a half-written ``config.yaml`` behind. ``comment``
    is a first line (``# comment``) that loading ignores.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# {comment}\n" if comment else "") + OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
