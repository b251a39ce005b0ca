"""The shipped tiny VLMs' builders (``mmrl build-tiny vlm|video|gui|gui-grounding``, see
:mod:`mmrl.config.tiny_models`): each prepares its starting model (a random initialisation, a vision tower
pre-trained on the synthetic cells or screens, or a shipped model) and warm-starts it by ``mmrl sft``
(:class:`mmrl.vlm.sft_run.SFTRun`) on its recipe's task mixture. The tiny default follows the R1-style
recipe: ``build_tiny_vlm`` trains the tokenizer, initialises a small Qwen2.5-VL, pre-trains its
vision tower, runs a short SFT on the synthetic tasks' reference completions and saves the
result. It is deliberately short, so that RL has visible headroom.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from ..task import Task
from . import tiny
from .tiny_tasks import DEFAULT_TINY_GUI_TASKS, DEFAULT_TINY_TASKS, DEFAULT_TINY_VIDEO_TASKS


def tokenizer_corpus(tasks: Sequence[Task], per_task: int = 3000) -> list[str]:
    """The text the tiny tokenizer is trained on: prompts, reference answers, numbers."""
    texts = ["You are a helpful assistant.", "system", "user", "assistant"]
    texts += [str(i) for i in range(0, 1001)]
    for task in tasks:
        split = task.examples("train")
        for i in range(min(per_task, len(split))):
            ex = split[i]
            for msg in task.prompt(ex):
                content = msg["content"]
                if isinstance(content, str):
                    texts.append(content)
                else:
                    texts += [c["text"] for c in content if c.get("type") == "text"]
            texts.append(task.target(ex))
    return texts



# How the shipped tiny VLM is built (`mmrl build-tiny vlm`); each value chosen by measurement, see
# docs/tiny-default.md.
TINY_VLM_RECIPE = {"vision_steps": 300, "sft_steps": 600, "decay_steps": 800, "batch_size": 32,
                   "lr": 1e-3, "thought_dropout": 0.0}


def source_name(spec: dict) -> str:
    """A warm-start mixture's name for the source of ``spec``: the task's name, followed by its
    option values where the specs hold that task more than once (``counting_color_enumerate``)."""
    values = [str(v) for v in spec["options"].values() if isinstance(v, (str, int, float, bool))]
    return "_".join([spec["name"], *values])


def warm_start_overrides(task_specs: Sequence[dict], sft_steps: int, decay_steps: int | None, batch_size: int,
                         lr: float, seed: int, thought_dropout: float = 0.0) -> list[str]:
    """The ``mmrl sft`` config of a tiny model's warm start (beside ``model.path`` and where it
    logs): the ``task_specs`` as one task (a ``mixture`` of them when there are several), each drawn
    with its ``weight`` (``data.sampler=weighted``, with replacement); AdamW at ``lr`` without weight
    decay, a 20-step warmup times a linear decay that would end at ``decay_steps``, floored at 5%
    (``linear_horizon``); gradients clipped at norm 1; the whole batch in one forward and one
    optimizer step; the vision tower frozen; the held-out loss on two batches of examples."""
    names = [spec["name"] for spec in task_specs]
    sources = [source_name(spec) if names.count(spec["name"]) > 1 else spec["name"] for spec in task_specs]
    weights = {source: float(spec.get("weight", 1.0)) for source, spec in zip(sources, task_specs)}
    if len(task_specs) == 1:
        task = [f"task.name={names[0]}", f"task.options={json.dumps(task_specs[0]['options'])}"]
    else:
        tasks = {source: {"task": spec["name"], **spec["options"]} for source, spec in zip(sources, task_specs)}
        task = ["task.name=mixture", f"task.options={json.dumps({'tasks': tasks})}"]
    return [*task, "data.sampler=weighted", f"data.sampler_kwargs={json.dumps({'weights': weights})}",
            f"data.thought_dropout={thought_dropout}", f"train.steps={sft_steps}", f"train.seed={seed}",
            f"train.prompts_per_step={batch_size}", "train.mini_batch_size=0", f"train.micro_batch_size={batch_size}",
            "train.optim=adamw_torch", f"train.learning_rate={lr}", "train.weight_decay=0.0", "train.adam_beta1=0.9",
            "train.adam_beta2=0.999", "train.max_grad_norm=1.0", "train.lr_scheduler_type=linear_horizon",
            f"train.lr_scheduler_kwargs={json.dumps({'decay_steps': decay_steps or sft_steps, 'min_lr_rate': 0.05})}",
            "train.warmup_steps=20", "train.device=cpu", "vlm.freeze_vision=true",
            f"eval.num_examples={2 * batch_size}"]  # the held-out loss before and after: two batches


def run_warm_start(base: str | Path, out: str | Path, overrides: Sequence[str], task_specs: Sequence[dict],
                   sft_steps: int, decay_steps: int | None, batch_size: int, lr: float, seed: int,
                   progress: bool, thought_dropout: float = 0.0) -> Path:
    """``mmrl sft`` of ``base`` (:func:`warm_start_overrides`, plus the config ``overrides``, e.g.
    the inputs' pixel budget) in a scratch run directory; its model saved to ``out`` through a
    staging directory, so a build that dies leaves the previous checkpoint whole."""
    from ..config import load_config
    from .sft_run import SFTRun

    with tempfile.TemporaryDirectory(prefix="mmrl-warm-start-") as runs:
        cfg = load_config(None, [f"model.path={base}", *overrides,
                                 *warm_start_overrides(task_specs, sft_steps, decay_steps, batch_size, lr, seed,
                                                       thought_dropout),
                                 "rollout.temperature=1.0", "algo.beta=0.0", f"log.output_dir={runs}",
                                 "log.run_name=warm-start", f"log.progress={str(progress).lower()}",
                                 "log.tensorboard=false", "log.save_every=0"])
        result = SFTRun(cfg).run()
        if progress:
            print(f"warm start ({sft_steps} mmrl sft steps): held-out loss {result.before:.4f} -> {result.after:.4f}")
        return publish(result.model_dir, Path(out))


def publish(model_dir: Path, out: Path) -> Path:
    """Copy ``model_dir`` to ``out`` through a staging directory (a copy that dies leaves ``out``)."""
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(model_dir, staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def build_tiny_vlm(out: str | Path, sft_steps: int = TINY_VLM_RECIPE["sft_steps"],
                   batch_size: int = TINY_VLM_RECIPE["batch_size"], lr: float = TINY_VLM_RECIPE["lr"],
                   thought_dropout: float = TINY_VLM_RECIPE["thought_dropout"], seed: int = 0,
                   progress: bool = True, task_specs: Sequence[dict] = DEFAULT_TINY_TASKS,
                   vision_steps: int = TINY_VLM_RECIPE["vision_steps"],
                   decay_steps: int | None = TINY_VLM_RECIPE["decay_steps"]) -> Path:
    """Build the tiny Qwen2.5-VL from scratch and warm-start it; returns the checkpoint dir.

    The defaults (:data:`TINY_VLM_RECIPE`) were found by measurement so that RL has competence to
    sharpen (docs/tiny-default.md):
    - ``vision_steps`` first pre-trains the whole vision tower to name each cell's colour and
      shape (:mod:`mmrl.vlm.vision_pretrain`); SFT then runs with it frozen, and learns
      colour-specific counting, which it did not with a random tower; a tower trained at the SFT
      learning rate collapsed its features to one vector per image. ``vision_steps=0`` keeps the
      random tower (frozen).
    - ``thought_dropout`` 0: every reference keeps its ``<think>`` block, so the warm-started model
      already writes the answer layout and RL's reward moves with task accuracy, not format.
      (> 0 trains that fraction without the block, "Think or Not?"'s thought dropout.)
    - ``sft_steps`` < ``decay_steps``: SFT stops with the learning rate at a quarter of its peak,
      greedy counting accuracy ~0.55 while pass@8 is ~0.94; finishing the schedule alone would
      take it to ~0.85.

    The SFT stage is ``mmrl sft`` (:func:`run_warm_start`); a spec's ``"weight"`` is its share of
    the batches.
    """
    from ..config import load_config
    from ..registry import TASKS, load_plugins
    from .policy import VLMPolicy
    from .vision_pretrain import pretrain_vision

    load_plugins()
    tasks = [TASKS.get(spec["name"])(**spec["options"]) for spec in task_specs]
    torch.manual_seed(seed)
    tokenizer = tiny.build_tokenizer(tokenizer_corpus(tasks), vocab_size=1024)
    processor = tiny.build_processor(tokenizer)
    model = tiny.build_model(tokenizer, seed=seed)
    with tempfile.TemporaryDirectory(prefix="mmrl-tiny-") as tmp:
        base = tiny.save_tiny(model, processor, Path(tmp) / "random")
        if vision_steps > 0:
            policy = VLMPolicy(load_config(None, [f"model.path={base}", "train.device=cpu"]))
            pretrain_vision(policy.model, policy.processor.image_processor, steps=vision_steps, seed=seed)
            base = tiny.save_tiny(policy.model, policy.processor, Path(tmp) / "vision-pretrained")
            del policy
        return run_warm_start(base, out, (), task_specs, sft_steps, decay_steps, batch_size, lr, seed, progress,
                              thought_dropout)


# The tiny video default (`mmrl build-tiny video`): the shipped tiny VLM (its tower pre-trained on
# the scene cells and frozen) warm-started on the synthetic clips of both video tasks.
TINY_VIDEO_RECIPE = {"sft_steps": 100, "decay_steps": 500, "batch_size": 32, "lr": 1e-3}
TINY_VIDEO_PIXELS = 112 * 112  # the synthetic frames as they are (vlm.video_*_pixels of the recipes)


def build_tiny_video(out: str | Path, base: str = "tiny", sft_steps: int = TINY_VIDEO_RECIPE["sft_steps"],
                     decay_steps: int | None = TINY_VIDEO_RECIPE["decay_steps"],
                     batch_size: int = TINY_VIDEO_RECIPE["batch_size"], lr: float = TINY_VIDEO_RECIPE["lr"],
                     seed: int = 0, progress: bool = True,
                     task_specs: Sequence[dict] = DEFAULT_TINY_VIDEO_TASKS) -> Path:
    """``mmrl sft`` of ``base`` (default: the shipped tiny VLM) on the video tasks' reference
    answers with its vision tower frozen; returns the checkpoint dir. See docs/video.md."""
    budget = [f"vlm.video_min_pixels={TINY_VIDEO_PIXELS}", f"vlm.video_max_pixels={TINY_VIDEO_PIXELS}"]
    return run_warm_start(base, out, budget, task_specs, sft_steps, decay_steps, batch_size, lr, seed, progress)


# The tiny GUI default (`mmrl build-tiny gui`): the shipped tiny VLM whose vision tower is pre-trained
# again on the synthetic phone's screens (each token names its cell's element, row and column: the
# position a click needs), then warm-started on clicks on named elements (screen_grounding) and the
# scripted solver's actions along episodes of the environment's tasks (gui_env). Screens are 4 x 8
# cells of 28 px (112 x 224), seen as they are: one vision token per cell.
TINY_GUI_RECIPE = {"vision_steps": 800, "sft_steps": 800, "decay_steps": 1200, "batch_size": 32, "lr": 1e-3}
TINY_GUI_PIXELS = 112 * 224  # vlm.min_pixels = vlm.max_pixels of the GUI recipes
TINY_GUI_BUDGET = (f"vlm.min_pixels={TINY_GUI_PIXELS}", f"vlm.max_pixels={TINY_GUI_PIXELS}")  # as config overrides


def build_tiny_gui(out: str | Path, base: str = "tiny", sft_steps: int = TINY_GUI_RECIPE["sft_steps"],
                   vision_steps: int = TINY_GUI_RECIPE["vision_steps"],
                   decay_steps: int | None = TINY_GUI_RECIPE["decay_steps"],
                   batch_size: int = TINY_GUI_RECIPE["batch_size"], lr: float = TINY_GUI_RECIPE["lr"],
                   seed: int = 0, progress: bool = True, task_specs: Sequence[dict] = DEFAULT_TINY_GUI_TASKS) -> Path:
    """Pre-train ``base``'s vision tower on the phone's screens (``vision_steps``; 0: keep it),
    then ``mmrl sft`` on the GUI tasks with the tower frozen; returns the checkpoint dir. See
    docs/gui-agents.md."""
    from ..config import load_config
    from ..envs import make_env
    from .policy import VLMPolicy
    from .vision_pretrain import pretrain_vision_on_screens

    if vision_steps <= 0:
        return run_warm_start(base, out, TINY_GUI_BUDGET, task_specs, sft_steps, decay_steps, batch_size, lr,
                              seed, progress)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(prefix="mmrl-tiny-gui-") as tmp:
        policy = VLMPolicy(load_config(None, [f"model.path={base}", "train.device=cpu", *TINY_GUI_BUDGET]))
        pretrain_vision_on_screens(policy.model, policy.processor.image_processor, make_env("synthetic_gui"),
                                   steps=vision_steps, seed=seed)
        tiny.save_tiny(policy.model, policy.processor, tmp)
        del policy
        return run_warm_start(tmp, out, TINY_GUI_BUDGET, task_specs, sft_steps, decay_steps, batch_size, lr, seed,
                              progress)


# The tiny grounding default (`mmrl build-tiny gui-grounding`): the tiny GUI default taught more
# clicks on named elements. One warm start cannot leave RL room on both GUI recipes: an episode's
# first step is a click on an app's icon, so a warm start that grounds well (point accuracy about
# 0.4, where supervised grounding learns fastest) already solves about 0.4 of the episodes, and
# one that leaves episodes to RL (0.01) grounds at 0.15, where grounding barely moves in a 10-minute
# run (docs/gui-agents.md).
TINY_GUI_GROUNDING_RECIPE = {"sft_steps": 240, "decay_steps": 480, "batch_size": 32, "lr": 1e-3}


def build_tiny_gui_grounding(out: str | Path, base: str = "tiny-gui",
                             sft_steps: int = TINY_GUI_GROUNDING_RECIPE["sft_steps"],
                             decay_steps: int | None = TINY_GUI_GROUNDING_RECIPE["decay_steps"],
                             batch_size: int = TINY_GUI_GROUNDING_RECIPE["batch_size"],
                             lr: float = TINY_GUI_GROUNDING_RECIPE["lr"], seed: int = 0, progress: bool = True) -> Path:
    """``mmrl sft`` of ``base`` (default: the tiny GUI default) on screen grounding alone, tower
    frozen; returns the checkpoint dir."""
    return run_warm_start(base, out, TINY_GUI_BUDGET, ({"name": "screen_grounding", "options": {}, "weight": 1.0},),
                          sft_steps, decay_steps, batch_size, lr, seed, progress)
