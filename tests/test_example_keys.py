"""The example keys that pass between layers are declared once (:class:`mmrl.core.example.Example`).

The rule: in the core (``mmrl/core/``) and in the interactions its agent loop drives
(``mmrl/*/interaction.py``), every string-literal read of an example dict names a declared key. An
example dict is an expression named ``ex``, ``example``, ``row`` or ``spec`` (the names these
modules give an example), or an item of anything named ``examples`` (``examples[i]``,
``batch.examples[0]``); a read is ``E["key"]``, ``E.get("key", ...)``, ``E.pop("key", ...)`` or
``"key" in E`` / ``not in E``. Keys read through a variable are not checked. Writes are free: a
task may put any key of its own on its examples; only what the shared layers read is a contract.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mmrl.core.example import SHARED_KEYS, Example

REPO = Path(__file__).resolve().parent.parent
MMRL = REPO / "mmrl"
EXAMPLE_NAMES = {"ex", "example", "row", "spec"}


def _scope() -> list[Path]:
    return sorted({*(MMRL / "core").rglob("*.py"), *MMRL.glob("*/interaction.py")})


def _is_example(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in EXAMPLE_NAMES
    if isinstance(node, ast.Subscript):
        items = node.value
        return (isinstance(items, ast.Name) and items.id == "examples") or (
            isinstance(items, ast.Attribute) and items.attr == "examples")
    return False


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def example_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, key)`` of every string-literal read of an example dict in ``tree`` (module docstring)."""
    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_example(node.value) and (key := _literal(node.slice)):
            reads.append((node.lineno, key))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop")
              and _is_example(node.func.value) and node.args and (key := _literal(node.args[0]))):
            reads.append((node.lineno, key))
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and _is_example(node.comparators[0]) and (key := _literal(node.left))):
            reads.append((node.lineno, key))
    return sorted(reads)


def test_the_core_and_the_interactions_read_only_declared_example_keys():
    undeclared = [f"{path.relative_to(REPO)}:{line}: {key!r}" for path in _scope()
                  for line, key in example_reads(ast.parse(path.read_text())) if key not in SHARED_KEYS]
    assert not undeclared, ("example keys read but not declared in mmrl/core/example.py (declare each, with a "
                            "docstring, or keep a task's own key in the task):\n" + "\n".join(undeclared))


def test_the_rule_covers_the_agent_loop_and_its_interactions():
    names = {path.relative_to(MMRL).as_posix() for path in _scope()}
    assert {"core/agent_loop.py", "core/episodes.py", "envs/interaction.py", "tools/interaction.py"} <= names
    read = {key for path in _scope() for _, key in example_reads(ast.parse(path.read_text()))}
    assert {"_index", "source", "episode_id", "step_index", "anchor_key", "episode_success", "task", "image"} <= read


@pytest.mark.slow
def test_every_declared_key_has_a_docstring_and_a_user():
    """Each key of the record is followed by its docstring, and some module of mmrl other than the
    record names it (a declared key nobody writes or reads is a dead contract)."""
    tree = ast.parse((MMRL / "core" / "example.py").read_text())
    [cls] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Example"]
    documented = {stmt.target.id for stmt, after in zip(cls.body, cls.body[1:])
                  if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr) and _literal(after.value)}
    assert documented == set(Example.__annotations__) == SHARED_KEYS
    named = {node.value for path in MMRL.rglob("*.py") if path.name != "example.py"
             for node in ast.walk(ast.parse(path.read_text())) if _literal(node)}
    assert SHARED_KEYS <= named, f"declared but named nowhere: {sorted(SHARED_KEYS - named)}"


def test_the_check_sees_what_it_looks_for():
    tree = ast.parse('a = ex["answer"]\nb = example.get("box", None)\nc = "hint" in row\nd = batch.examples[0]["k"]\n'
                     'e = examples[i].pop("p")\nf = spec["task"]\ng = other["no"]\nh = ex[key]\ni = "x" not in ex\n')
    assert example_reads(tree) == [(1, "answer"), (2, "box"), (3, "hint"), (4, "k"), (5, "p"), (6, "task"), (9, "x")]
