"""``mmrl bench speed``: mmrl against TRL's ``GRPOTrainer``, like for like, in one process.

The question a user moving from TRL asks: is a GRPO step of mmrl as fast, and as light, as TRL's on
the same work? Both trainers get the same checkpoint, the same prompts with the same images (the
ones mmrl's data pipeline drew, in its order), the same group size, micro-batch, compute precision,
learning-rate schedule, clip range, temperature and ``beta = 0`` (no reference model on either
side), and train the same parameters: the rows come in pairs (:mod:`mmrl.bench.speed_compare`),
the vision tower trained on both sides or frozen on both, and each run records the parameter count
its optimizer steps. TRL runs at its own defaults and at the best its config offers.
Completion lengths are forced equal: ``min_new_tokens = max_new_tokens`` on both sides
(mmrl: the model's generation config, which transformers' ``generate`` merges under mmrl's own
arguments; TRL: ``GRPOConfig.generation_kwargs``), so both generate and train on exactly
``prompts x generations x tokens`` completion tokens per step, and the table checks it.

Each run takes ``warmup + steps`` optimizer steps (one rollout each); the warm-up steps are left
out. The mmrl side runs the trainer's own step methods (``Trainer.rollout_step``: prompt sampling,
generation, rewards, advantages; ``Trainer.update``: micro-batched forward, backward, optimizer
step), timed the way ``Trainer.train`` times them; ``train()`` itself is not called because it also
evaluates and writes a checkpoint. The TRL side runs ``GRPOTrainer.train()``; a callback times each
optimizer step and the rollout is the time spent in ``_generate_and_score_completions``. Within the
rollout, both sides' generation and log-prob passes are timed around their own methods
(:class:`~mmrl.bench.speed_common.PhaseClock`). Update = step - rollout on both sides.

Every row runs ``repeats`` times, alternating the order (ABBA); absolute times on a shared machine
are noise, the ratios measured side by side are the figures to read. ``run_speed_bench`` writes
``speed.json`` (settings, every run's per-step lists, the table, notes) and ``speed.md``.
"""

from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .speed_compare import LEGEND, TOWERS, TRL_SETTINGS, TRL_VARIANTS, Row, compare, markdown_table, run_order, rows_for
from .speed_common import LOSS_TYPES, PhaseClock, SideResult, optimizer_params, peak_memory, reset_peak_memory, sync

DEFAULT_CONFIG = "vlm/counting_tiny"


@dataclass
class SpeedOptions:
    """What both sides share. ``micro_batch`` 0 = min(16, prompts x generations); ``dtype``
    ``auto`` = bfloat16 on CUDA, float32 on CPU; ``towers`` the pairs (vision tower trained on
    both sides, frozen on both); ``trl`` TRL's settings per pair (defaults, best)."""

    shape: str = "tiny"
    lora: bool = False
    prompts: int = 4
    generations: int = 8
    tokens: int = 256
    steps: int = 5
    warmup: int = 1
    micro_batch: int = 0
    device: str = "cpu"
    dtype: str = "auto"
    engine: str = "hf"
    seed: int = 0
    repeats: int = 3  # every row this many times, alternating the order (ABBA)
    towers: tuple[str, ...] = TOWERS
    trl: tuple[str, ...] = TRL_VARIANTS

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
        rows_for(self.towers, ["check"], self.trl, self.lora)  # unknown tower / TRL settings names
        return SpeedOptions(**{**asdict(self), "micro_batch": mb, "dtype": dtype, "towers": tuple(self.towers),
                               "trl": tuple(self.trl)})


def mmrl_overrides(opts: SpeedOptions, model_path: Path, out_dir: Path, tower: str = "frozen") -> list[str]:
    """The dotted overrides that make mmrl's recipe run the bench's shared settings, the vision
    tower ``trained`` or ``frozen`` (``vlm.freeze_vision``)."""
    out = [
        f"model.path={model_path}", f"model.dtype={opts.dtype}", f"model.lora.enabled={str(opts.lora).lower()}",
        f"train.device={opts.device}", f"train.seed={opts.seed}", f"train.steps={opts.warmup + opts.steps}",
        f"train.prompts_per_step={opts.prompts}", f"rollout.num_generations={opts.generations}",
        f"rollout.max_completion_length={opts.tokens}", f"rollout.batch_size={opts.samples}",
        f"rollout.engine={opts.engine}", f"train.micro_batch_size={opts.micro_batch}", "train.mini_batch_size=0",
        f"vlm.freeze_vision={str(tower == 'frozen').lower()}",
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
    if cfg.rollout.engine == "hf":
        # Forced length: transformers' generate merges the model's generation config under the
        # arguments mmrl passes (which set max_new_tokens, not min_new_tokens).
        policy.model.generation_config.min_new_tokens = opts.tokens
    trainer = Trainer(cfg, policy, task)
    policy.configure_optimizer(cfg.train, cfg.train.steps)
    clock = PhaseClock(device)
    clock.wrap(policy.engine, "generate", "generate", within="rollout")
    clock.wrap(policy, "score", "logprobs", within="rollout")  # in the update it is the update's
    drawn: list[list[dict]] = []
    result = timed_trainer_steps(trainer, cfg.train.steps, opts.warmup, device, on_batch=lambda batch: drawn.append(
                                     [batch.examples[i] for i in range(0, len(batch), opts.generations)]), clock=clock)
    result.micro_batch_used = policy.micro_batch_size
    result.trained_params = optimizer_params(policy.optimizer)
    del trainer, policy
    _free(device)
    return result, drawn, task


def timed_trainer_steps(trainer, steps: int, warmup: int, device: torch.device, on_batch=None,
                        clock: PhaseClock | None = None) -> SideResult:
    """``steps`` RL steps through the trainer's own step methods (``rollout_step``: prompts,
    generation, rewards, advantages; ``update``: forward, backward, optimizer step), timed the way
    ``Trainer.train`` times them, CUDA synchronised at each boundary; the peak memory after the
    warm-up steps. ``clock``: the phases wrapped inside the rollout (generation, log-probs).
    Completion and prompt tokens are counted for batches with prompt tokens (a VLM's); a
    generator's count 0."""
    result = SideResult("mmrl", warmup)
    clock = clock or PhaseClock(device)
    reset_peak_memory(device)
    for step in range(1, steps + 1):
        if step == warmup + 1:
            reset_peak_memory(device)
        clock.take()
        sync(device)
        t0 = time.perf_counter()
        with clock.phase("rollout"):
            batch, metrics = trainer.rollout_step(step)
        rollout = time.perf_counter() - t0
        metrics.update(trainer.update(batch, step))
        sync(device)
        phases = clock.take()
        result.logs.append({"step": step, **{k: float(v) for k, v in metrics.items()}})
        prompt_ids = batch.payload.get("prompt_ids")
        result.add(time.perf_counter() - t0, rollout, len(batch), int(batch.action_mask.sum()) if prompt_ids else 0,
                   sum(len(p) for p in prompt_ids) if prompt_ids else 0, phases.get("generate", 0.0),
                   phases.get("logprobs", 0.0))
        if on_batch is not None:
            on_batch(batch)
    result.peak_memory_gib, result.memory_kind = peak_memory(device)
    return result


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- the comparison ----------------------------------------------------------------------------------
def weights_label(trained: str, compute: str, lora: bool, base: str | None = None) -> str:
    """``float32, bfloat16 autocast`` (float32 master weights), ``bfloat16``; with LoRA the
    adapters' and the frozen base's dtypes."""
    autocast = "" if compute == "float32" else f", {compute} autocast"
    if lora:
        return f"adapters {trained}, base {base or compute}{autocast}"
    return trained + ("" if trained == compute else autocast)


def describe_mmrl(cfg, opts: SpeedOptions) -> dict[str, str]:
    """What the table says of an mmrl run: its trained weights, checkpointing and decode."""
    from ..core.precision import compute_dtype, trained_dtype

    trained = str(trained_dtype(cfg.train.optim, compute_dtype(opts.dtype))).removeprefix("torch.")
    r = cfg.rollout
    if r.engine != "hf":
        decode = f"rollout.engine={r.engine}"
    else:
        cache = r.cache_implementation or ("static" if opts.device.startswith("cuda") else "dynamic")
        compiled = cache == "static" and r.compile_decode and opts.device.startswith("cuda")
        decode = f"{cache} cache" + (", compiled" if compiled else ", eager" if cache == "static" else "")
    return {"weights": weights_label(trained, opts.dtype, opts.lora), "gradient_checkpointing": "off",
            "decode": decode}


def describe_trl(variant: str, opts: SpeedOptions) -> dict[str, str]:
    """The same for a TRL run (peft keeps LoRA adapters in float32 over any base dtype)."""
    s = TRL_SETTINGS[variant]
    loaded = opts.dtype if s.weights == "compute" else "float32"
    return {"weights": weights_label("float32" if opts.lora else loaded, opts.dtype, opts.lora, base=loaded),
            "gradient_checkpointing": "on" if s.gradient_checkpointing else "off",
            "decode": f"{s.cache_implementation or 'dynamic'} cache, uncompiled"}


def record_of(result: SideResult) -> dict[str, Any]:
    """A run's measured steps (warm-up left out) and its summary, as the table reads them."""
    m = result.measured
    return {"summary": result.summary(), "step_s": result.step_s[m], "rollout_s": result.rollout_s[m],
            "generate_s": result.generate_s[m], "logprobs_s": result.logprobs_s[m], "samples": result.samples[m],
            "completion_tokens": result.completion_tokens[m], "prompt_tokens": result.prompt_tokens[m],
            "warmup_step_s": result.step_s[:result.warmup], "trained_params": result.trained_params,
            "micro_batch_used": result.micro_batch_used, "memory_kind": result.memory_kind, "logs": result.logs}


def run_comparison(rows: Sequence[Row], opts: SpeedOptions, config_for: Callable[[Row], Any], path: Path,
                   out_dir: Path, on_record: Callable[[dict], None] = lambda rec: None,
                   on_error: Callable[[Row, Exception], str] | None = None,
                   echo: Callable[[str], None] = print) -> list[dict]:
    """Every row ``opts.repeats`` times in :func:`~mmrl.bench.speed_compare.run_order`; one record
    per run (see :func:`~mmrl.bench.speed_compare.compare`), handed to ``on_record`` as it ends.
    TRL's runs get the prompts the first mmrl run drew. ``on_error`` (None: raise) turns a failed
    run into its record's note and the next run starts."""
    from .speed_trl import run_trl_side

    records: list[dict] = []
    first: tuple | None = None  # (cfg, drawn, task) of the first mmrl run
    order = run_order(rows, opts.repeats)
    for position, (repeat, row) in enumerate(order):
        rec: dict[str, Any] = {"pair": row.pair, "name": row.name, "side": row.side, "tower": row.tower,
                               "variant": row.variant, "repeat": repeat, "position": position,
                               "load_before": os.getloadavg()[0]}
        try:
            if row.side == "mmrl":
                cfg = config_for(row)
                rec["describe"] = describe_mmrl(cfg, opts)
                result, drawn, task = run_mmrl_side(cfg, opts)
                first = first or (cfg, drawn, task)
            else:
                rec["describe"] = describe_trl(row.variant, opts)
                if first is None:
                    raise RuntimeError("no mmrl run drew the prompts before it (every mmrl run before it failed)")
                cfg, drawn, task = first
                result = run_trl_side(cfg, opts, path, drawn, task, Path(out_dir) / "trl-run",
                                      TRL_SETTINGS[row.variant], frozen_tower=row.tower == "frozen")
            rec.update(record_of(result))
        except Exception as exc:  # noqa: BLE001 - a failed run is a line of the table when on_error says so
            if on_error is None:
                raise
            rec["note"] = on_error(row, exc)
        finally:
            _free(torch.device(opts.device))
        rec["load_after"] = os.getloadavg()[0]
        records.append(rec)
        on_record(rec)
        rate = rec.get("summary", {}).get("samples_per_s")
        echo(f"[{position + 1}/{len(order)}] repeat {repeat + 1} {row.pair}, {row.name}: "
             + (f"{rate:.3g} samples/s" if rate else rec.get("note", "")))
    return records


def run_speed_bench(opts: SpeedOptions, out_dir: Path, config: str = DEFAULT_CONFIG,
                    extra_overrides: Sequence[str] = (), console: Any = None) -> dict[str, Any]:
    """Every row, the table printed, ``speed.json`` and ``speed.md`` written; returns the report."""
    from rich.console import Console

    from ..config import builtin_config_path, load_config
    from .speed_model import model_dir

    console = console or Console()
    echo = lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    opts = opts.resolved()
    trl_version = check_trl()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir(opts.shape, out_dir)

    def config_for(row: Row):
        return load_config(builtin_config_path(config),
                           [*extra_overrides, *mmrl_overrides(opts, path, out_dir, tower=row.tower)])

    if opts.device == "cpu":
        from mmrl.config.threads import configure_threads

        configure_threads(config_for(Row("", "", "mmrl", "frozen", "")), echo=echo)
    rows = rows_for(opts.towers, ["" if opts.engine == "hf" else opts.engine], opts.trl, opts.lora)
    echo(f"mmrl vs TRL {trl_version}: {opts.shape} model ({path}), {opts.prompts} prompts x {opts.generations} x "
         f"{opts.tokens} tokens, micro-batch {opts.micro_batch}, {opts.dtype}, {opts.device}"
         f"{', LoRA' if opts.lora else ''}: {len(rows)} rows x {opts.repeats} repeats, {opts.warmup} warm-up + "
         f"{opts.steps} measured steps each")
    records = run_comparison(rows, opts, config_for, path, out_dir, echo=echo)
    report = build_report(opts, config_for(rows[0]), records, trl_version, path)
    write_report(report, out_dir, echo)
    return report


SPREAD_WARNING = 0.25  # a ratio whose repeats span more than this (over their median) is flagged


def build_report(opts: SpeedOptions, cfg, records: list[dict], trl_version: str, path: Path) -> dict[str, Any]:
    table = compare(records)
    notes = [
        f"{opts.repeats} repeats x {opts.steps} measured steps per row after {opts.warmup} warm-up step(s)",
        f"completion lengths forced: min_new_tokens = max_new_tokens = {opts.tokens} on both sides",
        f"peak memory: {records[0].get('memory_kind', '?')}" + (
            "" if opts.device != "cpu" else "; on CPU it is not a clean per-trainer figure (every run shares the "
                                            "process, and freed memory may stay with the allocator)"),
        f"TRL mirrors mmrl's lr schedule, clip range (epsilon {cfg.algo.epsilon}, epsilon_high "
        f"{cfg.algo.epsilon_high}), temperature and loss normalisation (loss_type "
        f"{LOSS_TYPES.get(cfg.algo.loss_agg_mode, '?')}); mmrl has no gradient checkpointing",
    ]
    for row in table["rows"]:
        for variant, ratio in row["vs_trl"].items():
            if ratio and ratio["n"] > 1 and (ratio["max"] - ratio["min"]) / ratio["median"] > SPREAD_WARNING:
                notes.append(f"{row['pair']}, {row['name']} x TRL {variant}: the repeats' ratios span more than "
                             f"{SPREAD_WARNING:.0%} of their median: the machine's load changed during the bench "
                             "(load_before/load_after in speed.json); rerun on a quieter machine")
    work = {(r["summary"]["samples_per_step"], r["summary"]["completion_tokens_per_step"])
            for r in records if r.get("summary")}
    if len(work) > 1:
        notes.append("the runs did NOT train on the same number of samples/tokens per step: compare rates, not times"
                     + (" (rollout.engine=vllm: does the engine honour a minimum length?)" if opts.engine != "hf" else ""))
    if len({r["summary"]["prompt_tokens_per_step"] for r in records if r.get("summary")}) > 1:
        notes.append("prompt tokens per step differ between the runs (chat template or image budget)")
    return {
        "settings": {**asdict(opts), "model_path": str(path), "config": cfg.task.name,
                     "trl_version": trl_version, "torch_version": torch.__version__,
                     "transformers_version": _version("transformers"), "threads": torch.get_num_threads(),
                     "device_name": torch.cuda.get_device_name() if opts.device.startswith("cuda") else "cpu",
                     "date": time.strftime("%Y-%m-%d %H:%M")},
        "records": records,
        "table": table,
        "notes": notes,
    }


def _version(module: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(module)


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    title = (f"mmrl vs TRL {s['trl_version']}: {s['shape']} model{' LoRA' if s['lora'] else ''}, {s['prompts']}x"
             f"{s['generations']}x{s['tokens']} tokens, micro-batch {s['micro_batch']}, {s['dtype']}, "
             f"{s['device_name']}, {s['threads']} thread(s), torch {s['torch_version']}, transformers "
             f"{s['transformers_version']}, {s['date']}")
    return (f"## {title}\n\n{markdown_table(report['table'])}\n"
            + "".join(f"- {n}\n" for n in (*LEGEND, *report["notes"])))


def write_report(report: dict[str, Any], out_dir: Path, echo: Callable[[str], None]) -> None:
    (out_dir / "speed.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (out_dir / "speed.md").write_text(text)
    echo(text)
    echo(f"wrote {out_dir / 'speed.json'} and {out_dir / 'speed.md'}")
