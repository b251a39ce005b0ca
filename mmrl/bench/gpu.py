"""``mmrl bench gpu``: the GPU table in one command, within a time budget.

Why one command: a GPU is lent for minutes, so every measurement a GPU session owes (mmrl against
TRL with each KV cache, LoRA, the peak memory of each ``train.optim``, whether the 448-px run fits
micro-batch 16, the update's MFU) must come from one prepared run that cannot be half-debugged
there. ``--tiny`` runs every group with the tiny models on a CPU in about a minute, and a test runs
it, so the GPU run exercises code that already ran.

Each group runs in its own Python process (:mod:`mmrl.bench.gpu_groups`), in priority order: an
out-of-memory error, a compile failure or a hang ends that group, not the table, and each group
starts on an empty GPU. With ``--tiny`` (a CPU: no GPU memory to isolate) one process runs the
groups in turn, a group that raises recorded as failed and the next started: a process per group
would spend most of its ~10 s importing torch, transformers, TRL and diffusers again. A group
appends one JSON line per side to ``rows.jsonl`` as soon as the side finishes, so a group stopped
at the budget keeps what it measured. ``speed.md`` and ``speed.json`` are written at the end from
those lines. The ratios are measured side by side in one process: each mmrl row against the TRL row
of its own group (same model, prompts, lengths and micro-batch).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .speed_compare import LEGEND, TOWERS, TRL_VARIANTS, compare, markdown_table, rows_for

GROUPS = ("full", "optimizers", "fit448", "lora", "generator")  # run order: the table's most wanted rows first
# A group is started only with at least this many seconds of the budget left (a 3B model load,
# a compile and TRL's side each take tens of seconds on a GPU).
MIN_GROUP_S = {"full": 120, "optimizers": 60, "fit448": 45, "lora": 120, "generator": 120}
# Dense bf16 peak of the cards whose name contains the key (NVIDIA's datasheets, SXM parts), for MFU.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


@dataclass
class GpuBenchOptions:
    """What the groups share. ``tiny``: the shipped tiny model on the CPU, every group, tiny sizes."""

    tiny: bool = False
    groups: tuple[str, ...] = GROUPS
    budget_s: float = 540.0
    prompts: int = 4
    generations: int = 8
    tokens: int = 256
    steps: int = 5  # measured steps per run of the speed rows
    warmup: int = 1
    repeats: int = 3  # runs of each speed row, the order reversed on odd repeats
    towers: tuple[str, ...] = TOWERS
    trl: tuple[str, ...] = TRL_VARIANTS
    micro_batch: int = 16
    caches: tuple[str, ...] = ("dynamic", "static")
    optims: tuple[str, ...] = ("adamw_torch", "adamw_kahan", "adamw_bf16", "adamw_bf16_sr")
    optim_tokens: int = 64
    fit_image_size: int = 448
    lora_rank: int = 16
    peak_tflops: float | None = None
    seed: int = 0
    extra: tuple[str, ...] = field(default_factory=tuple)  # dotted overrides for every mmrl side

    def resolved(self) -> "GpuBenchOptions":
        unknown = [g for g in self.groups if g not in GROUPS]
        if unknown:
            raise ValueError(f"--groups: unknown {', '.join(unknown)} (known: {', '.join(GROUPS)})")
        known = ("dynamic", "static", "static_plain", "vllm")
        if bad := [c for c in self.caches if c not in known]:
            raise ValueError(f"--caches: unknown {', '.join(bad)} (known: {', '.join(known)})")
        rows_for(self.towers, ["check"], self.trl)  # unknown tower / TRL settings names
        if self.repeats < 1 or self.steps < 1 or self.warmup < 0:
            raise ValueError(f"--repeats and --steps must be at least 1 and --warmup 0 or more, got "
                             f"{self.repeats}, {self.steps}, {self.warmup}")
        if not self.tiny:
            return self
        # tiny sizes; the repeats and measured steps stay as asked (a tiny step takes ~0.1 s)
        return GpuBenchOptions(**{**asdict(self), "prompts": 2, "generations": 2, "tokens": 4, "micro_batch": 2,
                                  "optim_tokens": 4, "fit_image_size": 56, "lora_rank": 4})

    @property
    def device(self) -> str:
        return "cpu" if self.tiny else "cuda"

    @property
    def shape(self) -> str:
        return "tiny" if self.tiny else "3b"


def run_gpu_bench(opts: GpuBenchOptions, out_dir: Path, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every group of ``opts.groups`` in its own process while the budget lasts; ``speed.md`` and
    ``speed.json`` written under ``out_dir``; returns the report."""
    opts = opts.resolved()
    if not opts.tiny:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("mmrl bench gpu needs a CUDA device (torch sees none); on a CPU run --tiny")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = out_dir / "rows.jsonl"
    rows_path.unlink(missing_ok=True)
    (out_dir / "options.json").write_text(json.dumps(asdict(opts), indent=2))
    groups = (run_groups_together(opts.groups, out_dir, opts.budget_s, echo) if opts.tiny
              else run_groups_apart(opts.groups, out_dir, opts.budget_s, echo))
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    report = build_report(opts, rows, groups)
    (out_dir / "speed.json").write_text(json.dumps(report, indent=2))
    (out_dir / "speed.md").write_text(markdown(report))
    echo(markdown(report))
    echo(f"wrote {out_dir / 'speed.md'} and {out_dir / 'speed.json'}")
    return report


def run_group(group: str, out_dir: Path, timeout: float, echo: Callable[[str], None]) -> int | None:
    """``python -m mmrl.bench.gpu_groups GROUP OUT_DIR`` (``GROUP``: one, or several comma-separated
    for one process), its output echoed line by line as it comes; the exit code, or None if it was
    stopped at ``timeout`` seconds."""
    proc = subprocess.Popen([sys.executable, "-m", "mmrl.bench.gpu_groups", group, str(out_dir)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
    reader = threading.Thread(target=lambda: [echo(line.rstrip("\n")) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    reader.join(timeout=5)
    return code


def run_groups_apart(names: tuple[str, ...], out_dir: Path, budget_s: float,
                     echo: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Each group of ``names`` in its own process while ``budget_s`` lasts; each one's status."""
    deadline = time.monotonic() + budget_s
    groups: dict[str, dict[str, Any]] = {}
    for group in names:
        left = deadline - time.monotonic()
        if left < MIN_GROUP_S[group]:
            groups[group] = {"status": f"not run: {left:.0f} s of the budget left, the group needs "
                                       f"{MIN_GROUP_S[group]} s or more"}
            echo(f"[{group}] {groups[group]['status']}")
            continue
        echo(f"[{group}] starting ({left:.0f} s of the budget left)")
        t0 = time.monotonic()
        code = run_group(group, out_dir, timeout=max(left, 0.1), echo=echo)
        status = ("done" if code == 0 else f"failed (exit code {code}; see the log above)" if code is not None
                  else f"stopped at the budget after {time.monotonic() - t0:.0f} s (rows measured before are kept)")
        groups[group] = {"status": status, "seconds": round(time.monotonic() - t0, 1)}
        echo(f"[{group}] {status} in {groups[group]['seconds']} s")
    return groups


def run_groups_together(names: tuple[str, ...], out_dir: Path, timeout: float,
                         echo: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """``names`` in one process (``--tiny``), each group's status read from the ``groups.jsonl`` line
    it wrote; a group without one was stopped at ``timeout`` or ended with the process."""
    status_path = out_dir / "groups.jsonl"
    status_path.unlink(missing_ok=True)
    echo(f"[{','.join(names)}] starting in one process ({timeout:.0f} s of the budget left)")
    t0 = time.monotonic()
    code = run_group(",".join(names), out_dir, timeout=timeout, echo=echo)
    lines = status_path.read_text().splitlines() if status_path.exists() else []
    groups = {g.pop("group"): g for g in map(json.loads, lines)}
    ended = (f"stopped at the budget after {time.monotonic() - t0:.0f} s (rows measured before are kept)" if code is None
             else f"failed (the process ended with exit code {code}; see the log above)")
    return {name: groups.get(name, {"status": ended}) for name in names}


SPEED_GROUPS = ("full", "lora")


def build_report(opts: GpuBenchOptions, rows: list[dict], groups: dict[str, dict]) -> dict[str, Any]:
    """The like-for-like table of each speed group (:func:`~mmrl.bench.speed_compare.compare`)
    and the other groups' rows."""
    speed = {g: compare([r for r in rows if r["group"] == g]) for g in SPEED_GROUPS if any(r["group"] == g for r in rows)}
    for g, table in speed.items():  # the update's MFU: the median over a row's runs
        for row in table["rows"]:
            mfus = [r["update_mfu"] for r in rows if r["group"] == g and r["name"] == row["name"]
                    and r["pair"] == row["pair"] and r.get("update_mfu") is not None]
            row["update_mfu"] = statistics.median(mfus) if mfus else None
    others = [r for r in rows if r["group"] not in SPEED_GROUPS]
    settings = rows[0]["settings"] if rows else {}
    return {"options": asdict(opts), "settings": settings, "groups": groups, "speed": speed, "rows": others,
            "runs": [r for r in rows if r["group"] in SPEED_GROUPS], "goals": goals(speed, others),
            "date": time.strftime("%Y-%m-%d %H:%M")}


# The goals for the 3B shape: (what, target, value of a row or None, met when best >= target
# (or <= for the "at most" ones)). A speed goal reads the like-for-like table of its group: the
# median ratio of an mmrl row to TRL at its best settings. A goal no row measured is not measured.
_HF = ("dynamic", "static")


def _vs_best(group: str, variants: tuple[str, ...] | None, key: str = "vs_trl"):
    def value(speed: dict, row: dict) -> float | None:
        if row.get("_group") != group or row["side"] != "mmrl" or (variants and row["variant"] not in variants):
            return None
        v = row[key].get("best")
        return v["median"] if isinstance(v, dict) else v
    return value


GOALS = (
    ("samples/s x TRL best (median), full fine-tuning, HF engine", 2.5, _vs_best("full", _HF), max),
    ("samples/s x TRL best (median), LoRA, HF engine", 1.5, _vs_best("lora", _HF), max),
    ("samples/s x TRL best (median), full fine-tuning, vLLM", 4.0, _vs_best("full", ("vllm",)), max),
    ("peak memory x TRL best, full fine-tuning (at most)", 1.0, _vs_best("full", None, "memory_vs_trl"), min),
    ("448-px micro-batch 16 peak GiB (at most 80 GB)", 80e9 / 2**30,
     lambda speed, r: r["summary"]["peak_memory_gib"] if r.get("group") == "fit448" and r.get("fits") else None, min),
    ("update MFU, full fine-tuning (median of the runs)", 0.30,
     lambda speed, r: r.get("update_mfu") if r.get("_group") == "full" and r["side"] == "mmrl" else None, max),
)


def goals(speed: dict[str, dict], others: list[dict]) -> list[dict]:
    """Each goal with the best value the measured rows reached and whether it is met."""
    rows = [{**r, "_group": g} for g, table in speed.items() for r in table["rows"]] + list(others)
    out = []
    for what, target, value, best in GOALS:
        values = []
        for r in rows:
            try:
                v = value(speed, r)
            except (KeyError, TypeError):  # an error row, or no TRL row to compare with
                v = None
            if v is not None:
                values.append(v)
        reached = best(values) if values else None
        met = None if reached is None else (reached <= target if best is min else reached >= target)
        out.append({"goal": what, "target": target, "best": reached, "met": met})
    return out


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def markdown(report: dict[str, Any]) -> str:
    """The like-for-like table of each speed group, then one line per other measured row, the
    groups that did not finish, and the goals."""
    s = report["settings"]
    o = report["options"]
    lines = [f"## mmrl bench gpu: {s.get('device_name', '?')}, torch {s.get('torch', '?')}, transformers "
             f"{s.get('transformers', '?')}, TRL {s.get('trl', '?')}, {s.get('threads', '?')} CPU thread(s), "
             f"{report['date']}", "",
             f"{s.get('shape', '?')} model, {o['prompts']} prompts x {o['generations']} samples x {o['tokens']} "
             f"tokens, micro-batch {o['micro_batch']}, {s.get('dtype', '?')}; speed rows: {o['repeats']} repeats x "
             f"{o['steps']} measured steps after {o['warmup']} warm-up step(s); optimizer rows: {o['optim_tokens']} "
             f"tokens, one step after a warm-up step", ""]
    for group, table in report.get("speed", {}).items():
        lines += [f"### {group}: like for like against TRL's GRPOTrainer", "", markdown_table(table)]
    if report["rows"]:
        lines += ["### other groups", "",
                  "| group | run | samples/s | s/step | rollout s | update s | update MFU | peak GiB | note |",
                  "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        m = r.get("summary") or {}
        lines.append(f"| {r['group']} | {r['name']} | {_f(m.get('samples_per_s'), '{:.3g}')} | "
                     f"{_f(m.get('step_s'), '{:.3g}')} | {_f(m.get('rollout_s'), '{:.3g}')} | "
                     f"{_f(m.get('update_s'), '{:.3g}')} | {_f(r.get('update_mfu'), '{:.1%}')} | "
                     f"{_f(m.get('peak_memory_gib'), '{:.3g}')} | {r.get('note', '')} |")
    for name, g in report["groups"].items():
        if g["status"] != "done":
            lines.append(f"\n- group {name}: {g['status']}")
    lines += ["", "| goal | target | best measured | met |", "|---|---|---|---|"]
    for g in report.get("goals", []):
        lines.append(f"| {g['goal']} | {g['target']:.3g} | {_f(g['best'], '{:.3g}')} | "
                     f"{'not measured' if g['met'] is None else 'yes' if g['met'] else 'no'} |")
    lines += ["", *(f"- {line}" for line in LEGEND),
              "- peak GiB: the CUDA allocator's peak after the warm-up step (on a CPU the process's resident set, "
              "shared by every run of the process)",
              "- update MFU: model FLOPs of the update (6 N per token for full fine-tuning, 4 N with LoRA, N the "
              "language model's matmul weights; the LM head on completion tokens only; attention and the vision "
              "tower left out) over the update's mean seconds and the card's dense bf16 peak"]
    return "\n".join(lines) + "\n"
