"""The ``mmrl`` command line.

    mmrl train vlm                                  # the tiny default, on CPU, in minutes
    mmrl train diffusion                            # the tiny generator with Flow-GRPO, on CPU
    mmrl train vlm configs/vlm/grounding_tiny.yaml algo.epsilon_high=0.28 rollout.num_generations=8
    mmrl train --resume runs/exp1                   # continue runs/exp1 with its own config
    mmrl eval runs/exp1                             # score the run's final checkpoint on the eval split
    mmrl build-tiny vlm                             # rebuild the shipped tiny model
    mmrl bench algos --variants grpo,dapo --steps 40  # compare RL algorithms on the same task and seed
    mmrl bench speed --prompts 2 --generations 4 --tokens 16  # mmrl vs TRL's GRPOTrainer, same work
    mmrl bench rollout                                # HF generate vs vLLM samples/s (needs vLLM)
    mmrl bench async                                  # sync vs asynchronous training against a vLLM server
    mmrl plan vlm/qwen2_5_vl_3b_counting --gpu 24GB   # predicted peak memory per GPU, and what makes it fit
    mmrl rollout-server vlm/counting_tiny --port 8000  # a vLLM server for rollout.engine=vllm_server
    mmrl serve-reward composition --port 8100         # a reward over HTTP for the http reward
    mmrl demo                                         # a Gradio app on http://127.0.0.1:7860 (needs mmrl[demo])
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape  # error texts may hold brackets (`pip install mmrl[vllm]`)

from mmrl.cli.errors import configure_threads, console, fail, interruptions, user_errors
from mmrl.cli.eval import CONTEXT as EVAL_CONTEXT, EXAMPLES as EVAL_EXAMPLES, eval_
from mmrl.cli.help import ARGS_HELP, ARGS_METAVAR, examples
from mmrl.cli.serve_reward import SETTINGS as SERVE_REWARD, serve_reward
from mmrl.config.recipes import DEFAULT_RECIPES, family_modality, split_args
from mmrl.registry import TINY_MODELS

# Plain click help: rich markup would swallow `[CONFIG.yaml]`, `[key=value]` and `mmrl[video]`.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Reinforcement learning for multimodal models.")

MODALITIES = tuple(DEFAULT_RECIPES)


def _load(modality: Optional[str], args: list[str], extra: list[str] = ()):
    from mmrl.config import builtin_config_path, load_config

    _check_modality(modality)
    path, overrides = split_args(args)
    return load_config(builtin_config_path(path or DEFAULT_RECIPES[modality]), [*overrides, *extra])


def _check_modality(modality: Optional[str]) -> None:
    if modality is None:
        fail(f"say what to train: mmrl train {{{' | '.join(MODALITIES)}}} [CONFIG.yaml] [key=value ...] "
              "(or mmrl train --resume runs/NAME); see mmrl train --help")
    if modality not in MODALITIES:
        fail(f"`mmrl train {modality}` is not available: no such modality (available: {', '.join(MODALITIES)}; "
              "`mmrl train --resume runs/NAME` continues a run)")


def _is_recipe(name: str) -> bool:
    from mmrl.config import ConfigError, builtin_config_path

    try:
        return builtin_config_path(name).is_file()
    except ConfigError:
        return False


def _resume_config(modality: Optional[str], args: list[str], allow_change: bool):
    """The config that resumes the run that the arguments name (``--resume runs/NAME``, ``vlm
    --resume runs/NAME`` or ``log.run_name=NAME --resume``): the run's own ``config.yaml`` with the
    overrides given on top, or a recipe given explicitly; exits when the run is already finished."""
    from mmrl.config import builtin_config_path, load_config
    from mmrl.runs.resume import find_run, finished_steps, load_run_config, resume_command, resume_overrides

    target = None
    if modality is not None and modality not in MODALITIES:  # `mmrl train --resume runs/NAME`
        target, modality = modality, None
    recipe, overrides = split_args(args)
    if recipe is not None and not _is_recipe(recipe):  # `mmrl train vlm --resume runs/NAME`
        if target is not None:
            fail(f"--resume takes one run; got {target!r} and {recipe!r}")
        target, recipe = recipe, None
    extra = ["allow_config_change=true"] if allow_change else []
    default = DEFAULT_RECIPES.get(modality) if modality else None
    where = load_config(builtin_config_path(recipe or default) if (recipe or default) else None, overrides)
    run_dir = find_run(target or where.log.run_name, Path(where.log.output_dir))
    if recipe is None:
        cfg = load_run_config(run_dir, [*overrides, *extra])
    else:
        cfg = load_config(builtin_config_path(recipe), [*overrides, *extra, *resume_overrides(run_dir)])
    if finished_steps(run_dir, cfg.train.steps):
        console.print(f"{run_dir} has trained all {cfg.train.steps} steps (held-out results in "
                      f"{run_dir / 'summary.json'}); nothing to do. To train further, raise train.steps: "
                      f"{resume_command(run_dir)} train.steps={2 * cfg.train.steps} --allow-config-change",
                      highlight=False)
        raise typer.Exit(0)
    return cfg, modality


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, epilog=examples(
    "mmrl train vlm                                        # the tiny default, on CPU, in minutes",
    "mmrl train vlm configs/vlm/grounding_tiny.yaml algo.epsilon_high=0.28 rollout.num_generations=8",
    "mmrl train gui                                        # multi-step episodes on the synthetic phone",
    "mmrl train vlm model.path=/models/Qwen2.5-VL-3B-Instruct train.device=cuda",
    "mmrl train --resume runs/counting-20261125-101500   # continue a run with its own config"))
def train(
    modality: Optional[str] = typer.Argument(None, metavar="MODALITY",
                                             help=f"what to train: {' | '.join(MODALITIES)} (not needed with --resume)"),
    args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP),
    resume: bool = typer.Option(False, "--resume", help="continue a run from its latest checkpoint with the run's own "
                                "config: --resume runs/NAME, or log.run_name=NAME --resume"),
    allow_config_change: bool = typer.Option(False, "--allow-config-change",
                                             help="with --resume: continue with the overrides given, which change "
                                             "the run's config (shown as a diff and refused without this)"),
):
    """Train with RL. Without a recipe, trains the modality's built-in tiny default on CPU.

    Ctrl-C finishes the step under way, saves a checkpoint and stops; a second Ctrl-C stops at once.
    """
    args = list(args or [])
    with user_errors():
        if resume:
            cfg, modality = _resume_config(modality, args, allow_config_change)
        else:
            cfg = _load(modality, args, ["allow_config_change=true"] if allow_config_change else [])
    configure_threads(cfg)
    from mmrl.api import make_policy
    from mmrl.core.trainer import Trainer, build_task
    from mmrl.runs.disk import check_writable
    from mmrl.runs.resume import resume_command

    with user_errors():
        check_writable(Path(cfg.log.output_dir) / (cfg.log.run_name or ""))  # before minutes of model loading
        task = build_task(cfg)
        if modality is not None and task.modality != family_modality(modality):
            raise ValueError(f"task {task.name!r} is a {task.modality} task; run it with `mmrl train {task.modality}`")
        _warn_if_it_will_not_fit(cfg, task.modality)
        policy = make_policy(cfg, task)
        trainer = Trainer(cfg, policy, task)  # checks the config against the policy: its errors are the user's
    if trainer.main:  # one voice for several processes
        console.print(f"run directory: [bold]{trainer.run_dir}[/]")
    with user_errors(setup=False, resume=resume_command(trainer.run_dir)), interruptions():
        result = trainer.train()
    if result.before and trainer.main:
        _print_headline(task, result.before, result.after)


def _warn_if_it_will_not_fit(cfg, modality: str) -> None:
    """One line when ``mmrl plan`` says the run will not fit the CUDA device it trains on (a plan
    that cannot be made, say of a checkpoint the reader does not know, warns of nothing)."""
    from mmrl.cli.plan import fit_warning
    from mmrl.core.distributed import pick_device

    device = pick_device(cfg.train.device)
    if device.type != "cuda":
        return
    try:
        line = fit_warning(cfg, modality, device)
    except Exception:  # noqa: BLE001 - a prediction never stops a run
        return
    if line:
        console.print(f"[yellow]warning:[/] {escape(line)}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, epilog=examples(
    "mmrl plan vlm/qwen2_5_vl_3b_counting --gpu 80GB             # each memory mode on one 80 GB GPU",
    "mmrl plan vlm/qwen2_5_vl_3b_counting --gpu 24GB model.lora.enabled=true",
    "mmrl plan vlm/qwen2_5_vl_7b_deepeyes --gpu 80GB --gpus 8     # sharded over 8 GPUs",
    "mmrl plan vlm/counting_tiny --gpu 24GB --prompt-tokens 200   # a longer question"))
def plan(
    args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP),
    gpu: str = typer.Option("80GB", "--gpu", help="each GPU's memory as sold: 80GB, 24GB, 141GB (read as GiB)"),
    gpus: int = typer.Option(1, "--gpus", help="GPUs the run is launched on (the sharded modes divide over them)"),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens",
                                                help="text tokens of a prompt (default 64), images added"),
    images: int = typer.Option(1, "--images", help="images per prompt, each at vlm.max_pixels"),
):
    """Predict the peak memory per GPU of a run in each memory mode, before anything loads.

    Reads the recipe and the model's config.json only (a hub id's config, never weights): weights,
    gradients, optimizer state, activations, logits, reference model, KV cache or vLLM share, vision
    tower; says whether it fits and which knobs make it fit.
    """
    from mmrl.cli.plan import describe, plans
    from mmrl.config import builtin_config_path, load_config
    from mmrl.core.memory_plan import parse_size
    from mmrl.core.trainer import build_task

    with user_errors():
        card = parse_size(gpu)
        if gpus < 1:
            raise ValueError(f"--gpus {gpus}: give the number of GPUs, 1 or more")
        path, overrides = split_args(list(args or []))
        cfg = load_config(builtin_config_path(path or DEFAULT_RECIPES["vlm"]), overrides)
        shape, rows = plans(cfg, card, gpus, build_task(cfg).modality, prompt_tokens, images)
    for line in describe(cfg, shape, rows, card, gpus):  # the command's output: stdout, as `mmrl list`'s
        print(line)


def _print_headline(task, before: dict, after: dict) -> None:
    """The run's last lines: the task's success measure, then the mean reward (named after its
    one component when it has one, e.g. the composition score of the generator default)."""
    lead = task.success_metric if task.success_metric in before else None
    if lead:
        console.print(f"held-out {lead}: before {before[lead]:.3f} -> after {after[lead]:.3f}", highlight=False)
    parts = [k.split("/", 1)[1] for k in before if k.startswith("reward/")]
    named = f" ({parts[0]})" if len(parts) == 1 else ""
    console.print(f"held-out reward{named}: before {before['reward']:.3f} -> after {after['reward']:.3f}",
                  highlight=False)


app.command(name="eval", context_settings=EVAL_CONTEXT, epilog=EVAL_EXAMPLES)(eval_)


@app.command(name="export", epilog=examples(
    "mmrl export runs/exp1 exports/exp1                  # the latest checkpoint, LoRA merged",
    "mmrl export runs/exp1 exports/exp1-lora --adapters  # a VLM's LoRA adapters alone (peft's format)",
    "mmrl export runs/exp1 exports/exp1-s50 --step 50"))
def export(
    run_dir: Path = typer.Argument(..., help="a run directory (what `mmrl train` wrote)"),
    out: Path = typer.Argument(..., help="a new directory to write the model to"),
    step: Optional[int] = typer.Option(None, help="the checkpoint's step (default: the latest)"),
    adapters: bool = typer.Option(False, "--adapters", help="a VLM's LoRA adapters alone instead of merged weights"),
):
    """Hand a trained model on: a VLM that transformers' from_pretrained loads, a generator that its
    pipeline loads, with a model card (README.md: the held-out before/after table, recipe, data)."""
    from mmrl.cli.export import export_run

    with user_errors():
        path = export_run(run_dir, out, step=step, adapters=adapters)
    console.print(f"exported {run_dir} to {path} (model card: {path / 'README.md'})")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, epilog=examples(
    "mmrl sft vlm/counting_tiny log.run_name=warm                  # -> runs/warm/model",
    "mmrl train vlm vlm/counting_tiny model.path=runs/warm/model   # then RL from it (R1-style)",
    "mmrl sft vlm/counting_tiny task.options.train_path=my.jsonl model.lora.enabled=true",
    "mmrl sft vlm/counting_tiny log.run_name=warm resume=true      # continue it after a Ctrl-C"))
def sft(args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP)):
    """Supervised fine-tuning on the task's reference answers (the loss on the answer tokens only),
    with mmrl train's config, policy and checkpoints; writes <run dir>/model for model.path."""
    from mmrl.cli.sft import command

    command(list(args or []))


@app.command(name="rollout-server", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             epilog=examples(
    "mmrl rollout-server vlm/counting_tiny --port 8000      # then: mmrl train vlm vlm/counting_tiny \\",
    "    rollout.engine=vllm_server rollout.server_urls=[http://127.0.0.1:8000]",
    "mmrl rollout-server vlm/counting_tiny --vllm /work/venv-vllm/bin/vllm -- --max-num-seqs 64"))
def rollout_server(args: Optional[List[str]] = typer.Argument(None, metavar=ARGS_METAVAR, help=ARGS_HELP),
                   port: int = typer.Option(8000, help="the port to serve on"),
                   host: str = typer.Option("127.0.0.1", help="the address to bind (another one is warned about: "
                                            "the weight-sync endpoints let any client reload the weights)"),
                   vllm: Optional[str] = typer.Option(None, help="the vllm executable (default: "
                                                      "$MMRL_VLLM_ENV/bin/vllm, else vllm on the PATH)")):
    """Serve the recipe's model with vLLM for rollout.engine=vllm_server (weights pushed by the trainer);
    arguments after the recipe's that start with - (or after --) go to vLLM."""
    from mmrl.cli.rollout_server import command

    with user_errors():
        code = command(list(args or []), port, host, vllm, lambda line: console.print(escape(line), highlight=False))
    raise typer.Exit(code)


app.command(**SERVE_REWARD)(serve_reward)


@app.command(name="build-tiny", epilog=examples(
    "mmrl build-tiny vlm                        # the tiny default (assets/tiny-qwen2.5-vl), ~5 min on CPU",
    "mmrl build-tiny gui --out /tmp/tiny-gui    # elsewhere, leaving the shipped one alone",
    "mmrl build-tiny diffusion --steps 1000 --seed 1"))
def build_tiny(
    modality: str = typer.Argument("vlm", help="which tiny model: " + "; ".join(
        f"{name} ({model.about})" for name, model in TINY_MODELS.items())),
    out: Optional[Path] = typer.Option(None, help="output directory (default: the shipped asset)"),
    steps: Optional[int] = typer.Option(None, help="warm-start steps (default: the recipe's: vlm 600, video 100 "
                                        "gui 800, gui-grounding 240 and zoom 300 (then 150 more) SFT steps, diffusion 4000 and video-gen 2500 flow-matching steps)"),
    seed: int = typer.Option(0),
    vision_steps: Optional[int] = typer.Option(None, help="vlm and gui: pre-train the vision tower on per-cell "
                                               "labels for this many steps first, then freeze it (default: the "
                                               "recipe's, vlm 300, gui 800; 0: off)"),
):
    """Rebuild a shipped tiny model from scratch (tokenizer, weights, warm start)."""
    if modality not in TINY_MODELS:
        console.print(f"[red]error:[/] no tiny {modality} model (available: {', '.join(TINY_MODELS.names())})")
        raise typer.Exit(2)
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = TINY_MODELS.get(modality)
    path = model.build(out, seed=seed, steps=steps, vision_steps=vision_steps)
    console.print(f"saved {model.what} to {path}")


from mmrl.cli.bench import bench_app  # noqa: E402
from mmrl.cli.report import EXAMPLES as REPORT_EXAMPLES, report as report_command  # noqa: E402

app.add_typer(bench_app, name="bench")
app.command(name="report", epilog=REPORT_EXAMPLES)(report_command)


@app.command(epilog=examples(
    "mmrl demo                                      # http://127.0.0.1:7860 over ./runs",
    "mmrl demo --runs runs --models /models --device cuda",
    "mmrl demo --host 0.0.0.0 --auth me:secret     # reachable on your network, with a password"))
def demo(
    runs: Path = typer.Option(Path("runs"), help="the runs directory the Runs, Before / after and Launch tabs use"),
    host: str = typer.Option("127.0.0.1", help="the address to bind; any other than loopback (0.0.0.0: your "
                             "network) needs --auth or --no-auth"),
    port: int = typer.Option(7860, help="the port"),
    share: bool = typer.Option(False, "--share", help="also open a public gradio.live link (off by default; "
                               "needs --auth or --no-auth)"),
    auth: Optional[str] = typer.Option(None, "--auth", envvar="MMRL_DEMO_AUTH", metavar="USER:PASSWORD",
                                       help="the login the page asks for (or the MMRL_DEMO_AUTH variable, "
                                       "which `ps` does not show)"),
    no_auth: bool = typer.Option(False, "--no-auth", help="serve beyond loopback without a password "
                                 "(the Launch tab is then off)"),
    models: Optional[List[Path]] = typer.Option(None, "--models", help="a directory of local checkpoints to "
                                               "offer (repeatable); nothing outside these, the runs and the "
                                               "assets is read"),
    device: str = typer.Option("cpu", help="where models run: cpu | cuda"),
    max_runs: int = typer.Option(1, "--max-runs", min=1, help="runs started from the Launch tab that may train "
                                 "at once; Start refuses another until one ends"),
):
    """A Gradio app: try a policy on a task, compare a run before and after RL, watch and launch runs."""
    from mmrl.demo.exposure import decide, parse_auth

    try:
        login = parse_auth(auth)
        decide(host, share, login, no_auth)  # refused before gradio is even imported
        from mmrl.demo.app import launch_app
    except ValueError as exc:  # a malformed --auth, or beyond loopback without a password
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    except ImportError as exc:
        console.print(f"[red]error:[/] the demo needs gradio ({escape(str(exc))}): pip install {escape('mmrl[demo]')}")
        raise typer.Exit(2)
    from mmrl.demo.paths import RootRefused

    console.print(f"mmrl demo (runs: {runs.resolve()})")
    try:
        launch_app(runs, host, port, share, list(models or []), device=device, auth=login, no_auth=no_auth,
                   max_runs=max_runs)
    except RootRefused as exc:  # a served directory that is a link or another user's: refused before serving
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)


@app.command(name="list", epilog=examples(
    "mmrl list                          # then run a recipe: mmrl train vlm vlm/grounding_tiny",
    "mmrl list | grep tiny              # the recipes that run on a laptop CPU",
    "mmrl list | grep '^rewards:'       # the reward names a task or config may use"))
def list_plugins():
    """List the shipped recipes (one line each) and every named choice: tasks, rewards, advantage
    estimators, losses, prompt samplers, SDE samplers, batch selections, KL schedules, image
    perturbations, rollout engines, optimizers."""
    from mmrl.config.recipes import recipe_names, recipe_summary
    from mmrl.registry import ALL_REGISTRIES

    names = recipe_names()
    width = max(map(len, names), default=0)
    print("recipes (run one as `mmrl train FOLDER NAME`, e.g. `mmrl train vlm vlm/grounding_tiny`; "
          "the tiny ones run on a laptop CPU):")
    for name in names:
        print(f"  {name:<{width}}  {recipe_summary(name)}")
    print()
    for title, reg in ALL_REGISTRIES.items():
        print(f"{title}: {', '.join(reg.names())}")


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
    app()


if __name__ == "__main__":
    main()
