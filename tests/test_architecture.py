"""The layout shows the architecture: no import circles, modules of readable size, every named
choice of a config listed by `mmrl list`, and a trainer that knows no modality."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package name -> folder (tasks/ and rewards/ install as mmrl.tasks and mmrl.rewards)
PACKAGES = {"mmrl": ROOT / "mmrl", "mmrl.tasks": ROOT / "tasks", "mmrl.rewards": ROOT / "rewards"}
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            name = ".".join((pkg, *rel))
            mods[name.removesuffix(".__init__")] = path
    return mods


def _import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (module-level and function-level imports alike);
    importing one's own parent package is not an edge (as Python resolves it, the parent is
    already being imported)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = mod.split(".")
                if node.level:
                    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod and not mod.startswith(t + "."):
                    edges[mod].add(t)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    cycles = _cycles(_import_graph(_modules()))
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_circle_detector_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_module_is_over_the_size_limit():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_the_registry_imports_only_leaves_of_mmrl():
    """Every module registers into the registry, so nothing it imports may import anything of mmrl:
    the one import it has (``mmrl.media.clips``, wrapping image rewards for clips, stdlib only)
    must itself be a leaf, or a registration could start a circle."""
    graph = _import_graph(_modules())
    assert graph["mmrl.registry"] <= {"mmrl.media.clips"}
    for name in graph["mmrl.registry"]:
        assert graph[name] == set(), f"{name} (imported by the registry) imports {graph[name]}"


def test_the_trainer_knows_no_modality():
    """The loop and the batch pipeline never import a modality package or media code, and never
    probe the policy with hasattr (capabilities are declared and checked at setup)."""
    for name in ("mmrl.core.trainer", "mmrl.core.batch.pipeline", "mmrl.core.evaluation"):
        path = _modules()[name]
        imported = _import_graph(_modules())[name]
        assert not any(m.startswith(("mmrl.vlm", "mmrl.diffusion", "mmrl.media")) for m in imported), (name, imported)
        assert "hasattr(" not in path.read_text(), name


@pytest.mark.parametrize("title", ["tasks", "rewards", "advantage estimators", "losses", "data samplers (prompts)",
                                   "SDE samplers", "batch selections", "KL schedules", "image perturbations",
                                   "rollout engines"])
def test_mmrl_list_shows_every_named_choice(title):
    from typer.testing import CliRunner

    from mmrl.cli import app

    out = CliRunner().invoke(app, ["list"]).output
    line = next((row for row in out.splitlines() if row.startswith(f"{title}: ")), None)
    assert line is not None and len(line) > len(title) + 2, out
