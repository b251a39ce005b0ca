"""Supervised warm start, and the recipe that builds the shipped tiny model.

R1-style recipes run SFT before RL so that RL starts from a policy that already follows the answer
format and is sometimes right (GRPO learns nothing from groups whose rewards are all zero). The
tiny default follows that recipe: ``build_tiny_vlm`` trains the tokenizer, initialises a small
Qwen2.5-VL, runs a short SFT on the synthetic tasks' reference completions and saves the result.
It is deliberately short, so that RL has visible headroom.
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..core.rollouts import Rollouts
from ..task import Task
from . import tiny
from .processing import split_patches
from .tiny_tasks import DEFAULT_TINY_GUI_TASKS, DEFAULT_TINY_TASKS, DEFAULT_TINY_VIDEO_TASKS


_THINK_BLOCK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def drop_thought(target: str) -> str:
    """The reference completion without its reasoning block (Think-or-Not's thought dropout)."""
    return _THINK_BLOCK.sub("", target, count=1)


def sft_batch(policy, tasks: Sequence[Task], examples: Sequence[tuple[int, dict]],
              drop: Sequence[bool] | None = None) -> Rollouts:
    """A batch whose "completions" are the tasks' reference answers (:func:`sft_target`) + EOS,
    ready to score: the prompt (the task's chat prompt, up to the assistant's turn) is context, so
    ``action_mask[i]`` is 1 on exactly the reference's tokens and its EOS, 0 on the padding after.

    ``drop[i]`` removes the reasoning block of example i's reference (thought dropout).
    """
    # Coordinates of the references in the policy's space (as RL's examples are prepared).
    prepared = policy.prepare_examples([ex for _, ex in examples])
    examples = [(t, ex) for (t, _), ex in zip(examples, prepared)]
    prompts = [tasks[t].build_prompt(ex) for t, ex in examples]  # a tool task's turn: its conversation so far
    enc, images_per_sample = policy.encode_prompts(prompts)
    patches = split_patches(enc, images_per_sample)
    eos = policy.tokenizer.eos_token_id
    drop = drop or [False] * len(examples)
    texts = [sft_target(tasks[t], ex) for t, ex in examples]
    texts = [drop_thought(text) if d else text for text, d in zip(texts, drop)]
    targets = [torch.tensor(policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]) for text in texts]
    width = max(len(x) for x in targets)
    mask = torch.zeros(len(targets), width)
    for i, x in enumerate(targets):
        mask[i, :len(x)] = 1.0
    return Rollouts(
        group_ids=torch.arange(len(targets)),
        action_mask=mask,
        payload={
            "prompt_ids": [enc["input_ids"][i][enc["attention_mask"][i].bool()] for i in range(len(targets))],
            "completion_ids": targets,
            "pixel_values": [p[0] for p in patches],
            "image_grid_thw": [p[1] for p in patches],
            "video": policy.split_videos(enc),
        },
    )


def sft_target(task: Task, ex: dict) -> str:
    """The reference completion of ``ex``: the task's :meth:`~mmrl.Task.target`; for a task
    without reference completions (``target`` raises NotImplementedError), the example's own
    ``messages`` (a chat whose last turn is the assistant's: that turn's text) or ``solution``."""
    try:
        return task.target(ex)
    except NotImplementedError as exc:
        own = record_completion(ex)
        if own is None:
            raise ValueError(f"{exc}; an example can give its own as 'messages' (a chat ending in an assistant "
                             f"turn) or 'solution', which this one has not (keys: {', '.join(map(str, ex))})") from exc
        return own


def record_completion(ex: dict) -> str | None:
    """The text of the last turn of ``ex["messages"]`` when it is the assistant's (``role`` /
    ``content``, or LLaVA's ``from: gpt`` / ``value``; list contents keep their text parts), else
    ``ex["solution"]`` when it is a string, else None."""
    messages = ex.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        last = messages[-1]
        if str(last.get("role", last.get("from", ""))).lower() in ("assistant", "gpt"):
            content = last.get("content", last.get("value"))
            if isinstance(content, list):
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text")
            if isinstance(content, str):
                return content
    solution = ex.get("solution")
    return solution if isinstance(solution, str) else None


def sft_split(task: Task, split: str):
    """The examples SFT imitates: the task's ``split``, or for an episodic task the states of its
    scripted solver's episodes (:class:`mmrl.envs.EnvTask`'s ``sft_examples``)."""
    return getattr(task, "sft_examples", task.examples)(split)


def draw_examples(rng: random.Random, splits: Sequence, batch_size: int,
                  task_weights: Sequence[float] | None = None) -> list[tuple[int, dict]]:
    """``batch_size`` (task index, example) pairs: each task drawn with probability proportional
    to its weight (uniform when None), then one of its examples uniformly."""
    picks = []
    for _ in range(batch_size):
        if task_weights is None:
            t = rng.randrange(len(splits))
        else:
            t = rng.choices(range(len(splits)), task_weights)[0]
        picks.append((t, splits[t][rng.randrange(len(splits[t]))]))
    return picks


def warm_start_lr_factor(step: int, decay_steps: int, warmup_steps: int = 20) -> float:
    """The SFT learning rate at ``step`` as a fraction of its peak: linear warmup over
    ``warmup_steps``, times a linear decay that reaches 0 at ``decay_steps`` (floored at 5%)."""
    return min(1.0, (step + 1) / warmup_steps) * max(0.05, 1 - step / decay_steps)


def sft(policy, tasks: Sequence[Task], steps: int, batch_size: int = 32, lr: float = 1e-3,
        seed: int = 0, log_every: int = 50, progress: bool = True, thought_dropout: float = 0.0,
        task_weights: Sequence[float] | None = None, decay_steps: int | None = None) -> list[float]:
    """Teacher-forced cross-entropy on reference completions of a mixture of tasks.

    Each example's task is drawn with probability proportional to ``task_weights`` (uniform when
    None).

    The learning rate warms up over 20 steps, then falls linearly towards zero over
    ``decay_steps`` (default and minimum ``steps``; floored at 5% of the peak). ``decay_steps``
    > ``steps`` stops the warm start before the rate has annealed: the tiny default does this so that RL, not
    the last SFT steps, does the sharpening.

    ``thought_dropout``: the fraction of references trained without their ``<think>`` block
    ("Think or Not? Selective Reasoning via Reinforcement Learning for Vision-Language Models":
    thought dropout in the SFT stage), so the model learns both answer styles.
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    splits = [sft_split(t, "train") for t in tasks]
    opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    decay = max(decay_steps or steps, steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warm_start_lr_factor(s, decay))
    losses = []
    policy.model.train()
    from rich.progress import Progress

    with Progress(disable=not progress) as bar:
        task_id = bar.add_task("SFT warm start", total=steps)
        for step in range(steps):
            picks = draw_examples(rng, splits, batch_size, task_weights)
            drop = [thought_dropout > 0 and rng.random() < thought_dropout for _ in picks]
            batch = sft_batch(policy, tasks, picks, drop)
            logps = policy.completion_logps(policy.model, batch)
            loss = -(logps.sum() / batch.action_mask.sum())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(task_id, advance=1, description=f"SFT warm start loss {loss.item():.3f}")
            if log_every and (step + 1) % log_every == 0 and not progress:
                print(f"sft step {step + 1}/{steps} loss {sum(losses[-log_every:]) / log_every:.4f}")
    return losses


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
# the README's "The tiny default".
TINY_VLM_RECIPE = {"vision_steps": 300, "sft_steps": 600, "decay_steps": 800, "batch_size": 32,
                   "lr": 1e-3, "thought_dropout": 0.0}


def mixture_weights(task_specs: Sequence[dict]) -> list[float] | None:
    """The specs' optional ``weight`` entries (default 1), or None when no spec sets one (a
    uniform draw, the same random calls as before weights existed)."""
    if not any("weight" in spec for spec in task_specs):
        return None
    return [float(spec.get("weight", 1.0)) for spec in task_specs]


def build_tiny_vlm(out: str | Path, sft_steps: int = TINY_VLM_RECIPE["sft_steps"],
                   batch_size: int = TINY_VLM_RECIPE["batch_size"], lr: float = TINY_VLM_RECIPE["lr"],
                   thought_dropout: float = TINY_VLM_RECIPE["thought_dropout"], seed: int = 0,
                   progress: bool = True, task_specs: Sequence[dict] = DEFAULT_TINY_TASKS,
                   vision_steps: int = TINY_VLM_RECIPE["vision_steps"],
                   decay_steps: int | None = TINY_VLM_RECIPE["decay_steps"]) -> Path:
    """Build the tiny Qwen2.5-VL from scratch and warm-start it; returns the checkpoint dir.

    The defaults (:data:`TINY_VLM_RECIPE`) were found by measurement so that RL has competence to
    sharpen (README, "The tiny default"):
    - ``vision_steps`` first pre-trains the whole vision tower to name each cell's colour and
      shape (:mod:`mmrl.vlm.vision_pretrain`), then freezes it. SFT then learns colour-specific
      counting, which it did not with a random tower; and the tower is never trained at the SFT
      learning rate, which collapsed its features to one vector per image. With
      ``vision_steps=0`` the patch embedding and blocks keep their random initialisation and only
      the merger and the language model train.
    - ``thought_dropout`` 0: every reference keeps its ``<think>`` block, so the warm-started model
      already writes the answer layout and RL's reward moves with task accuracy, not format.
      (> 0 trains that fraction without the block, "Think or Not?"'s thought dropout.)
    - ``sft_steps`` < ``decay_steps``: SFT stops with the learning rate at a quarter of its peak,
      greedy counting accuracy ~0.55 while pass@8 is ~0.94; finishing the schedule alone would
      take it to ~0.85.

    A spec may carry a ``"weight"``: its share of the SFT batches (:func:`mixture_weights`).
    """
    from ..config import load_config
    from ..registry import TASKS, load_plugins
    from .policy import VLMPolicy, vision_tower
    from .vision_pretrain import pretrain_vision

    load_plugins()
    tasks = [TASKS.get(spec["name"])(**spec["options"]) for spec in task_specs]
    out = Path(out)
    torch.manual_seed(seed)
    tokenizer = tiny.build_tokenizer(tokenizer_corpus(tasks), vocab_size=1024)
    processor = tiny.build_processor(tokenizer)
    model = tiny.build_model(tokenizer, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        tiny.save_tiny(model, processor, tmp)
        cfg = load_config(None, [f"model.path={tmp}", "train.device=cpu"])
        policy = VLMPolicy(cfg)
        tower = vision_tower(policy.model)
        if vision_steps > 0:
            pretrain_vision(policy.model, policy.processor.image_processor, steps=vision_steps, seed=seed)
            tower.requires_grad_(False)
        else:
            tower.patch_embed.requires_grad_(False)
            tower.blocks.requires_grad_(False)
        sft(policy, tasks, steps=sft_steps, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
            thought_dropout=thought_dropout, task_weights=mixture_weights(task_specs),
            decay_steps=decay_steps)
        policy.model.requires_grad_(True)
        return save_atomically(policy, out)


def save_atomically(policy, out: Path) -> Path:
    """Write ``policy``'s model and processor to ``out`` through a staging directory, so a build
    that dies leaves the previous checkpoint whole."""
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    tiny.save_tiny(policy.model, policy.processor, staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


# The tiny video default (`mmrl build-tiny video`): the shipped tiny VLM (its tower pre-trained on
# the scene cells and frozen) warm-started on the synthetic clips of both video tasks.
TINY_VIDEO_RECIPE = {"sft_steps": 100, "decay_steps": 500, "batch_size": 32, "lr": 1e-3}
TINY_VIDEO_PIXELS = 112 * 112  # the synthetic frames as they are (vlm.video_*_pixels of the recipes)


def build_tiny_video(out: str | Path, base: str = "tiny", sft_steps: int = TINY_VIDEO_RECIPE["sft_steps"],
                     decay_steps: int | None = TINY_VIDEO_RECIPE["decay_steps"],
                     batch_size: int = TINY_VIDEO_RECIPE["batch_size"], lr: float = TINY_VIDEO_RECIPE["lr"],
                     seed: int = 0, progress: bool = True,
                     task_specs: Sequence[dict] = DEFAULT_TINY_VIDEO_TASKS) -> Path:
    """Warm-start ``base`` (default: the shipped tiny VLM) on the video tasks' reference answers
    with its vision tower frozen; returns the checkpoint dir. See the README's "Video"."""
    return warm_start_tiny(out, [f"vlm.video_min_pixels={TINY_VIDEO_PIXELS}", f"vlm.video_max_pixels={TINY_VIDEO_PIXELS}"],
                           task_specs, base=base, sft_steps=sft_steps, decay_steps=decay_steps,
                           batch_size=batch_size, lr=lr, seed=seed, progress=progress)


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
    then warm-start it on the GUI tasks with the tower frozen; returns the checkpoint dir. See the
    README's "GUI agents"."""
    from ..envs import make_env
    from .vision_pretrain import pretrain_vision_on_screens

    def screens(policy) -> None:
        if vision_steps > 0:
            pretrain_vision_on_screens(policy.model, policy.processor.image_processor, make_env("synthetic_gui"),
                                       steps=vision_steps, seed=seed)

    return warm_start_tiny(out, TINY_GUI_BUDGET,
                           task_specs, base=base, sft_steps=sft_steps, decay_steps=decay_steps,
                           batch_size=batch_size, lr=lr, seed=seed, progress=progress, before_sft=screens)


# The tiny grounding default (`mmrl build-tiny gui-grounding`): the tiny GUI default taught more
# clicks on named elements. One warm start cannot leave RL room on both GUI recipes: an episode's
# first step is a click on an app's icon, so a warm start that grounds well (point accuracy about
# 0.4, where supervised grounding learns fastest) already solves about 0.4 of the episodes, and
# one that leaves episodes to RL (0.01) grounds at 0.15, where grounding barely moves in a 10-minute
# run (README, "The tiny GUI default").
TINY_GUI_GROUNDING_RECIPE = {"sft_steps": 240, "decay_steps": 480, "batch_size": 32, "lr": 1e-3}


def build_tiny_gui_grounding(out: str | Path, base: str = "tiny-gui",
                             sft_steps: int = TINY_GUI_GROUNDING_RECIPE["sft_steps"],
                             decay_steps: int | None = TINY_GUI_GROUNDING_RECIPE["decay_steps"],
                             batch_size: int = TINY_GUI_GROUNDING_RECIPE["batch_size"],
                             lr: float = TINY_GUI_GROUNDING_RECIPE["lr"], seed: int = 0, progress: bool = True) -> Path:
    """SFT of ``base`` (default: the tiny GUI default) on screen grounding alone, tower frozen;
    returns the checkpoint dir."""
    return warm_start_tiny(out, TINY_GUI_BUDGET,
                           ({"name": "screen_grounding", "options": {}, "weight": 1.0},), base=base,
                           sft_steps=sft_steps, decay_steps=decay_steps, batch_size=batch_size, lr=lr, seed=seed,
                           progress=progress)


def warm_start_tiny(out: str | Path, overrides: Sequence[str], task_specs: Sequence[dict], base: str = "tiny",
                    sft_steps: int = 100, decay_steps: int | None = None, batch_size: int = 32, lr: float = 1e-3,
                    seed: int = 0, progress: bool = True, before_sft: Callable | None = None) -> Path:
    """SFT of ``base`` (config ``overrides``: e.g. the pixel budget of the inputs) on the
    ``task_specs``' reference answers with the vision tower frozen, saved atomically to ``out``;
    ``before_sft(policy)`` runs first (e.g. pre-training the tower on new images)."""
    from ..config import load_config
    from ..registry import TASKS, load_plugins
    from .policy import VLMPolicy, vision_tower

    load_plugins()
    tasks = [TASKS.get(spec["name"])(**spec["options"]) for spec in task_specs]
    torch.manual_seed(seed)
    cfg = load_config(None, [f"model.path={base}", "train.device=cpu", *overrides])
    policy = VLMPolicy(cfg)
    if before_sft is not None:
        before_sft(policy)
    vision_tower(policy.model).requires_grad_(False)
    sft(policy, tasks, steps=sft_steps, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
        task_weights=mixture_weights(task_specs), decay_steps=decay_steps)
    policy.model.requires_grad_(True)
    return save_atomically(policy, Path(out))
