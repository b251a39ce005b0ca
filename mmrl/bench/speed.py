"""``mmrl bench speed``: mmrl against TRL's ``GRPOTrainer``, same model, prompts and lengths, one process.

The question a user moving from TRL asks: is a GRPO step of mmrl as fast, and as light, as TRL's on
the same work? Both trainers get the same checkpoint, the same prompts with the same images (the
ones mmrl's data pipeline drew, in its order), the same group size, micro-batch, precision,
learning-rate schedule, clip range, temperature and ``beta = 0`` (no reference model on either
side). Completion lengths are forced equal: ``min_new_tokens = max_new_tokens`` on both sides
(mmrl: the model's generation config, which transformers' ``generate`` merges under mmrl's own
arguments; TRL: ``GRPOConfig.generation_kwargs``), so both generate and train on exactly
``prompts x generations x tokens`` completion tokens per step, and the table checks it.

Each side runs ``warmup + steps`` optimizer steps (one rollout each); the warm-up steps are
left out of the table. The mmrl side runs the trainer's own step methods (``Trainer.rollout_step``:
prompt sampling, generation, rewards, advantages; ``Trainer.update``: micro-batched forward,
backward, optimizer step), timed the way ``Trainer.train`` times them (``rollout_time``,
``step_time``); ``train()`` itself is not called because it also evaluates and writes a
checkpoint. The TRL side runs ``GRPOTrainer.train()``; a callback times each optimizer step and
the rollout is the time spent in ``_generate_and_score_completions`` (generation, rewards,
advantages). Update = step - rollout on both sides.

Absolute times on a shared machine are noise; the ratio column (mmrl / TRL, measured side by side)
is the figure to read. ``run_speed_bench`` writes ``speed.json`` (settings, per-step lists, summary,
ratios, notes) and ``speed.md`` (the table) under ``out_dir``.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from .speed_common import LOSS_TYPES, SideResult, peak_memory, reset_peak_memory, sync

DEFAULT_CONFIG = "vlm/counting_tiny"


@dataclass
class SpeedOptions:
    """What both sides share. ``micro_batch`` 0 = min(16, prompts x generations); ``dtype``
    ``auto`` = bfloat16 on CUDA, float32 on CPU."""

    shape: str = "tiny"
    lora: bool = False
    prompts: int = 4
    generations: int = 8
    tokens: int = 256
    steps: int = 3
    warmup: int = 1
    micro_batch: int = 0
    device: str = "cpu"
    dtype: str = "auto"
    engine: str = "hf"
    seed: int = 0
    repeats: int = 2  # both sides this many times, alternating which goes first (ABBA)

    @property
    def samples(self) -> int:
        return self.prompts * self.generations

    def resolved(self) -> "SpeedOptions":
        """Defaults filled in and the combination checked (before any model is loaded)."""
        mb = self.micro_batch or min(16, self.samples)
        dtype = self.dtype if self.dtype != "auto" else ("bfloat16" if self.device.startswith("cuda") else "float32")
        for name in ("prompts", "generations", "tokens", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {self.repeats}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.samples % mb:
            raise ValueError(f"--micro-batch {mb} must divide prompts x generations = {self.samples} "
                             "(TRL accumulates whole micro-batches into one optimizer step)")
        if self.generations < 2:
            raise ValueError("--generations must be at least 2 (TRL's GRPOTrainer needs a group)")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype must be auto, float32 or bfloat16, got {dtype!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda but torch sees no CUDA device")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        return SpeedOptions(**{**asdict(self), "micro_batch": mb, "dtype": dtype})


def mmrl_overrides(opts: SpeedOptions, model_path: Path, out_dir: Path) -> list[str]:
    """The dotted overrides that make mmrl's recipe run the bench's shared settings."""
    out = [
        f"model.path={model_path}", f"model.dtype={opts.dtype}", f"model.lora.enabled={str(opts.lora).lower()}",
        f"train.device={opts.device}", f"train.seed={opts.seed}", f"train.steps={opts.warmup + opts.steps}",
        f"train.prompts_per_step={opts.prompts}", f"rollout.num_generations={opts.generations}",
        f"rollout.max_completion_length={opts.tokens}", f"rollout.batch_size={opts.samples}",
        f"rollout.engine={opts.engine}", f"train.micro_batch_size={opts.micro_batch}", "train.mini_batch_size=0",
        "algo.beta=0.0", "algo.num_iterations=1", "eval.before=false", "log.tensorboard=false",
        "log.progress=false", "log.save_rollouts_every=0", f"log.output_dir={out_dir}", "log.run_name=mmrl-run",
    ]
    return out


def check_trl() -> str:
    """TRL's version, or an ImportError saying how to install it."""
    try:
        import trl
    except ImportError as exc:
        raise ImportError("`mmrl bench speed` compares against TRL, which is not installed: "
                          "pip install -e \".[bench]\" (or pip install trl)") from exc
    return trl.__version__


def run_mmrl_side(cfg, opts: SpeedOptions) -> tuple[SideResult, list[list[dict]], Any]:
    """mmrl's trainer for ``warmup + steps`` steps; returns the result, each step's examples (one
    per group, in group order) and the task."""
    from ..api import make_policy
    from ..core.trainer import Trainer, build_task

    device = torch.device(opts.device)
    task = build_task(cfg)
    policy = make_policy(cfg, task)
    if opts.engine == "hf":
        # Forced length: transformers' generate merges the model's generation config under the
        # arguments mmrl passes (which set max_new_tokens, not min_new_tokens).
        policy.model.generation_config.min_new_tokens = opts.tokens
    trainer = Trainer(cfg, policy, task)
    policy.configure_optimizer(cfg.train, cfg.train.steps)
    drawn: list[list[dict]] = []
    result = timed_trainer_steps(trainer, cfg.train.steps, opts.warmup, device, on_batch=lambda batch: drawn.append(
                                     [batch.examples[i] for i in range(0, len(batch), opts.generations)]))
    result.micro_batch_used = policy.micro_batch_size
    del trainer, policy
    _free(device)
    return result, drawn, task


def timed_trainer_steps(trainer, steps: int, warmup: int, device: torch.device, on_batch=None) -> SideResult:
    """``steps`` RL steps through the trainer's own step methods (``rollout_step``: prompts,
    generation, rewards, advantages; ``update``: forward, backward, optimizer step), timed the way
    ``Trainer.train`` times them, CUDA synchronised at each boundary; the peak memory after the
    warm-up steps. Completion and prompt tokens are counted for batches with prompt tokens (a VLM's);
    a generator's count 0."""
    result = SideResult("mmrl", warmup)
    reset_peak_memory(device)
    for step in range(1, steps + 1):
        if step == warmup + 1:
            reset_peak_memory(device)
        sync(device)
        t0 = time.perf_counter()
        batch, metrics = trainer.rollout_step(step)
        sync(device)
        rollout = time.perf_counter() - t0
        metrics.update(trainer.update(batch, step))
        sync(device)
        result.logs.append({"step": step, **{k: float(v) for k, v in metrics.items()}})
        prompt_ids = batch.payload.get("prompt_ids")
        result.add(time.perf_counter() - t0, rollout, len(batch), int(batch.action_mask.sum()) if prompt_ids else 0,
                   sum(len(p) for p in prompt_ids) if prompt_ids else 0)
        if on_batch is not None:
            on_batch(batch)
    result.peak_memory_gib, result.memory_kind = peak_memory(device)
    return result


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_speed_bench(opts: SpeedOptions, out_dir: Path, config: str = DEFAULT_CONFIG,
                    extra_overrides: Sequence[str] = (), console: Any = None) -> dict[str, Any]:
    """Both sides, the table printed, ``speed.json`` and ``speed.md`` written; returns the report."""
    from rich.console import Console

    from ..config import builtin_config_path, load_config
    from .speed_model import model_dir
    from .speed_trl import run_trl_side

    console = console or Console()
    opts = opts.resolved()
    trl_version = check_trl()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir(opts.shape, out_dir)
    cfg = load_config(builtin_config_path(config), [*extra_overrides, *mmrl_overrides(opts, path, out_dir)])
    if opts.device == "cpu":
        from ..threads import configure_threads

        configure_threads(cfg, echo=lambda line: console.print(line, highlight=False))
    console.print(f"[bold]mmrl[/] {opts.shape} model ({path}), {opts.prompts} prompts x {opts.generations} "
                  f"x {opts.tokens} tokens, micro-batch {opts.micro_batch}, {opts.dtype}, {opts.device}"
                  f"{', LoRA' if opts.lora else ''}: {opts.warmup} warm-up + {opts.steps} steps", highlight=False)
    runs: dict[str, list[SideResult]] = {"mmrl": [], "trl": []}
    loads: list[dict[str, Any]] = []
    drawn = task = None
    for repeat in range(opts.repeats):
        # ABBA: a load that rises or falls during the bench hits both sides alike on average
        for side in ("mmrl", "trl") if repeat % 2 == 0 else ("trl", "mmrl"):
            load = os.getloadavg()[0]
            if side == "mmrl":
                result, steps_drawn, side_task = run_mmrl_side(cfg, opts)
                drawn, task = drawn or steps_drawn, task or side_task
            else:
                console.print(f"[bold]TRL {trl_version}[/] GRPOTrainer on the same prompts", highlight=False)
                result = run_trl_side(cfg, opts, path, drawn, task, out_dir / "trl-run")
            runs[side].append(result)
            loads.append({"repeat": repeat, "side": side, "load_before": load, "load_after": os.getloadavg()[0]})
            console.print(f"repeat {repeat + 1}/{opts.repeats} {side}: {result.summary()['samples_per_s']:.3g} "
                          "samples/s", highlight=False)
    report = build_report(opts, cfg, SideResult.merged(runs["mmrl"]), SideResult.merged(runs["trl"]), trl_version,
                          path)
    add_repeats(report, runs, loads)
    write_report(report, out_dir, console)
    return report


SPREAD_WARNING = 0.25  # repeats' samples/s ratios further apart than this (over their median) are flagged


def add_repeats(report: dict[str, Any], runs: dict[str, list[SideResult]], loads: list[dict]) -> None:
    """Each repeat's samples/s ratio, their spread, and a note when the load moved them apart."""
    ratios = [m.summary()["samples_per_s"] / t.summary()["samples_per_s"] for m, t in zip(runs["mmrl"], runs["trl"])]
    spread = (max(ratios) - min(ratios)) / statistics.median(ratios)
    report["repeats"] = {"samples_per_s_ratio": ratios, "spread": spread, "load_average": loads}
    report["notes"].append(f"samples/s ratio per repeat (sides alternating first): "
                           f"{', '.join(f'{r:.2f}' for r in ratios)}; spread {spread:.0%} of the median")
    if len(ratios) > 1 and spread > SPREAD_WARNING:
        report["notes"].append(f"the repeats' ratios differ by more than {SPREAD_WARNING:.0%}: the machine's load "
                               "changed during the bench (see load_average in speed.json); rerun on a quiet machine")


# -- the report ------------------------------------------------------------------------------------
ROWS = (  # key, label, format
    ("samples_per_s", "samples/s", "{:.3g}"),
    ("tokens_per_s", "tokens/s (completion)", "{:.4g}"),
    ("step_s", "s/step", "{:.3g}"),
    ("rollout_s", "rollout s/step", "{:.3g}"),
    ("update_s", "update s/step", "{:.3g}"),
    ("peak_memory_gib", "peak memory GiB", "{:.3g}"),
    ("samples_per_step", "samples/step", "{:g}"),
    ("completion_tokens_per_step", "completion tokens/step", "{:g}"),
    ("prompt_tokens_per_step", "prompt tokens/step", "{:g}"),
)


def build_report(opts: SpeedOptions, cfg, mmrl: SideResult, trl: SideResult, trl_version: str,
                 path: Path) -> dict[str, Any]:
    a, b = mmrl.summary(), trl.summary()
    ratio = {k: (a[k] / b[k] if a[k] is not None and b[k] else None) for k, _, _ in ROWS}
    notes = [
        "ratio = mmrl / TRL: above 1 is mmrl faster for samples/s and tokens/s, slower for the s/step rows, "
        "heavier for memory",
        f"warm-up steps left out: {opts.warmup}; means over {opts.steps} steps",
        f"completion lengths forced: min_new_tokens = max_new_tokens = {opts.tokens} on both sides",
        f"peak memory: {mmrl.memory_kind}" + ("" if opts.device != "cpu" else
                                              "; on CPU it is not a clean per-trainer figure (both sides share "
                                              "the process, and freed memory may stay with the allocator)"),
        f"TRL mirrors mmrl's lr schedule, clip range (epsilon {cfg.algo.epsilon}, epsilon_high "
        f"{cfg.algo.epsilon_high}), temperature and loss normalisation (loss_type "
        f"{LOSS_TYPES.get(cfg.algo.loss_agg_mode, '?')}); TRL's gradient checkpointing is off, as mmrl has none",
    ]
    if a["samples_per_step"] != b["samples_per_step"] or a["completion_tokens_per_step"] != b["completion_tokens_per_step"]:
        notes.append("the two sides did NOT train on the same number of samples/tokens: compare rates, not times"
                     + (" (rollout.engine=vllm: does the engine honour a minimum length?)" if opts.engine != "hf" else ""))
    if a["prompt_tokens_per_step"] != b["prompt_tokens_per_step"]:
        notes.append("prompt tokens differ between the sides (chat template or image budget)")
    return {
        "settings": {**asdict(opts), "model_path": str(path), "config": cfg.task.name,
                     "trl_version": trl_version, "torch_version": torch.__version__,
                     "device_name": torch.cuda.get_device_name() if opts.device.startswith("cuda") else "cpu",
                     "date": time.strftime("%Y-%m-%d %H:%M")},
        "mmrl": mmrl.to_json(),
        "trl": trl.to_json(),
        "ratio": ratio,
        "notes": notes,
    }


def _fmt(fmt: str, v: float | None) -> str:
    return "-" if v is None else fmt.format(v)


def markdown_table(report: dict[str, Any]) -> str:
    a, b = report["mmrl"]["summary"], report["trl"]["summary"]
    lines = ["| metric | mmrl | TRL | mmrl/TRL |", "|---|---|---|---|"]
    for key, label, fmt in ROWS:
        lines.append(f"| {label} | {_fmt(fmt, a[key])} | {_fmt(fmt, b[key])} | "
                     f"{_fmt('{:.2f}', report['ratio'][key])} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: Path, console: Any) -> None:
    from rich.table import Table

    s = report["settings"]
    title = (f"mmrl vs TRL {s['trl_version']}: {s['shape']} model{' LoRA' if s['lora'] else ''}, {s['prompts']}x"
             f"{s['generations']}x{s['tokens']} tokens, micro-batch {s['micro_batch']}, {s['dtype']}, {s['device']}")
    (out_dir / "speed.json").write_text(json.dumps(report, indent=2))
    (out_dir / "speed.md").write_text(f"## {title}\n\n{markdown_table(report)}\n"
                                      + "".join(f"- {n}\n" for n in report["notes"]))
    table = Table(title=title)
    for col in ("metric", "mmrl", "TRL", "mmrl/TRL"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    a, b = report["mmrl"]["summary"], report["trl"]["summary"]
    for key, label, fmt in ROWS:
        table.add_row(label, _fmt(fmt, a[key]), _fmt(fmt, b[key]), _fmt("{:.2f}", report["ratio"][key]))
    console.print(table)
    for n in report["notes"]:
        console.print(f"note: {n}", highlight=False)
    console.print(f"wrote {out_dir / 'speed.json'} and {out_dir / 'speed.md'}", highlight=False)
