"""The layout shows the architecture: no import circles, modules of readable size, every named
choice of a config listed by `mmrl list`, and a trainer that knows no modality."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package name -> folder (tasks/ and rewards/ install as mmrl.tasks and mmrl.rewards)
PACKAGES = {"mmrl": ROOT / "mmrl", "mmrl.tasks": ROOT / "tasks", "mmrl.rewards": ROOT / "rewards"}
MAX_LINES = 400
MAX_CORE_LINES = 300  # the core is read top to bottom by newcomers: shorter still


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


# The layers, bottom to top (docs/layout.md): a module imports only from its own layer and those
# below it. A package is listed as a prefix of module names.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("mmrl.registry", "mmrl.config", "mmrl.parsing", "mmrl.extras", "mmrl.library_noise",
                    "mmrl.plugins")),
    ("data and media", ("mmrl.data", "mmrl.media", "mmrl.measures")),
    ("run directory", ("mmrl.runs",)),
    ("core", ("mmrl.core", "mmrl.task")),
    ("modalities", ("mmrl.vlm", "mmrl.diffusion", "mmrl.envs", "mmrl.tools")),
    ("built-in plugins", ("mmrl.tasks", "mmrl.rewards")),
    ("products", ("mmrl.api", "mmrl.public", "mmrl.bench", "mmrl.eval_protocols", "mmrl.demo", "mmrl.cli",
                  "mmrl.__main__")),
]
# Imports that run up the layers, each with why it is allowed; a new one fails the test.
KNOWN_UPWARD = {
    ("mmrl.registry", "mmrl.media.clips"): "register_reward(media='image') wraps the reward per frame; clips.py "
                                           "imports only the standard library (test_the_registry_imports_only_leaves_of_mmrl)",
}
MAX_ROOT_MODULES = 10


def layer_of(module: str) -> int | None:
    """The index in LAYERS of ``module``'s layer (the longest matching prefix); None for the
    package ``mmrl`` itself (its ``__init__`` is the facade that re-exports every layer)."""
    best = None
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if (module == m or module.startswith(m + ".")) and (best is None or len(m) > best[1]):
                best = (i, len(m))
    return best[0] if best else None


def test_every_module_is_in_a_layer():
    assert [m for m in _modules() if m != "mmrl" and layer_of(m) is None] == []


@pytest.mark.slow
def test_no_import_runs_up_the_layers():
    graph = _import_graph(_modules())
    up = sorted((a, b) for a, targets in graph.items() for b in targets
                if a != "mmrl" and layer_of(b) is not None and layer_of(a) is not None and layer_of(b) > layer_of(a))
    assert [pair for pair in up if pair not in KNOWN_UPWARD] == [], (
        "imports up the layers (move the imported code down, or the importer up; docs/layout.md)")
    assert set(KNOWN_UPWARD) <= set(up), f"remove from KNOWN_UPWARD: {sorted(set(KNOWN_UPWARD) - set(up))}"


def test_the_root_holds_at_most_ten_modules():
    root = sorted(p.name for p in (ROOT / "mmrl").glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at mmrl/'s root (put each in its layer's package): {root}"


@pytest.mark.slow
def test_the_layer_picture_is_drawn_from_the_code():
    from layer_picture import PICTURE, draw

    assert PICTURE.read_text() == draw(), "docs/layers.svg is stale: python tests/layer_picture.py"


@pytest.mark.slow
def test_no_import_circles():
    cycles = _cycles(_import_graph(_modules()))
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_circle_detector_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_module_is_over_the_size_limit():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_no_core_module_is_over_the_core_size_limit():
    long = {name: n for name, path in _modules().items()
            if name.startswith("mmrl.core.") and (n := len(path.read_text().splitlines())) > MAX_CORE_LINES}
    assert not long, f"core modules over {MAX_CORE_LINES} lines (split them by concern): {long}"


@pytest.mark.slow
def test_the_registry_imports_only_leaves_of_mmrl():
    """Every module registers into the registry, so nothing it imports may import anything of mmrl:
    the one import it has (``mmrl.media.clips``, wrapping image rewards for clips, stdlib only)
    must itself be a leaf, or a registration could start a circle."""
    graph = _import_graph(_modules())
    assert graph["mmrl.registry"] <= {"mmrl.media.clips"}
    for name in graph["mmrl.registry"]:
        assert graph[name] == set(), f"{name} (imported by the registry) imports {graph[name]}"


# What the core may not name: the modality packages, and the keys and attributes of media that only
# a policy or a task reads (a prompt's images, a clip's frames, a processor's pixel tensors).
MODALITY_PACKAGES = ("mmrl.vlm", "mmrl.diffusion", "mmrl.media", "mmrl.envs", "mmrl.tasks", "mmrl.rewards")
MEDIA_NAMES = frozenset({"image", "images", "video", "videos", "frames", "audio", "pixel_values",
                         "pixel_values_videos", "image_grid_thw", "video_grid_thw"})
# ``getattr(x, "name")`` probes in the core that are known and owned elsewhere: (module, attribute) -> why.
# Every entry is a request to the owner of the other side; a new probe fails the test.
KNOWN_PROBES = {
    ("mmrl.core.library_internals", "_no_split_modules"): "transformers' private attribute, read in the one "
                                                          "module that holds mmrl's uses of library internals",
}


def _core_modules() -> dict[str, Path]:
    return {name: path for name, path in _modules().items() if name == "mmrl.core" or name.startswith("mmrl.core.")}


def _media_names(tree: ast.AST) -> list[str]:
    """Where ``tree`` names media: a string constant (a dict key, a ``.get`` argument, a content
    type), an attribute (``clip.frames``) or a keyword argument (``replace(clip, frames=...)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MEDIA_NAMES:
            found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in MEDIA_NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in MEDIA_NAMES:
            found.append(f"line {node.value.lineno}: {node.arg}=")
    return found


def _getattr_probes(tree: ast.AST) -> list[tuple[str, int]]:
    """``getattr(obj, "literal", ...)``: asking an object whether it has an attribute instead of
    calling what its interface declares (a computed name, ``getattr(cfg, field.name)``, is fine)."""
    return [(node.args[1].value, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)]


@pytest.mark.slow
def test_the_trainer_knows_no_modality():
    """No module of the core (the loop, the batch pipeline, the rollouts, the rewards, the policy
    base) imports a modality package, media code, the environments or the plugins; none names the
    media a policy reads; none probes an object with ``hasattr`` or a literal ``getattr``:
    capabilities and hooks are declared (``Policy.capabilities``, the Task's methods) and called."""
    graph = _import_graph(_modules())
    problems = []
    for name, path in sorted(_core_modules().items()):
        text = path.read_text()
        tree = ast.parse(text)
        imported = sorted(m for m in graph[name] if m.startswith(MODALITY_PACKAGES))
        if imported:
            problems.append(f"{name} imports {imported}")
        if "hasattr(" in text:
            problems.append(f"{name} probes with hasattr(")
        probes = [f"getattr(..., {attr!r}) at line {line}" for attr, line in _getattr_probes(tree)
                  if (name, attr) not in KNOWN_PROBES]
        if probes:
            problems.append(f"{name} probes: {', '.join(probes)}")
        media = _media_names(tree)
        if media:
            problems.append(f"{name} names media ({', '.join(media)}): a policy or task hook should")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_known_probes_are_still_there():
    """An entry of KNOWN_PROBES whose probe is gone is removed, so the list only shrinks."""
    present = {(name, attr) for name, path in _core_modules().items()
               for attr, _ in _getattr_probes(ast.parse(path.read_text()))}
    assert set(KNOWN_PROBES) <= present, f"remove from KNOWN_PROBES: {sorted(set(KNOWN_PROBES) - present)}"


def test_the_checks_see_what_they_look_for():
    tree = ast.parse('clip = ex.get("video")\nn = len(clip.frames)\nx = replace(clip, frames=f)\n'
                     'subs = getattr(task, "sub_tasks", None)\nv = getattr(cfg, field.name)\ny = "clip"')
    assert _media_names(tree) == ["line 1: 'video'", "line 2: .frames", "line 3: frames="]
    assert _getattr_probes(tree) == [("sub_tasks", 4)]


@pytest.mark.parametrize("title", ["tasks", "rewards", "advantage estimators", "losses", "data samplers (prompts)",
                                   "SDE samplers", "batch selections", "KL schedules", "image perturbations",
                                   "rollout engines", "optimizers", "tools"])
def test_mmrl_list_shows_every_named_choice(title):
    from typer.testing import CliRunner

    from mmrl.cli import app

    out = CliRunner().invoke(app, ["list"]).output
    line = next((row for row in out.splitlines() if row.startswith(f"{title}: ")), None)
    assert line is not None and len(line) > len(title) + 2, out
