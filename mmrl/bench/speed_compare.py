"""The like-for-like rows of mmrl against TRL's ``GRPOTrainer``, the order they run in, and the
statistics of their table (no trainer here: :mod:`mmrl.bench.speed` runs the rows).

Why pairs: a speed ratio means something only between runs that train the same parameters. A pair
holds mmrl's run(s) and TRL's with the vision tower trained on both sides, or frozen on both (with
LoRA: adapters on the language model on both sides, the tower left out by both); every run records
the parameters its optimizer steps, and the table prints them, so a pair that does not match shows.

Why TRL twice: once at its own defaults for what the bench does not share (``GRPOConfig``:
gradient checkpointing on, weights in float32 as its model loader's default, ``generate`` with the
dynamic cache) and once at the best its config offers for speed (weights in the compute dtype,
``model_init_kwargs``' ``dtype``; ``cache_implementation="static"``; gradient checkpointing off).
TRL's decode is uncompiled either way: TRL 1.16 builds its generation config with
``disable_compile=True`` (``trl/trainer/grpo_trainer.py``), which mmrl's compiled static-cache
decode does not (a real difference of the two trainers, named as such in the table).

Order: each repeat runs every row; even repeats in the given order, odd ones reversed (ABBA), so a
load that rises or falls during the bench hits each row alike on average and no side always goes
first. Statistics: a row's samples/s is taken per repeat (its measured steps' samples over their
time), and the table shows the median over the repeats with the min-max; a ratio is taken per
repeat (mmrl's repeat r over TRL's repeat r, run minutes apart), then its median and min-max.
Phases (generation, the rollout's old/reference log-probs, the rest of the rollout: rewards,
advantages, encoding; the update: forward, backward, optimizer step) are medians over every
measured step of every repeat.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from .speed_common import median_spread

TOWERS = ("trained", "frozen")
TRL_VARIANTS = ("defaults", "best")


@dataclass(frozen=True)
class TrlSettings:
    """What a TRL row sets beyond the settings both sides share."""

    gradient_checkpointing: bool
    weights: str  # "float32" (TRL's loader default) | "compute" (the bench's compute dtype)
    cache_implementation: str | None  # GRPOConfig.cache_implementation (None: generate's dynamic cache)


TRL_SETTINGS = {
    "defaults": TrlSettings(gradient_checkpointing=True, weights="float32", cache_implementation=None),
    "best": TrlSettings(gradient_checkpointing=False, weights="compute", cache_implementation="static"),
}


@dataclass(frozen=True)
class Row:
    """One run of the table: ``side`` mmrl or trl; ``variant`` the mmrl cache/engine label, or
    TRL's settings name (a key of :data:`TRL_SETTINGS`)."""

    pair: str
    name: str
    side: str
    tower: str
    variant: str


def pair_name(tower: str, lora: bool) -> str:
    return "LoRA, tower frozen" if lora else f"tower {tower}"


def rows_for(towers: Sequence[str], mmrl_variants: Sequence[str], trl_variants: Sequence[str],
             lora: bool = False) -> list[Row]:
    """The rows of each pair, mmrl's first (the first mmrl run draws the prompts every TRL run
    gets). With LoRA there is one pair: both sides leave the tower out of the adapters."""
    if bad := [t for t in towers if t not in TOWERS]:
        raise ValueError(f"--towers: unknown {', '.join(bad)} (known: {', '.join(TOWERS)})")
    if bad := [v for v in trl_variants if v not in TRL_SETTINGS]:
        raise ValueError(f"--trl: unknown {', '.join(bad)} (known: {', '.join(TRL_SETTINGS)})")
    if not towers or not mmrl_variants:
        raise ValueError("the comparison needs at least one tower setting and one mmrl run")
    rows = []
    for tower in ("frozen",) if lora else dict.fromkeys(towers):
        pair, suffix = pair_name(tower, lora), " LoRA" if lora else ""
        rows += [Row(pair, f"mmrl {v}".strip() + suffix, "mmrl", tower, v) for v in mmrl_variants]
        rows += [Row(pair, f"TRL {v}{suffix}", "trl", tower, v) for v in trl_variants]
    return rows


def run_order(rows: Sequence[Row], repeats: int) -> list[tuple[int, Row]]:
    """``(repeat, row)`` in the order they run: even repeats as given, odd repeats reversed."""
    return [(r, row) for r in range(repeats) for row in (rows if r % 2 == 0 else rows[::-1])]


# -- statistics ------------------------------------------------------------------------------------
def _per_repeat_rate(record: dict) -> float | None:
    s = record.get("summary")
    return s["samples_per_s"] if s else None


def _phase_medians(records: list[dict]) -> dict[str, float | None]:
    """Per-step medians of each phase over every measured step of ``records``."""
    steps = [(s, r, g, lp) for rec in records if rec.get("summary")
             for s, r, g, lp in zip(rec["step_s"], rec["rollout_s"], rec["generate_s"], rec["logprobs_s"])]
    if not steps:
        return {k: None for k in ("step_s", "generate_s", "logprobs_s", "other_rollout_s", "update_s")}
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return {"step_s": med([s for s, _, _, _ in steps]), "generate_s": med([g for _, _, g, _ in steps]),
            "logprobs_s": med([lp for _, _, _, lp in steps]),
            "other_rollout_s": med([r - g - lp for _, r, g, lp in steps]),
            "update_s": med([s - r for s, r, _, _ in steps])}


def compare(records: Sequence[dict]) -> dict[str, Any]:
    """The table's rows (first-seen order) and each pair's check, from one record per run.

    A record: ``pair``, ``name``, ``side``, ``variant``, ``repeat``, ``describe`` (weights,
    gradient checkpointing, decode), ``trained_params``, and ``summary`` with the measured steps'
    lists ``step_s``, ``rollout_s``, ``generate_s``, ``logprobs_s`` (no ``summary``: the run failed
    or was not run; its ``note`` says why).
    """
    by_row: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        by_row.setdefault((rec["pair"], rec["name"]), []).append(rec)
    rows = []
    for (pair, name), recs in by_row.items():
        done = [r for r in recs if r.get("summary")]
        peaks = [r["summary"]["peak_memory_gib"] for r in done if r["summary"].get("peak_memory_gib") is not None]
        params = sorted({r["trained_params"] for r in done if r.get("trained_params") is not None})
        rows.append({"pair": pair, "name": name, "side": recs[0]["side"], "variant": recs[0]["variant"],
                     "describe": recs[0].get("describe", {}), "repeats": len(done),
                     "samples_per_s": median_spread([_per_repeat_rate(r) for r in done]),
                     "phases": _phase_medians(done), "peak_memory_gib": max(peaks) if peaks else None,
                     "trained_params": params[0] if len(params) == 1 else (params or None),
                     "notes": sorted({r["note"] for r in recs if r.get("note")}), "vs_trl": {}, "memory_vs_trl": {}})
    for row in rows:
        if row["side"] != "mmrl":
            continue
        mine = {r["repeat"]: _per_repeat_rate(r) for r in by_row[(row["pair"], row["name"])] if r.get("summary")}
        for base in (b for b in rows if b["pair"] == row["pair"] and b["side"] == "trl"):
            theirs = {r["repeat"]: _per_repeat_rate(r) for r in by_row[(base["pair"], base["name"])]
                      if r.get("summary")}
            ratios = [mine[k] / theirs[k] for k in sorted(mine.keys() & theirs.keys()) if theirs[k]]
            row["vs_trl"][base["variant"]] = median_spread(ratios)
            if row["peak_memory_gib"] and base["peak_memory_gib"]:
                row["memory_vs_trl"][base["variant"]] = row["peak_memory_gib"] / base["peak_memory_gib"]
    pairs = {}
    for pair in dict.fromkeys(r["pair"] for r in rows):
        counts = [r["trained_params"] for r in rows if r["pair"] == pair and r["trained_params"] is not None]
        pairs[pair] = {"trained_params": counts[0] if counts else None,
                       "same_trained_params": bool(counts) and all(c == counts[0] and isinstance(c, int)
                                                                   for c in counts)}
    return {"rows": rows, "pairs": pairs}


# -- the table ---------------------------------------------------------------------------------------
HEADER = ("| pair | run | trained params | weights | grad. ckpt | decode | samples/s | x TRL defaults | x TRL best "
          "| generate s | log-probs s | other rollout s | update s | peak GiB | x TRL best mem |")


def _spread(v: dict | None, fmt: str) -> str:
    """``median (min-max)``; a single repeat has no spread."""
    if not v:
        return "-"
    if v["n"] == 1:
        return fmt.format(v["median"])
    return f"{fmt.format(v['median'])} ({fmt.format(v['min'])}-{fmt.format(v['max'])})"


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def markdown_table(table: dict[str, Any]) -> str:
    """One line per row; the pairs whose runs train different parameter counts named below it."""
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for r in table["rows"]:
        d, p = r["describe"], r["phases"]
        params = r["trained_params"]
        lines.append(
            f"| {r['pair']} | {r['name']} | {_f(params, '{:,}') if isinstance(params, int) or params is None else params}"
            f" | {d.get('weights', '?')} | {d.get('gradient_checkpointing', '?')} | {d.get('decode', '?')} | "
            f"{_spread(r['samples_per_s'], '{:.3g}')} | {_spread(r['vs_trl'].get('defaults'), '{:.2f}')} | "
            f"{_spread(r['vs_trl'].get('best'), '{:.2f}')} | {_f(p['generate_s'], '{:.3g}')} | "
            f"{_f(p['logprobs_s'], '{:.3g}')} | {_f(p['other_rollout_s'], '{:.3g}')} | {_f(p['update_s'], '{:.3g}')} | "
            f"{_f(r['peak_memory_gib'], '{:.3g}')} | {_f(r['memory_vs_trl'].get('best'), '{:.2f}')} |")
    for pair, check in table["pairs"].items():
        if not check["same_trained_params"]:
            lines.append(f"\n- pair {pair}: the runs do NOT train the same parameters (see trained params): "
                         "compare within a side only")
    for r in table["rows"]:
        for note in r["notes"]:
            lines.append(f"\n- {r['pair']}, {r['name']}: {note}")
    return "\n".join(lines) + "\n"


LEGEND = (
    "samples/s and x TRL: median over the repeats (min-max); a ratio is mmrl's repeat over TRL's same repeat, "
    "the rows of each repeat run one after another in one process, odd repeats in reverse order",
    "phases: per-step medians over every measured step; generate: the rollout's generation; log-probs: the "
    "rollout's old/reference log-prob passes (TRL skips the old pass when generation and optimizer steps are "
    "aligned, its default here); other rollout: rewards, advantages, encoding; update: forward, backward, "
    "optimizer step",
    "TRL defaults: GRPOConfig's own gradient checkpointing (on), weights float32 (its loader's default), the "
    "dynamic KV cache; TRL best: weights in the compute dtype (model_init_kwargs dtype), "
    "cache_implementation=static, gradient checkpointing off; TRL's decode is uncompiled in both "
    "(TRL 1.16 sets disable_compile=True in grpo_trainer.py)",
)
