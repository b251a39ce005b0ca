"""The plugin boundary: built-in tasks and rewards import only mmrl's public modules.

Every ``import`` of every ``.py`` file in ``tasks/`` and ``rewards/`` (module level and inside
functions) is checked against :data:`mmrl.public.PUBLIC_MODULES`:

- an ``mmrl...`` module must be public (listed, or inside a listed package, no private part);
- a plugin may import private helper modules (``_name.py``) of its own package only;
- no task imports another task module or a reward module; no reward imports another reward
  module or a task module (what they share lives in mmrl's public modules).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from mmrl.public import PUBLIC_MODULES, is_public

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_PACKAGES = {"tasks": "mmrl.tasks", "rewards": "mmrl.rewards"}  # folder -> installed package


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _installed_name(name: str) -> str:
    """``tasks.x`` / ``rewards.x`` (the repository folders) as the installed ``mmrl.tasks.x``."""
    head, _, rest = name.partition(".")
    if head in PLUGIN_PACKAGES:
        return PLUGIN_PACKAGES[head] + (f".{rest}" if rest else "")
    return name


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``source`` (a module of ``package``), relative
    imports resolved; ``from pkg import name`` counts as importing ``pkg.name`` when that is a
    module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, _installed_name(a.name)) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = _installed_name(node.module or "")
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append((node.lineno, sub if module.startswith("mmrl") and _is_module(sub) else module))
    return sorted(set(out))


def violation(module: str, package: str) -> str | None:
    """Why a module of plugin package ``package`` may not import ``module``; None when it may."""
    if module != "mmrl" and not module.startswith("mmrl."):
        return None  # not mmrl (the standard library, PIL, numpy, ...)
    others = [p for p in PLUGIN_PACKAGES.values() if p != package]
    kind = package.rsplit(".", 1)[-1][:-1]  # "task" / "reward"
    for other in others:
        if module == other or module.startswith(other + "."):
            return f"a {kind} imports the {other.rsplit('.', 1)[-1]} plugin package"
    if module == package or module.startswith(package + "."):
        rest = module[len(package) + 1:].split(".") if module != package else []
        if len(rest) == 1 and rest[0].startswith("_"):
            return None  # its own package's private helper module
        return f"a {kind} imports another {kind} module (share through mmrl's public modules)"
    if not is_public(module):
        return f"not a public module (public: {', '.join(PUBLIC_MODULES)})"
    return None


def boundary_violations(root: Path = ROOT) -> list[str]:
    found = []
    for folder, package in PLUGIN_PACKAGES.items():
        for path in sorted((root / folder).glob("*.py")):
            for line, module in imported_modules(path.read_text(encoding="utf-8"), package):
                why = violation(module, package)
                if why is not None:
                    found.append(f"{path.relative_to(root)}:{line}: imports {module}: {why}")
    return found


def test_plugins_import_only_public_modules():
    found = boundary_violations()
    assert not found, "plugin boundary violations:\n" + "\n".join(found)


def test_every_public_module_exists():
    for name in PUBLIC_MODULES:
        assert _is_module(name), name


def test_nothing_is_public_that_no_builtin_plugin_needs():
    """The public surface is what plugins need and no more: each listed module is imported by a
    built-in task or reward (the root ``mmrl``, whose names are its own API, included)."""
    used = {module for folder, package in PLUGIN_PACKAGES.items() for path in (ROOT / folder).glob("*.py")
            for _, module in imported_modules(path.read_text(encoding="utf-8"), package)}
    assert sorted(set(PUBLIC_MODULES) - used) == []


@pytest.mark.parametrize("module, package, ok", [
    ("mmrl", "mmrl.tasks", True),
    ("mmrl.parsing", "mmrl.tasks", True),
    ("mmrl.measures.boxes", "mmrl.rewards", True),  # listed
    ("mmrl.media.coords", "mmrl.tasks", True),
    ("mmrl.core.policy", "mmrl.rewards", False),  # internal
    ("mmrl.registry", "mmrl.tasks", False),
    ("mmrl.data._private", "mmrl.tasks", False),  # a private module inside a public package
    ("mmrl.tasks._helpers", "mmrl.tasks", True),  # own package's private helper
    ("mmrl.rewards._helpers", "mmrl.tasks", False),  # another package's private helper
    ("mmrl.tasks.counting", "mmrl.tasks", False),  # task -> task
    ("mmrl.rewards.iou", "mmrl.tasks", False),  # task -> reward
    ("mmrl.tasks.counting", "mmrl.rewards", False),  # reward -> task
    ("numpy", "mmrl.tasks", True),
])
def test_rule(module, package, ok):
    assert (violation(module, package) is None) is ok


def test_imports_inside_functions_and_relative_ones_are_seen():
    source = ("from mmrl import Task\n"
              "from . import _draw\n"
              "def f():\n"
              "    from mmrl.core.policy import pick_device\n"
              "    import tasks.counting\n")
    found = imported_modules(source, "mmrl.tasks")
    assert (4, "mmrl.core.policy") in found and (5, "mmrl.tasks.counting") in found
    assert (2, "mmrl.tasks._draw") in found or (2, "mmrl.tasks") in found
