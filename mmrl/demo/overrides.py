"""What a run started from the demo's Launch tab may set: an allow-list of config keys, each with
the kind of value it takes, and the paths the resulting config reads.

The overrides come from a web page, and a config can do more than tune a run: ``plugins``
imports Python files (an uploaded ``.py`` would run as the demo's user), and every path-valued
key makes the run read a file. So a page may set only the keys of :data:`ALLOWED`, each value is
read as its kind (an integer in a range, a float, true/false, a name from a registry, one of a
few choices, or a path) and written back in a canonical, YAML-quoted form, so no value can carry
YAML syntax into another key. A path is accepted only when it resolves (``..`` and symlinks
followed) inside the directories the demo serves (:class:`~mmrl.demo.paths.AllowedRoots`).
No value may hold ``${``, which OmegaConf would resolve as an interpolation when the config
loads (``${oc.env:TOKEN}`` reads the demo's environment into a path that error messages then
show): :func:`refuse_interpolation` refuses it in the text as sent and as canonicalised.
:func:`check_config` then loads the recipe with those overrides and checks the paths the recipe
itself names (a shipped recipe's ``model.path: /models/...``) the same way. Everything here runs
before any process starts, and nothing named by a value is read.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .. import registry
from ..core.losses.config import KL_ESTIMATORS, LOSS_AGG_MODES
from ..core.precision import DTYPES
from ..vlm.engines.hf import CACHE_IMPLEMENTATIONS
from .paths import AllowedRoots, PathRefused

__all__ = ["ALLOWED", "RESERVED_KEYS", "check_config", "check_overrides", "parse_overrides", "refuse_interpolation",
           "yaml_quoted"]

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_INT = re.compile(r"^[+-]?[0-9]{1,12}$")
_FLOAT = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_NULL = ("null", "none", "~")
# The tab sets these: the run must land in the runs directory under the name it shows.
RESERVED_KEYS = ("log.output_dir", "log.run_name")
# Option names that hold paths, in task options and reward kwargs (the built-in tasks' names, and
# the suffixes every file-reading option of theirs uses).
PATH_NAMES = ("path", "pretrained")
PATH_SUFFIXES = ("_path", "_dir", "_root")


@dataclass(frozen=True)
class Kind:
    """A kind of value: ``what`` it accepts (for the message), ``read`` the text into the
    override's canonical YAML value (ValueError when it is not one)."""
    what: str
    read: Callable[[str, AllowedRoots, str], str]


INTERPOLATION = "${"


def refuse_interpolation(what: str, value: object) -> None:
    """ValueError when ``value`` (``what``, from a request) holds ``${``: OmegaConf resolves
    ``${...}`` wherever it appears in a string (``${oc.env:NAME}``: the demo's environment), and
    the substring is the only way in (``\\${`` is only an escape that writes ``${`` back)."""
    if INTERPOLATION in str(value):
        raise ValueError(f"{what}: {str(value)!r} holds '${{': an OmegaConf interpolation, which the demo never "
                         "resolves from a request (it could read the demo's environment); write the value itself")


def yaml_quoted(text: str) -> str:
    """``text`` as a YAML single-quoted string: a name like ``007`` stays a string, and no
    character of it is YAML syntax."""
    return "'" + str(text).replace("'", "''") + "'"


def _int(lo: int, hi: int) -> Kind:
    def read(text, _roots, _modality):
        if not _INT.match(text) or not lo <= int(text) <= hi:
            raise ValueError
        return str(int(text))
    return Kind(f"an integer from {lo} to {hi}", read)


def _int_or_auto(lo: int, hi: int) -> Kind:
    number = _int(lo, hi)

    def read(text, roots, modality):
        return yaml_quoted("auto") if text == "auto" else number.read(text, roots, modality)
    return Kind(f"auto or {number.what}", read)


def _float(lo: float, hi: float, nullable: bool = False) -> Kind:
    def read(text, _roots, _modality):
        if nullable and text.lower() in _NULL:
            return "null"
        if not _FLOAT.match(text) or not lo <= float(text) <= hi:
            raise ValueError
        return repr(float(text))
    return Kind(f"a number from {lo:g} to {hi:g}" + (" or null" if nullable else ""), read)


def _bool_read(text, _roots, _modality):
    if text.lower() not in ("true", "false"):
        raise ValueError
    return text.lower()


BOOL = Kind("true or false", _bool_read)


def _choice(*values: str) -> Kind:
    def read(text, _roots, _modality):
        if text not in values:
            raise ValueError
        return yaml_quoted(text)
    return Kind("one of " + " | ".join(values), read)


def _registered(name: str, nullable: bool = False) -> Kind:
    """A name registered in ``mmrl.registry.<name>`` (built-ins and installed plugins)."""
    known = getattr(registry, name)

    def read(text, _roots, _modality):
        if nullable and text.lower() in _NULL:
            return "null"
        if not _NAME.match(text) or text not in known.names():
            raise ValueError
        return yaml_quoted(text)
    return Kind(f"a registered {known.kind} name (`mmrl list`)" + (" or null" if nullable else ""), read)


def _inside(text: str, roots: AllowedRoots) -> str:
    if not text or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError
    return yaml_quoted(str(roots.resolve(text)))  # PathRefused (a PermissionError) names the roots


def _path_read(text, roots, _modality):
    return "null" if text.lower() in _NULL else _inside(text, roots)


PATH = Kind("null or a path inside the directories this demo serves", _path_read)


def tiny_models(modality: str) -> tuple[str, ...]:
    """The ``model.path`` names of the shipped tiny models a ``modality`` recipe trains."""
    from ..config.tiny_models import tiny_checkpoints

    return tuple(tiny_checkpoints("diffusion" if modality == "diffusion" else "vlm"))


def _model_read(text, roots, modality):
    return yaml_quoted(text) if text in tiny_models(modality) else _inside(text, roots)


MODEL = Kind("a shipped tiny model's name (tiny, tiny-video, ...; generators tiny, tiny-t2v) or a checkpoint "
             "directory inside the directories this demo serves",
             _model_read)

ALLOWED: dict[str, Kind] = {
    "train.steps": _int(1, 1_000_000), "train.seed": _int(0, 2**31 - 1),
    "train.learning_rate": _float(0.0, 1.0), "train.prompts_per_step": _int(1, 4096),
    "train.mini_batch_size": _int(0, 65536), "train.micro_batch_size": _int(1, 65536),
    "train.warmup_steps": _int(0, 1_000_000), "train.weight_decay": _float(0.0, 1.0),
    "train.max_grad_norm": _float(0.0, 1e6), "train.threads": _int_or_auto(0, 1024),
    "train.device": _choice("auto", "cpu", "cuda"), "train.optim": _registered("OPTIMIZERS"),
    "rollout.num_generations": _int(1, 256), "rollout.temperature": _float(0.0, 10.0),
    "rollout.top_p": _float(0.0, 1.0), "rollout.top_k": _int(0, 100_000),
    "rollout.max_completion_length": _int(1, 65536), "rollout.batch_size": _int(0, 65536),
    "rollout.cache_implementation": _choice(*CACHE_IMPLEMENTATIONS),
    "algo.advantage": _registered("ADVANTAGES"), "algo.loss_type": _registered("LOSSES"),
    "algo.epsilon": _float(0.0, 10.0), "algo.epsilon_high": _float(0.0, 10.0, nullable=True),
    "algo.beta": _float(0.0, 100.0), "algo.kl_estimator": _choice(*KL_ESTIMATORS),
    "algo.kl_schedule": _registered("KL_SCHEDULES"), "algo.num_iterations": _int(1, 100),
    "algo.entropy_coef": _float(-10.0, 10.0), "algo.scale_rewards": BOOL,
    "algo.loss_agg_mode": _choice(*LOSS_AGG_MODES),
    "algo.selection": _registered("SELECTIONS"), "algo.overlong_filter": BOOL,
    "data.sampler": _registered("PROMPT_SAMPLERS"),
    "data.perturbation": _registered("PERTURBATIONS", nullable=True), "data.perturbation_prob": _float(0.0, 1.0),
    "eval.num_examples": _int(0, 100_000), "eval.every": _int(0, 1_000_000), "eval.temperature": _float(0.0, 10.0),
    "eval.num_generations": _int(1, 256), "eval.pass_k": _int(0, 256), "eval.before": BOOL,
    "log.log_every": _int(1, 1_000_000), "log.save_every": _int(0, 1_000_000),
    "log.save_rollouts_every": _int(0, 1_000_000), "log.num_rollouts_to_save": _int(0, 256),
    "log.save_total_limit": _int(0, 1000), "log.tensorboard": BOOL,
    "model.path": MODEL, "model.dtype": _choice(*DTYPES),
    "model.lora.enabled": BOOL, "model.lora.r": _int(1, 1024), "model.lora.alpha": _int(1, 4096),
    "diffusion.num_steps": _int(1, 1000), "diffusion.eval_num_steps": _int(1, 1000),
    "diffusion.noise_level": _float(0.0, 10.0), "diffusion.sampler": _registered("SDE_SAMPLERS"),
    "diffusion.guidance_scale": _float(0.0, 100.0, nullable=True),
    "task.name": _registered("TASKS"),
    "task.options.train_size": _int(1, 100_000_000), "task.options.eval_size": _int(1, 100_000_000),
    **{f"task.options.{k}": PATH for k in ("train_path", "eval_path", "image_root", "train_dir", "eval_dir",
                                           "image_dir", "eval_image_dir")},
}


def parse_overrides(text: Optional[str]) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of ``text`` (``key=value`` tokens, shell-quoted as on a command
    line); ValueError naming a token that is not one."""
    try:
        tokens = shlex.split(text or "")
    except ValueError as exc:  # an unclosed quote
        raise ValueError(f"cannot read the overrides ({exc}); write key=value pairs, e.g. train.steps=20") from None
    pairs = []
    for token in tokens:
        key, eq, value = token.partition("=")
        if not eq or not _KEY.match(key):
            raise ValueError(f"override {token!r} is not of the form key=value with a dotted config key "
                             "(e.g. train.steps=20 algo.beta=0.0)")
        pairs.append((key, value))
    return pairs


def _refusal(key: str) -> str:
    if key == "plugins" or key.startswith("plugins."):
        return ("plugins is never accepted from the page: a plugin is Python code that would run as the "
                "demo's user. Install it as a package (entry point group mmrl.plugins) before starting the demo")
    if key in RESERVED_KEYS:
        return f"{key} is set by the launch tab (the runs directory and the run name)"
    return f"{key} is not a key the launch tab accepts; it accepts {', '.join(ALLOWED)}"


def check_overrides(text: Optional[str], roots: AllowedRoots, modality: str) -> list[str]:
    """The overrides of ``text`` as canonical ``key=value`` arguments for ``mmrl train``; ValueError
    (:class:`~mmrl.demo.paths.PathRefused` for a path outside ``roots``) naming the first override
    refused and why."""
    out = []
    for key, value in parse_overrides(text):
        refuse_interpolation(f"override {key}", value)  # as sent (after shell unquoting) ...
        kind = ALLOWED.get(key)
        if kind is None:
            raise ValueError(f"override {key}={value}: {_refusal(key)}")
        try:
            canonical = kind.read(value, roots, modality)
        except PermissionError as exc:
            raise PathRefused(f"override {key}={value}: {exc}; {key} takes {kind.what}") from None
        except ValueError:
            raise ValueError(f"override {key}={value!r}: {key} takes {kind.what}") from None
        refuse_interpolation(f"override {key} (the path it resolves to)", canonical)  # ... and as a link resolves it
        out.append(f"{key}={canonical}")
    return out


def _named_paths(tree: Any, prefix: str):
    """(key, value) of every string under ``tree`` whose option name says it is a path."""
    if not isinstance(tree, dict):
        return
    for name, value in tree.items():
        key = f"{prefix}.{name}"
        if isinstance(value, dict):
            yield from _named_paths(value, key)
        elif isinstance(value, str) and value and (name in PATH_NAMES or str(name).endswith(PATH_SUFFIXES)):
            yield key, value


def check_config(recipe: Path, overrides: list[str], roots: AllowedRoots, modality: str) -> None:
    """Load ``recipe`` with ``overrides`` (a config error is the page's message) and refuse a config
    that imports plugins or reads a path outside ``roots``: ``model.path`` and the path options
    of the task and its rewards, whether the recipe or an override set them."""
    from ..config import load_config

    cfg = load_config(recipe, overrides)
    if cfg.plugins:
        raise ValueError(f"recipe {recipe.name} lists plugins {cfg.plugins}: a plugin runs Python code, "
                         "so the launch tab does not start it; run it with `mmrl train` yourself")
    paths = list(_named_paths(cfg.task.options, "task.options")) + \
        list(_named_paths(cfg.task.reward_kwargs, "task.reward_kwargs"))
    if cfg.model.path not in tiny_models(modality):
        paths.insert(0, ("model.path", cfg.model.path))
    for key, value in paths:
        if not roots.contains(value):
            raise PathRefused(
                f"{key}={value} (from the recipe {recipe.stem}) is outside the directories this demo serves "
                f"({', '.join(map(str, roots.roots))}); serve its folder (--models) and set {key}=<a path there>")
