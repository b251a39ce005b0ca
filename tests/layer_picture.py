"""The picture of mmrl's layers in docs/layout.md (``docs/layers.svg``), drawn from the code: one
band per layer of ``LAYERS`` (tests/test_architecture.py), bottom to top, each package with its
number of modules, and under it the layers below that it imports from (so only a module added,
removed or moved, or a layer newly imported, changes it).
``tests/test_architecture.py`` checks the file is what the code draws now; redraw it with
``python tests/layer_picture.py``."""

from __future__ import annotations

import html
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_architecture import LAYERS, ROOT, _import_graph, _modules, layer_of  # noqa: E402

PICTURE = ROOT / "docs" / "layers.svg"
WIDTH, BAND, GAP, LEFT = 1000, 74, 10, 175


def _package(module: str, members: tuple[str, ...]) -> str | None:
    """The member of a layer that ``module`` belongs to (the longest matching prefix)."""
    return max((m for m in members if module == m or module.startswith(m + ".")), key=len, default=None)


def draw() -> str:
    mods = _modules()
    graph = _import_graph(mods)
    down: dict[int, set[int]] = {i: set() for i in range(len(LAYERS))}
    for a, targets in graph.items():
        la = layer_of(a)
        for b in targets:
            lb = layer_of(b)
            if la is not None and lb is not None and lb < la:
                down[la].add(lb)
    height = len(LAYERS) * (BAND + GAP) + GAP
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{WIDTH}" height="{height}" fill="white"/>']
    for i, (name, members) in enumerate(LAYERS):
        y = height - (i + 1) * (BAND + GAP)
        shade = 235 - 12 * i
        out.append(f'<rect x="{GAP}" y="{y}" width="{WIDTH - 2 * GAP}" height="{BAND}" rx="6" '
                   f'fill="rgb({shade},{shade + 8},255)" stroke="#557"/>')
        out.append(f'<text x="{GAP + 8}" y="{y + 20}" font-weight="bold" font-size="14">{i}. {html.escape(name)}</text>')
        imports = ", ".join(LAYERS[j][0] for j in sorted(down[i], reverse=True))
        out.append(f'<text x="{GAP + 8}" y="{y + BAND - 10}" fill="#446">'
                   f'{html.escape("imports from: " + imports) if imports else "imports from no layer below"}</text>')
        x, row = LEFT, 0
        for member in members:
            own = [m for m in mods if _package(m, members) == member]
            label = f"{member.removeprefix('mmrl.')} ({len(own)})"
            width = 10 + round(6.6 * len(label))
            if x > LEFT and x + width > WIDTH - GAP:
                x, row = LEFT, row + 1
            out.append(f'<text x="{x}" y="{y + 20 + 16 * row}">{html.escape(label)}</text>')
            x += width
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    PICTURE.write_text(draw())
    print(f"wrote {PICTURE}")
