"""Name -> object registries for tasks, rewards, advantage estimators and data samplers, and plugin discovery.

Built-in tasks and rewards are plugins exactly like a user's: they live in the ``mmrl.tasks`` and
``mmrl.rewards`` packages (the repository's ``tasks/`` and ``rewards/`` folders) and register
themselves on import. Other plugins come from the ``mmrl.plugins`` entry-point group of any
installed package, or from module names / ``.py`` paths listed in the config's ``plugins`` key.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A registry lookup failed; the message names the closest known names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T) -> T:
        if name in self._items and self._items[name] is not obj:
            existing = self._items[name]
            # Re-importing the same module (e.g. a plugin file loaded twice) is harmless.
            if getattr(existing, "__qualname__", None) != getattr(obj, "__qualname__", object()):
                raise ValueError(f"{self.kind} {name!r} is already registered by {existing!r}")
        self._items[name] = obj
        return obj

    def get(self, name: str) -> T:
        load_plugins()
        if name not in self._items:
            close = difflib.get_close_matches(name, self._items, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(self._items))})"
            )
        return self._items[name]

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        load_plugins()
        return name in self._items


TASKS: Registry[type] = Registry("task")
REWARDS: Registry[Callable[..., Any]] = Registry("reward")
ADVANTAGES: Registry[Callable[..., Any]] = Registry("advantage estimator")
SAMPLERS: Registry[type] = Registry("data sampler")


def register_task(name: str):
    """Class decorator: ``@register_task("counting")`` makes the task available by name."""

    def wrap(cls):
        cls.name = name
        return TASKS.register(name, cls)

    return wrap


def register_reward(name: str, minimum: float = 0.0, check: Callable[..., None] | None = None):
    """Function decorator for a batched reward ``fn(completions, examples, **ctx) -> list``.

    A reward returns one float per completion, or ``None`` where the text cannot be parsed;
    ``None`` scores ``minimum`` and is counted in the run's metrics. ``check(**reward_kwargs)``
    (optional) validates the reward's configuration (e.g. that a weights path exists) when the
    run is set up, so a misconfigured reward stops the run before training instead of scoring
    every batch at its minimum.
    """

    def wrap(fn):
        fn.reward_name = name
        fn.reward_minimum = minimum
        fn.reward_check = check
        return REWARDS.register(name, fn)

    return wrap


def register_advantage(name: str, inputs: tuple[str, ...] = ()):
    """Function decorator for an advantage estimator (see :mod:`mmrl.core.advantages`).

    ``inputs`` names the per-batch values the estimator needs beyond rewards and group ids, which
    the trainer supplies as keyword arguments: ``lengths`` (actions per sample), ``prompt_keys``
    (a stable id per sample's prompt), ``task_ids`` (the data source of each sample), ``r_max``
    (the best reachable total reward), ``policy_kl`` (KL(pi_old || pi_new) of the last update).
    """

    def wrap(fn):
        fn.estimator_name = name
        fn.estimator_inputs = tuple(inputs)
        return ADVANTAGES.register(name, fn)

    return wrap


def register_sampler(name: str):
    """Class decorator for a prompt sampler (``data.sampler``; see :mod:`mmrl.core.samplers`)."""

    def wrap(cls):
        cls.name = name
        return SAMPLERS.register(name, cls)

    return wrap


_BUILTIN_PACKAGES = ("mmrl.tasks", "mmrl.rewards")
_loaded: set[str] = set()


def _import_package_modules(package: str) -> None:
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def _import_plugin(spec: str) -> None:
    """Import a plugin given as a module name or a path to a ``.py`` file."""
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"plugin file {spec!r} does not exist")
        mod_name = f"mmrl_plugin_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)


def load_plugins(extra: Iterable[str] = ()) -> None:
    """Import built-in plugins, installed ``mmrl.plugins`` entry points, then ``extra``."""
    if "builtin" not in _loaded:
        _loaded.add("builtin")
        import mmrl.core.advantages  # noqa: F401  (registers the estimators)

        for package in _BUILTIN_PACKAGES:
            _import_package_modules(package)
        for ep in metadata.entry_points(group="mmrl.plugins"):
            ep.load()
    for spec in extra:
        if spec not in _loaded:
            _import_plugin(spec)
            _loaded.add(spec)
