"""The ``mmrl`` command line.

    mmrl train vlm                                  # the tiny default, on CPU, in minutes
    mmrl train diffusion                            # the tiny generator with Flow-GRPO, on CPU
    mmrl train vlm configs/vlm/grounding_tiny.yaml algo.epsilon_high=0.28 rollout.num_generations=8
    mmrl train vlm log.run_name=exp1 --resume      # continue runs/exp1 from its latest checkpoint
    mmrl eval runs/exp1                             # score the run's final checkpoint on the eval split
    mmrl build-tiny vlm                             # rebuild the shipped tiny model
    mmrl bench algos --variants grpo,dapo --steps 40  # compare RL algorithms on the same task and seed
    mmrl bench speed --prompts 2 --generations 4 --tokens 16  # mmrl vs TRL's GRPOTrainer, same work
    mmrl bench rollout                                # HF generate vs vLLM samples/s (needs vLLM)
    mmrl demo                                         # a Gradio app on http://127.0.0.1:7860 (needs mmrl[demo])
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape  # error texts may hold brackets (`pip install mmrl[vllm]`)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Reinforcement learning for multimodal models.")
console = Console(stderr=True)

DEFAULT_CONFIGS = {"vlm": "vlm/counting_tiny", "video": "video/video_qa_tiny", "diffusion": "diffusion/composition_tiny"}
MODALITIES = ("vlm", "video", "diffusion")
# `mmrl train video` trains the VLM policy on a task whose prompts hold clips.
POLICY_OF = {"video": "vlm"}


def _split_args(args: list[str]) -> tuple[Optional[str], list[str]]:
    """The first argument is a config file when it is not a ``key=value`` override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _load(modality: str, args: list[str], extra: list[str] = ()):
    from .config import ConfigError, builtin_config_path, load_config

    if modality not in MODALITIES:
        console.print(f"[red]error:[/] `mmrl train {modality}` is not available in this version "
                      f"(available: {', '.join(MODALITIES)})")
        raise typer.Exit(2)
    path, overrides = _split_args(args)
    try:
        config_path = builtin_config_path(path or DEFAULT_CONFIGS[modality])
        return load_config(config_path, [*overrides, *extra])
    except ConfigError as exc:
        console.print(f"[red]config error:[/] {escape(str(exc))}")
        raise typer.Exit(2)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    modality: str = typer.Argument(..., help="what to train: vlm | video | diffusion"),
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value overrides...]"),
    resume: bool = typer.Option(False, "--resume", help="continue from the run's latest checkpoint"),
    allow_config_change: bool = typer.Option(False, "--allow-config-change",
                                             help="resume with a config that differs from the run's"),
):
    """Train with RL. Without a config, trains the built-in tiny default on CPU."""
    extra = (["resume=true"] if resume else []) + (["allow_config_change=true"] if allow_config_change else [])
    cfg = _load(modality, list(args or []), extra)
    _configure_threads(cfg)
    from .api import make_policy
    from .core.trainer import Trainer, build_task

    try:
        task = build_task(cfg)
        if getattr(task, "modality", "vlm") != POLICY_OF.get(modality, modality):
            raise ValueError(f"task {task.name!r} is a {task.modality} task; run it with `mmrl train {task.modality}`")
        policy = make_policy(cfg, task)
        trainer = Trainer(cfg, policy, task)  # checks the config against the policy: its errors are the user's
    except (FileNotFoundError, ValueError, KeyError, ImportError) as exc:  # ImportError: an optional engine
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    if trainer.main:  # one voice for several processes
        console.print(f"run directory: [bold]{trainer.run_dir}[/]")
    result = trainer.train()
    if result.before and trainer.main:
        lead = task.success_metric if task.success_metric in result.before else None
        first = f"held-out {lead}: before {result.before[lead]:.3f} -> after {result.after[lead]:.3f}; " if lead else ""
        console.print(f"{first}held-out reward: before {result.before['reward']:.3f} -> after {result.after['reward']:.3f}")


@app.command(name="eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def eval_(
    target: str = typer.Argument(..., help="a run directory, a checkpoint directory, or a config file"),
    args: Optional[List[str]] = typer.Argument(None, help="[key=value overrides...]"),
    num_examples: Optional[int] = typer.Option(None, help="eval examples (default: eval.num_examples)"),
    gallery: Optional[Path] = typer.Option(None, help="where to write the prediction gallery "
                                           "(default: <run dir>/eval_gallery, else ./eval_gallery)"),
):
    """Score a checkpoint on its task's eval split (mean reward, each reward, task metrics)."""
    import json

    from .config import ConfigError, load_config
    from .api import make_policy
    from .core.evaluation import evaluate
    from .core.reward_computer import make_reward_computer
    from .core.trainer import build_task
    from .runs.checkpoint import CheckpointManager

    path = Path(target)
    ckpt = None
    if path.is_dir() and (path / "config.yaml").exists():  # a run directory
        cfg_path, ckpt = path / "config.yaml", CheckpointManager(path / "checkpoints").latest()
    elif path.is_dir() and (path / "policy").exists():  # one checkpoint of a run
        cfg_path, ckpt = path.parent.parent / "config.yaml", path
    else:
        cfg_path = path
    try:
        cfg = load_config(cfg_path, list(args or []) + ["resume=false"])
    except ConfigError as exc:
        console.print(f"[red]config error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    _configure_threads(cfg)
    task = build_task(cfg)
    policy = make_policy(cfg, task)
    if ckpt is not None:
        policy.load(ckpt / "policy")
    rewards = make_reward_computer(task, cfg.task)
    if gallery is None:
        gallery = (path if path.is_dir() and (path / "config.yaml").exists() else Path(".")) / "eval_gallery"
    metrics = evaluate(policy, task, rewards, cfg, num_examples, gallery_dir=gallery, grid_path=gallery / "samples.png")
    print(json.dumps({"checkpoint": str(ckpt) if ckpt else cfg.model.path, "task": cfg.task.name, **metrics}, indent=2))
    typer.echo(f"gallery: {gallery / 'index.html'} and {gallery / 'gallery.png'}", err=True)


@app.command(name="build-tiny")
def build_tiny(
    modality: str = typer.Argument("vlm", help="which tiny model: vlm | video (the tiny VLM warm-started "
                                    "on clips) | gui (the tiny VLM warm-started on the synthetic phone) | "
                                    "gui-grounding (the tiny GUI model taught more clicks) | "
                                    "diffusion | video-gen (the tiny text-to-video generator)"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: the shipped asset)"),
    steps: Optional[int] = typer.Option(None, help="warm-start steps (default: the recipe's: vlm 600, video 100 "
                                        "gui 800 and gui-grounding 240 SFT steps, diffusion 4000 and video-gen 2500 flow-matching steps)"),
    seed: int = typer.Option(0),
    vision_steps: Optional[int] = typer.Option(None, help="vlm: pre-train the vision tower on per-cell "
                                               "colour and shape labels for this many steps first, "
                                               "then freeze it (default 300; 0: off)"),
):
    """Rebuild a shipped tiny model from scratch (tokenizer, weights, warm start)."""
    if modality not in ("vlm", "video", "gui", "gui-grounding", "diffusion", "video-gen"):
        console.print(f"[red]error:[/] no tiny {modality} model (available: vlm, video, gui, gui-grounding, "
                      "diffusion, video-gen)")
        raise typer.Exit(2)
    import torch

    from .assets import asset_path

    torch.set_num_threads(max(1, torch.get_num_threads()))
    if modality == "diffusion":
        from .diffusion.pretrain import TINY_GENERATOR_RECIPE, pretrain_tiny_generator

        target = out or asset_path("tiny-flow-shapes")
        recipe = {**TINY_GENERATOR_RECIPE, "steps": steps or TINY_GENERATOR_RECIPE["steps"]}
        path = pretrain_tiny_generator(target, seed=seed, **recipe)
        console.print(f"saved tiny generator to {path}")
        return
    if modality == "video-gen":
        from .diffusion.pretrain import TINY_VIDEO_GENERATOR_RECIPE, pretrain_tiny_video_generator

        recipe = {**TINY_VIDEO_GENERATOR_RECIPE, "steps": steps or TINY_VIDEO_GENERATOR_RECIPE["steps"]}
        path = pretrain_tiny_video_generator(out or asset_path("tiny-wan-motion"), seed=seed, **recipe)
        console.print(f"saved tiny video generator to {path}")
        return
    if modality == "video":
        from .vlm.sft import TINY_VIDEO_RECIPE, build_tiny_video

        path = build_tiny_video(out or asset_path("tiny-qwen2.5-vl-video"), seed=seed,
                                sft_steps=steps or TINY_VIDEO_RECIPE["sft_steps"])
        console.print(f"saved tiny video model to {path}")
        return
    if modality == "gui":
        from .vlm.sft import TINY_GUI_RECIPE, build_tiny_gui

        path = build_tiny_gui(out or asset_path("tiny-qwen2.5-vl-gui"), seed=seed,
                              sft_steps=steps or TINY_GUI_RECIPE["sft_steps"])
        console.print(f"saved tiny GUI model to {path}")
        return
    if modality == "gui-grounding":
        from .vlm.sft import TINY_GUI_GROUNDING_RECIPE, build_tiny_gui_grounding

        path = build_tiny_gui_grounding(out or asset_path("tiny-qwen2.5-vl-gui-grounding"), seed=seed,
                                        sft_steps=steps or TINY_GUI_GROUNDING_RECIPE["sft_steps"])
        console.print(f"saved tiny GUI grounding model to {path}")
        return
    from .vlm.sft import TINY_VLM_RECIPE, build_tiny_vlm

    target = out or asset_path("tiny-qwen2.5-vl")
    recipe = {**TINY_VLM_RECIPE, "sft_steps": steps or TINY_VLM_RECIPE["sft_steps"]}
    if vision_steps is not None:
        recipe["vision_steps"] = vision_steps
    path = build_tiny_vlm(target, seed=seed, **recipe)
    console.print(f"saved tiny model to {path}")


bench_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Compare configurations on the same task and seed.")
app.add_typer(bench_app, name="bench")


def _run_bench(run) -> None:
    """Run a bench; a config or input problem is a clear one-line error and exit code 2."""
    from .config import ConfigError

    try:
        run()
    except ConfigError as exc:
        console.print(f"[red]config error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError, ImportError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)


@bench_app.command(name="algos", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_algos(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value overrides for every variant...]"),
    variants: str = typer.Option("grpo,dr_grpo,dapo,gspo,spo,ngrpo", help="comma-separated variants"),
    steps: int = typer.Option(40, help="RL steps per variant"),
    seeds: str = typer.Option("0", "--seeds", "--seed", help="one seed, or several comma-separated (0,1,2): every "
                              "variant runs with each; the table shows mean ± sd"),
    out: Path = typer.Option(Path("runs/bench-algos"), help="output directory (a run per variant, algos.json/md/png)"),
    threshold: Optional[float] = typer.Option(
        None, help="train-reward level for steps-to-threshold (default: halfway from before to the best after)"),
):
    """Train several RL algorithm variants on the same task and seed; print a comparison table."""
    from .bench.algos import DESCRIPTIONS, UnknownVariantError, check_variants, run_algo_bench

    try:
        names = check_variants(variants.split(","))
    except UnknownVariantError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        for name, desc in DESCRIPTIONS.items():
            console.print(f"  {name:<13} {desc}", highlight=False)
        raise typer.Exit(2)
    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        console.print(f"[red]error:[/] --seeds {seeds!r}: give integers separated by commas, e.g. 0,1,2")
        raise typer.Exit(2)
    path, overrides = _split_args(list(args or []))
    _run_bench(lambda: run_algo_bench(names, steps=steps, seed=seed_list[0] if len(seed_list) == 1 else seed_list,
                                      out_dir=out, config=path or DEFAULT_CONFIGS["vlm"],
                                      extra_overrides=overrides, threshold=threshold))


@bench_app.command(name="diffusion", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_diffusion(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value overrides for every variant...]"),
    variants: str = typer.Option("full_sde,sde_window,subsample", help="comma-separated variants"),
    steps: int = typer.Option(20, help="RL steps per variant"),
    seed: int = typer.Option(0, help="the same seed for every variant"),
    out: Path = typer.Option(Path("runs/bench-diffusion"), help="output directory"),
):
    """Generator RL variants (full SDE, SDE window, timestep subsampling, ...) on the same prompts and
    seed: time per RL iteration and held-out reward, side by side."""
    from .bench.algos import UnknownVariantError, check_variants
    from .bench.diffusion import DEFAULT_CONFIG, VARIANTS, run_diffusion_bench

    try:
        names = check_variants(variants.split(","), VARIANTS)
    except UnknownVariantError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    path, overrides = _split_args(list(args or []))
    _run_bench(lambda: run_diffusion_bench(names, steps=steps, seed=seed, out_dir=out, config=path or DEFAULT_CONFIG,
                                           extra_overrides=overrides))


@bench_app.command(name="speed", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_speed(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value overrides for the mmrl side...]"),
    shape: str = typer.Option("tiny", help="tiny (the shipped tiny Qwen2.5-VL) | 3b (a random Qwen2.5-VL-3B-shaped "
                              "model built under --out, no downloads)"),
    lora: bool = typer.Option(False, "--lora", help="LoRA on both sides (model.lora.* settings)"),
    prompts: int = typer.Option(4, help="prompts per step"),
    generations: int = typer.Option(8, help="samples per prompt (group size)"),
    tokens: int = typer.Option(256, help="completion tokens per sample (forced: min = max new tokens)"),
    steps: int = typer.Option(3, help="measured steps per side"),
    warmup: int = typer.Option(1, help="warm-up steps per side, left out of the table"),
    micro_batch: int = typer.Option(0, help="samples per forward/backward on both sides (0: min(16, samples))"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    dtype: str = typer.Option("auto", help="compute dtype: auto (bfloat16 on cuda, float32 on cpu) | float32 | bfloat16"),
    engine: str = typer.Option("hf", help="mmrl's rollout engine (rollout.engine): hf | vllm"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/bench-speed"), help="output directory (speed.json, speed.md)"),
):
    """mmrl against TRL's GRPOTrainer on the same model, prompts, group size and forced completion
    lengths, in one process: samples/s, tokens/s, rollout vs update time, peak memory, mmrl/TRL."""
    from .bench.speed import DEFAULT_CONFIG, SpeedOptions, check_trl, run_speed_bench

    try:
        check_trl()
    except ImportError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
    opts = SpeedOptions(shape=shape, lora=lora, prompts=prompts, generations=generations, tokens=tokens, steps=steps,
                        warmup=warmup, micro_batch=micro_batch, device=device, dtype=dtype, engine=engine, seed=seed)
    path, overrides = _split_args(list(args or []))
    _run_bench(lambda: run_speed_bench(opts, out_dir=out, config=path or DEFAULT_CONFIG, extra_overrides=overrides))


@bench_app.command(name="rollout", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_rollout(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value overrides]"),
    prompts: int = typer.Option(4, help="training prompts of the config's task"),
    n: int = typer.Option(8, help="samples per prompt"),
    tokens: int = typer.Option(24, help="new tokens at most per sample"),
    repeats: int = typer.Option(3, help="timed calls per engine (after one warm-up call)"),
    seed: int = typer.Option(0, help="sampling seed of the first timed call"),
):
    """HF generate vs vLLM on the same policy, prompts and budget: samples/s side by side (needs vLLM)."""
    from .bench.rollout import DEFAULT_CONFIG, run_rollout_bench

    path, overrides = _split_args(list(args or []))
    _run_bench(lambda: run_rollout_bench(path or DEFAULT_CONFIG, overrides, prompts=prompts, n=n, tokens=tokens,
                                         repeats=repeats, seed=seed, echo=lambda s: print(s, flush=True)))


@app.command()
def demo(
    runs: Path = typer.Option(Path("runs"), help="the runs directory the Runs, Before / after and Launch tabs use"),
    host: str = typer.Option("127.0.0.1", help="the address to bind; 0.0.0.0 exposes the demo to your network"),
    port: int = typer.Option(7860, help="the port"),
    share: bool = typer.Option(False, "--share", help="also open a public gradio.live link (off by default)"),
    models: Optional[List[Path]] = typer.Option(None, "--models", help="a directory of local checkpoints to "
                                               "offer (repeatable); nothing outside these, the runs and the "
                                               "assets is read"),
    device: str = typer.Option("cpu", help="where models run: cpu | cuda"),
):
    """A Gradio app: try a policy on a task, compare a run before and after RL, watch and launch runs."""
    try:
        from .demo.app import launch_app
    except ImportError as exc:
        console.print(f"[red]error:[/] the demo needs gradio ({escape(str(exc))}): pip install {escape('mmrl[demo]')}")
        raise typer.Exit(2)
    console.print(f"mmrl demo on http://{host}:{port} (runs: {runs.resolve()})")
    launch_app(runs, host, port, share, list(models or []), device=device)


@app.command(name="list")
def list_plugins():
    """List every named choice: tasks, rewards, advantage estimators, losses, prompt samplers, SDE
    samplers, batch selections, KL schedules, image perturbations, rollout engines."""
    from .registry import ALL_REGISTRIES

    for title, reg in ALL_REGISTRIES.items():
        print(f"{title}: {', '.join(reg.names())}")


def _configure_threads(cfg) -> None:
    import torch

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)


def _quiet_libraries() -> None:
    """Keep the terminal for mmrl's own progress: no per-file weight-loading bars."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def main() -> None:
    """The entry point. Under a launcher a failing rank's traceback is recorded for the launcher,
    which stops the other ranks and reports that rank's error (torch.distributed.elastic)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    record(_main)()


def _main() -> None:
    _quiet_libraries()
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
