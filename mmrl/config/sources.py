"""Where a run config's values come from, each with its origin: YAML recipes (found by path or by
built-in name, read with line numbers, inheriting through ``base:``) and dotted command-line
overrides, as ``(key, value, where)`` items that :func:`mmrl.config.load_config` merges.

The origin is what makes a config error useful: every :class:`ConfigError` names the key, the file
and line (or the override) it came from, and the key probably meant.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import yaml

from mmrl.config.keys import INDEX, classify, suggest

__all__ = ["ConfigError", "Item", "yaml_items", "override_items", "resolve_recipe", "builtin_config_names",
           "builtin_config_path"]


class ConfigError(ValueError):
    """A config problem the user must fix: unknown key, bad type, missing file, bad override."""


# --------------------------------------------------------------------------------------------
# YAML loading with line numbers
# --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats and no timestamps.

    PyYAML follows YAML 1.1, where ``1e-5`` is a *string* (it wants ``1.0e-5``) and ``2024-01-01``
    becomes a ``date``. Both surprise people writing learning rates and run names; OmegaConf's
    own loader makes the same two fixes, so values behave the same as in ``OmegaConf.load``.
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:
         [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)

_NULL_TAG = "tag:yaml.org,2002:null"
# A value starting with "{}" and more text (task.options.image_template={}.jpg) is a path template,
# which YAML cannot parse (a flow mapping followed by text): the shell strips quotes, so it is taken
# as the string it is rather than asking for '"{}.jpg"' inside shell quotes.
_TEMPLATE = re.compile(r"\{\}\S")


def _compose(text: str, name: str) -> tuple[_Loader, Optional[yaml.Node]]:
    """Parse ``text`` into a node tree (with marks) and return the loader to construct values."""
    loader = _Loader(text)
    loader.name = name  # parse errors then say "in configs/x.yaml, line 3" instead of "<unicode string>"
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        loader.dispose()
        raise ConfigError(f"cannot parse {name}: {exc}") from None
    return loader, node


def _is_null(node: Optional[yaml.Node]) -> bool:
    return node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG)


# --------------------------------------------------------------------------------------------
# Collecting (key, value, origin) items from YAML files and overrides
# --------------------------------------------------------------------------------------------


@dataclass
class Item:
    key: str
    value: Any
    where: str  # "configs/x.yaml, line 4" or "on the command line: a.b=c"
    replace: bool = False  # a whole dict from the command line: it replaces the recipe's, not merged into it


def _unknown(key: str, where: str) -> ConfigError:
    msg = f"unknown config key '{key}' ({where})"
    suggestions = suggest(key)
    if suggestions:
        msg += "; did you mean " + " or ".join(f"'{k}'" for k in suggestions) + "?"
    else:
        msg += "; valid top-level keys: " + ", ".join(k for k in INDEX if "." not in k)
    return ConfigError(msg)


def _collect(
    loader: _Loader,
    node: Optional[yaml.Node],
    prefix: str,
    where: Callable[[yaml.Node], str],
    items: list[Item],
    locations: dict[str, str],
    skip_root: Sequence[str] = (),
) -> None:
    """Walk the mapping ``node`` that sets section ``prefix``, checking every key on the way.

    Keys inside a YAML mapping may themselves be dotted (``algo.epsilon: 0.2``); they are treated
    as nested. Values of dict-typed fields are taken whole (their keys are free-form), but the
    locations of their sub-keys are remembered so a type error inside them points at its line.
    """
    if _is_null(node):
        return  # "model:" with everything below commented out
    if not isinstance(node, yaml.MappingNode):
        value = loader.construct_object(node, deep=True)
        example = next(k for k in INDEX if k.startswith(prefix + ".")) if prefix else "train.steps"
        raise ConfigError(
            f"config key '{prefix or '<root>'}' ({where(node)}) is a section and must be a mapping of "
            f"its keys, got {value!r}; set a key inside it, e.g. '{example}'"
        )
    loader.flatten_mapping(node)  # resolve YAML merge keys ("<<: *defaults")
    for k_node, v_node in node.value:
        key = loader.construct_object(k_node, deep=True)
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r} ({where(k_node)})")
        if not prefix and key in skip_root:
            continue
        path = f"{prefix}.{key}" if prefix else key
        field = classify(path)
        if field is None:
            raise _unknown(path, where(k_node))
        locations[path] = where(k_node)  # the last file to set a key is the one whose value stands
        if field.kind == "section" and field.key == path:
            _collect(loader, v_node, path, where, items, locations)
        else:
            _remember_locations(loader, v_node, path, where, locations)
            items.append(Item(path, loader.construct_object(v_node, deep=True), where(k_node)))


def _remember_locations(loader: _Loader, node: yaml.Node, prefix: str, where: Callable, locations: dict) -> None:
    if isinstance(node, yaml.MappingNode):
        for k_node, v_node in node.value:
            if isinstance(k_node, yaml.ScalarNode):
                path = f"{prefix}.{k_node.value}"
                locations[path] = where(k_node)
                _remember_locations(loader, v_node, path, where, locations)


def resolve_recipe(path: Union[str, Path], relative_to: Optional[Path] = None) -> Optional[Path]:
    """A recipe file: relative to the including recipe, as given, then a built-in name."""
    p = Path(path).expanduser()
    if relative_to is not None and not p.is_absolute():
        cand = relative_to / p
        if cand.is_file():
            return cand
    if p.is_file():
        return p
    try:
        return builtin_config_path(str(path))
    except ConfigError:
        return None


def yaml_items(path: Path, items: list[Item], locations: dict[str, str], stack: tuple[Path, ...] = ()) -> None:
    """Items of ``path`` and (first) of its ``base:`` chain, in the order they must be applied."""
    resolved = path.resolve()
    if resolved in stack:
        chain = " -> ".join(str(p) for p in (*stack, resolved))
        raise ConfigError(f"config 'base:' cycle: {chain}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    loader, node = _compose(text, str(path))
    try:

        def where(n: yaml.Node) -> str:
            return f"{path}, line {n.start_mark.line + 1}"

        if _is_null(node):
            return
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"config file {path} must contain a mapping of keys at the top level")
        loader.flatten_mapping(node)
        for k_node, v_node in node.value:
            if isinstance(k_node, yaml.ScalarNode) and k_node.value == "base":
                bases = loader.construct_object(v_node, deep=True)
                bases = [bases] if isinstance(bases, str) else bases
                if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
                    raise ConfigError(f"'base' must be a recipe path or a list of them ({where(k_node)})")
                for b in bases:
                    base_path = resolve_recipe(b, relative_to=path.parent)
                    if base_path is None:
                        raise ConfigError(
                            f"base recipe '{b}' not found ({where(k_node)}); looked for "
                            f"{path.parent / b} and a built-in recipe of that name"
                        )
                    yaml_items(base_path, items, locations, (*stack, resolved))
        _collect(loader, node, "", where, items, locations, skip_root=("base",))
    finally:
        loader.dispose()


def override_items(override: str, items: list[Item], locations: dict[str, str]) -> None:
    if not isinstance(override, str) or "=" not in override:
        raise ConfigError(
            f"malformed override {override!r}: expected the form key=value, e.g. algo.epsilon_high=0.28"
        )
    key, _, text = override.partition("=")
    key = key.strip()
    if key.startswith("--"):
        key = key[2:]
    if not key:
        raise ConfigError(f"malformed override {override!r}: expected the form key=value (the key is empty)")
    where_str = f"on the command line: {override}"
    field = classify(key)
    if field is None:
        raise _unknown(key, where_str)
    if _TEMPLATE.match(text.strip()):
        locations[key] = where_str
        items.append(Item(key, text.strip(), where_str))
        return
    loader, node = _compose(text, f"the value of override {override!r}")
    try:
        locations[key] = where_str
        if field.kind == "section" and field.key == key:
            # algo={epsilon: 0.3, beta: 0.01}: check the keys inside like a YAML section.
            _collect(loader, node, key, lambda _n: where_str, items, locations)
        else:
            value = None if node is None else loader.construct_object(node, deep=True)
            # task.rewards={accuracy: 1.0} means exactly those rewards; task.rewards.format=0.5 changes one
            whole = field.kind == "dict" and field.key == key and isinstance(value, dict)
            items.append(Item(key, value, where_str, replace=whole))
    finally:
        loader.dispose()


def builtin_config_names() -> list[str]:
    """Names of the recipes shipped in ``mmrl.configs`` (``vlm/counting_tiny``, ...).

    ``configs/accelerate/`` sits beside them but holds ``accelerate launch --config_file`` files,
    which are accelerate's format, not mmrl recipes, so it is left out.
    """
    from mmrl.configs import CONFIGS_DIR

    names = []
    for p in sorted(CONFIGS_DIR.rglob("*")):
        if p.relative_to(CONFIGS_DIR).parts[0] == "accelerate":
            continue
        if p.suffix in (".yaml", ".yml") and p.is_file():
            names.append(p.relative_to(CONFIGS_DIR).with_suffix("").as_posix())
    return names


def builtin_config_path(name: Union[str, Path]) -> Path:
    """Resolve a recipe: an existing file path as is, else a name under ``mmrl.configs``.

    ``vlm/counting_tiny``, ``vlm/counting_tiny.yaml`` and ``configs/vlm/counting_tiny.yaml`` (the
    repo layout, which installs as the ``mmrl.configs`` package) all resolve to the same file.
    """
    from mmrl.configs import CONFIGS_DIR

    p = Path(name).expanduser()
    if p.is_file():
        return p
    rel = Path(name).as_posix()
    if rel.startswith("configs/"):
        rel = rel[len("configs/"):]
    cands = [CONFIGS_DIR / rel]
    if Path(rel).suffix not in (".yaml", ".yml"):
        cands += [CONFIGS_DIR / f"{rel}.yaml", CONFIGS_DIR / f"{rel}.yml"]
    for cand in cands:
        if cand.is_file():
            return cand
    names = builtin_config_names()
    msg = f"no config file or built-in recipe named '{name}'"
    close = difflib.get_close_matches(Path(rel).with_suffix("").as_posix(), names, n=1, cutoff=0.5)
    if close:
        msg += f"; did you mean '{close[0]}'?"
    if names:
        msg += " Built-in recipes: " + ", ".join(names)
    raise ConfigError(msg)
