"""The config schema as a flat index of dotted keys, and the "did you mean" for unknown keys.

Used by :mod:`mmrl.config` to check every key of a recipe or override before anything runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from typing import Any, Optional, Union

from mmrl.config.schema import Config



@dataclass(frozen=True)
class Field:
    key: str  # dotted path, e.g. "algo.epsilon"
    type: Any  # the annotation
    kind: str  # "section" (a nested dataclass) | "dict" (free-form below) | "value"


def schema_index(cls: type, prefix: str = "", out: Optional[dict[str, Field]] = None) -> dict[str, Field]:
    out = {} if out is None else out
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out[key] = Field(key, tp, "section")
            schema_index(tp, key + ".", out)
        elif typing.get_origin(tp) is dict or tp is dict:
            out[key] = Field(key, tp, "dict")
        else:
            out[key] = Field(key, tp, "value")
    return out


INDEX = schema_index(Config)
ROOT = Field("", Config, "section")

# Names people carry over from other trainers; checked before fuzzy matching.
ALIASES = {
    "lr": "train.learning_rate",
    "max_steps": "train.steps",
    "seed": "train.seed",
    "clip_range": "algo.epsilon",
    "epsilon_low": "algo.epsilon",
    "clip_ratio_low": "algo.epsilon",
    "clip_ratio_high": "algo.epsilon_high",
    "kl_coef": "algo.beta",
    "group_size": "rollout.num_generations",
    "n": "rollout.num_generations",
    "max_new_tokens": "rollout.max_completion_length",
    "model_name_or_path": "model.path",
    "output_dir": "log.output_dir",
}


def classify(key: str) -> Optional[Field]:
    """The schema field that owns ``key``: itself, or the dict field it lies below; else None."""
    if key == "":
        return ROOT
    if key in INDEX:
        return INDEX[key]
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        owner = INDEX.get(".".join(parts[:i]))
        if owner is not None:
            return owner if owner.kind == "dict" else None
    return None


def suggest(key: str) -> list[str]:
    """Closest valid keys: same leaf name elsewhere (nesting mistake), alias, then fuzzy match."""
    leaf = key.rsplit(".", 1)[-1]
    valid = [k for k in INDEX if k != key]

    def closeness(k: str) -> float:
        return difflib.SequenceMatcher(None, key, k).ratio()

    same_leaf = [k for k in valid if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:  # e.g. num_generations lives in both rollout and eval: offer both
        return sorted(same_leaf, key=closeness, reverse=True)[:3]
    if leaf in ALIASES:
        return [ALIASES[leaf]]
    parent = key.rpartition(".")[0]
    siblings = [k for k in valid if k.rpartition(".")[0] == parent]
    for pool in (siblings, valid):
        close = difflib.get_close_matches(key, pool, n=1, cutoff=0.6)
        if close:
            return close
    leaves: dict[str, list[str]] = {}
    for k in valid:
        leaves.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    if close:
        return [max(leaves[close[0]], key=closeness)]
    return []


def type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}" if args else "mapping"
    if tp is Any:
        return "any value"
    if dataclasses.is_dataclass(tp):
        return "section (a mapping of its keys)"
    return getattr(tp, "__name__", str(tp))


def expected_type(key: str) -> str:
    field = classify(key)
    if field is None:
        return "?"
    if field.key == key or field.kind != "dict":
        return type_name(field.type)
    args = typing.get_args(field.type)
    # One level below a dict field the value type applies; deeper down it is free-form.
    depth = key.count(".") - field.key.count(".")
    return type_name(args[1]) if args and depth == 1 else "any value"


