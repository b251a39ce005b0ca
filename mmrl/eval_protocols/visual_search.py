"""High-resolution perception, the benchmarks of "thinking with images", scored on trajectories
(a tool task's evaluation is one row per turn; each trajectory counts once, on its whole text).

- ``vstar``: V* Bench ("V*: Guided Visual Search as a Core Mechanism in Multimodal LLMs", Wu &
  Xie, 2023) as its ``vstar_bench_eval.py`` reports it: accuracy per category
  (``direct_attributes``, ``relative_position``) and overall over the examples (DeepEyes' table:
  Attr, Spatial, Overall). The script picks the option of lowest loss; here the trajectory's answer
  is read by DeepEyes' accuracy rule (the option's letter or its text, :func:`rule_judge`).
- ``hrbench``: HR-Bench 4K / 8K ("Divide, Conquer and Combine: A Training-Free Framework for
  High-Resolution Image Perception in Multimodal Large Language Models", Wang et al., 2024) as
  lmms-eval's ``hrbench`` task aggregates it: every question is asked in several cycles (its
  options rotated: ``cycle_category``), and a score is the mean over cycles of each cycle's mean
  accuracy: FSP (``single``-instance questions), FCP (``cross``-instance) and the average over all.
  lmms-eval has a GPT model read the answer's option letter; here the rule reads it.

Both read their files through the ``zoom_qa`` task (a V* folder, an HR-Bench table: ``.tsv`` as
shipped, parquet or JSON), so a run trained on ``zoom_qa`` is evaluated with its tools and budget.
"""

from __future__ import annotations

from ..measures.tool_use import deepeyes_parts
from . import Benchmark, register_benchmark

VSTAR_CELLS = {"direct_attributes": "Attr (direct_attributes)", "relative_position": "Spatial (relative_position)"}
HRBENCH_CELLS = {"single": "FSP (single)", "cross": "FCP (cross)"}


def _accuracy(task, completions, examples):
    """DeepEyes' accuracy term of each trajectory (0 for one without an answer)."""
    return [{"accuracy": float((deepeyes_parts(c, ex) or {}).get("accuracy", 0.0))} for c, ex in zip(completions, examples)]


def _cycle(ex: dict) -> str:
    return f"cycle {ex.get('cycle_category') or '0'}"


def _hrbench_cells(ex: dict) -> list[str]:
    """The example's cycle within its category and within all: the averaged cells are built from these."""
    return [f"{ex.get('category')} {_cycle(ex)}", _cycle(ex)]


def _cycles_of(prefix: str):
    return lambda names: [n for n in names if n.startswith(prefix + "cycle ")]


register_benchmark(Benchmark(
    "vstar", "V* Bench (vstar_bench_eval.py: per category, overall over the examples; answers read by rule)", "zoom_qa",
    _accuracy, lambda ex: [VSTAR_CELLS.get(str(ex.get("category")), str(ex.get("category"))), "overall"],
    order=(*VSTAR_CELLS.values(), "overall"),
    options=lambda data, root: {"eval_path": data}))

register_benchmark(Benchmark(
    "hrbench", "HR-Bench (lmms-eval's hrbench: the mean over cycles of each cycle's accuracy; answers read by rule)",
    "zoom_qa", _accuracy, _hrbench_cells, order=(*HRBENCH_CELLS.values(), "average"),
    macro={**{label: _cycles_of(f"{category} ") for category, label in HRBENCH_CELLS.items()},
           "average": _cycles_of("")},
    options=lambda data, root: {"eval_path": data}))

