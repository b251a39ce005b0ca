"""Benchmark protocols: a benchmark's files scored the way its official evaluation script scores
them, broken down the way its paper's table is, each number with a 95% bootstrap interval.

A :class:`Benchmark` names the task that reads the benchmark's files (the same readers training
uses), how one example is scored (``score``: the script's rule, e.g. ScreenSpot's click inside the
element's box, VLM-R1's IoU > 0.5), which cells of the table an example counts in (``cells``:
"mobile text", "CAD icon", "counting"), and which cells are averages of other cells (``macro``:
SeeClick's ScreenSpot average is the mean of its six cells, not of its examples). A benchmark
may take command-line ``settings`` of its scoring (GenEval's ``--clip``: colours by CLIP instead
of pixels), bound by :func:`configured`. Plugins add benchmarks with :func:`register_benchmark`;
``mmrl eval TARGET --benchmark NAME --data PATH`` runs one (:func:`benchmark_table` builds the
table from a finished evaluation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Mapping, Optional, Sequence

from ..registry import BENCHMARKS

ALL = "all"  # the cell every example counts in (a per-file benchmark's row is then the file)


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str  # the benchmark and the script (or paper table) its metric and breakdown follow
    task: str  # the registered task that reads the benchmark's files
    score: Callable[[object, list, list], list[dict[str, float]]]  # (task, completions, examples) -> each one's metrics
    cells: Callable[[dict], Sequence[str]]  # the table cells an example counts in
    metrics: tuple[str, ...] = ("accuracy",)
    order: tuple[str, ...] = ()  # the cells in the paper's order; cells not listed follow, sorted
    # cell -> the cells it averages, or a function choosing them from the cells present (names -> names)
    macro: Mapping[str, tuple[str, ...] | Callable[[Sequence[str]], Sequence[str]]] = field(default_factory=dict)
    options: Callable[[Optional[str], Optional[str]], dict] = lambda data, root: {"eval_path": data, "image_root": root}
    per_file: bool = False  # each data file is its own split: one row per file (VLM-R1's RefCOCO files)
    needs_data: bool = True
    # a keyword setting of ``score`` given on the command line (``--clip``) -> its parser from the
    # command-line text; ``str`` of the parsed value says what it changes (it joins the title)
    settings: Mapping[str, Callable[[str], object]] = field(default_factory=dict)


def register_benchmark(benchmark: Benchmark, override: bool = False) -> Benchmark:
    """Make ``benchmark`` available to ``mmrl eval --benchmark`` under its name."""
    return BENCHMARKS.register(benchmark.name, benchmark, override)


def configured(bench: Benchmark, settings: Mapping[str, str]) -> Benchmark:
    """``bench`` with command-line ``settings`` (``{"clip": "ViT-L-14=/weights/clip.pt"}``) parsed
    by its own parsers and given to its ``score``, each named in the title. A setting it does not
    take is an error naming those it does."""
    unknown = sorted(set(settings) - set(bench.settings))
    if unknown:
        takes = ", ".join(f"--{k}" for k in bench.settings) or "none"
        raise ValueError(f"benchmark {bench.name!r} takes no {', '.join('--' + k for k in unknown)} "
                         f"(its settings: {takes})")
    if not settings:
        return bench
    parsed = {k: bench.settings[k](v) for k, v in settings.items()}
    title = "; ".join([bench.title, *map(str, parsed.values())])
    return replace(bench, score=partial(bench.score, **parsed), title=title)


def benchmark_table(bench: Benchmark, task, completions: list, examples: list,
                    split: Optional[str] = None) -> list[dict]:
    """The rows of ``bench``'s table for one evaluation (one sample per example): per cell the
    number of examples ``n``, each metric's mean and its interval under ``<metric>_ci`` (a
    percentile bootstrap over the cell's examples; a macro cell's is stratified over the cells
    it averages). ``split`` (a per-file benchmark's file) prefixes the cell names."""
    from ..measures.intervals import mean_interval, stratified_mean_interval

    scores = bench.score(task, completions, examples)
    values: dict[str, dict[str, list[float]]] = {}
    for ex, s in zip(examples, scores):
        for cell in bench.cells(ex):
            for m in bench.metrics:
                values.setdefault(cell, {}).setdefault(m, []).append(float(s[m]))
    names = [c for c in bench.order if c in values or c in bench.macro]
    names += sorted(c for c in values if c not in names)
    rows = []
    for cell in names:
        row: dict = {"cell": cell if split is None else (split if cell == ALL else f"{split} {cell}")}
        if cell in bench.macro:
            members = bench.macro[cell]
            members = members(sorted(values)) if callable(members) else members
            parts = [values[c] for c in members if c in values]
            row["n"] = sum(len(p[bench.metrics[0]]) for p in parts)
            for m in bench.metrics:
                means = [sum(p[m]) / len(p[m]) for p in parts]
                row[m] = sum(means) / len(means) if means else math.nan
                row[f"{m}_ci"] = stratified_mean_interval([p[m] for p in parts])
        else:
            row["n"] = len(values[cell][bench.metrics[0]])
            for m in bench.metrics:
                v = values[cell][m]
                row[m], row[f"{m}_ci"] = sum(v) / len(v), mean_interval(v)
        rows.append(row)
    return rows


def format_table(bench: Benchmark, rows: list[dict]) -> str:
    """The table as text: one row per cell, each metric as ``value [low, high]`` in percent, the
    way the papers print them."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{bench.title} (95% bootstrap intervals)")
    table.add_column("")
    table.add_column("n", justify="right")
    for m in bench.metrics:
        table.add_column(m, justify="right")
    for row in rows:
        cells = [f"{100 * row[m]:.1f} [{100 * row[f'{m}_ci'][0]:.1f}, {100 * row[f'{m}_ci'][1]:.1f}]"
                 if math.isfinite(row[m]) else "-" for m in bench.metrics]
        table.add_row(row["cell"], str(row["n"]), *cells)
    console = Console(width=120, color_system=None, force_terminal=False, record=True)
    with console.capture() as capture:
        console.print(table)
    return capture.get()
