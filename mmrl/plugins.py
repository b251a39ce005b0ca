"""Plugin discovery: the built-in registrations, installed plugin packages and plugin files.

Built-in tasks and rewards are plugins exactly like a user's: they live in the ``mmrl.tasks`` and
``mmrl.rewards`` packages (the repository's ``tasks/`` and ``rewards/`` folders) and register
themselves on import. The library's own named choices (estimators, losses, samplers, engines ...)
register when their modules are imported. Other plugins come from the ``mmrl.plugins``
entry-point group of any installed package, or from module names / ``.py`` paths listed in the
config's ``plugins`` key.

Importing :mod:`mmrl` installs :func:`load_plugins` as the registries' loader, so the first
registry lookup imports everything; the registry itself imports nothing of mmrl (no import circle).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterable

from .registry import set_plugin_loader

# Library modules whose import registers built-in choices (estimators, losses, samplers ...).
BUILTIN_MODULES = (
    "mmrl.core.advantages",
    "mmrl.core.losses",
    "mmrl.core.batch",
    "mmrl.core.schedules",
    "mmrl.media.perturb",
    "mmrl.diffusion.sde",
    "mmrl.diffusion.losses",
    "mmrl.vlm.engines",
    "mmrl.envs",
)  # the policies register when their registry is first consulted (mmrl.registry.POLICIES)
BUILTIN_PACKAGES = ("mmrl.tasks", "mmrl.rewards")
_loaded: set[str] = set()


def _import_package_modules(package: str) -> None:
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def import_plugin(spec: str) -> None:
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
    """Import the built-in registrations and plugins, installed ``mmrl.plugins`` entry points,
    then ``extra`` (each at most once)."""
    if "builtin" not in _loaded:
        _loaded.add("builtin")
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        for package in BUILTIN_PACKAGES:
            _import_package_modules(package)
        for ep in metadata.entry_points(group="mmrl.plugins"):
            ep.load()
    for spec in extra:
        if spec not in _loaded:
            import_plugin(spec)
            _loaded.add(spec)


set_plugin_loader(load_plugins)
