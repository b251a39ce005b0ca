"""The task plugin API: where examples come from, how they are prompted, how they are scored.

A task is written exactly like the built-in ones in ``tasks/``::

    from mmrl import Task, register_task

    @register_task("counting")
    class Counting(Task):
        modality = "vlm"
        rewards = {"format": 0.5, "accuracy": 1.0}   # reward names -> default weights
        def examples(self, split): ...               # a sequence of dicts
        def prompt(self, ex): ...                    # chat messages with images
        def reference_answer(self, ex): ...          # the answer of a reference completion (SFT warm start)
        def reasoning(self, ex): ...                 # the thought before it

A task with the ``thinking`` option (``default_options`` holds ``"thinking": True``) has two
layouts. True: ``<think>...</think><answer>...</answer>``. False: the answer block alone, the
No-Thinking layout of CLS-RL / No-Thinking-RL ("Think or Not Think: A Study of Explicit Thinking in
Rule-Based Visual Reinforcement Fine-Tuning"). The base class switches the prompt's instruction
(:meth:`Task.instruction`), the reference completion (:meth:`Task.target`) and the rewards
(:attr:`Task.answer_only_rewards`, else the format reward's ``answer_only`` mode) in one place.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .data.sequence import LazySequence

# Options of every task that reads files (has a ``train_path``): how the file's keys map to the
# task's (``{question: problem, answer: solution, image: images}``; see mmrl.data.fields), where
# relative image paths start (default: the data file's folder), and the image file of a record that
# names its image by a bare name or id (``"{}.jpg"`` for GQA's imageId; see FileExamples).
FILE_OPTIONS: dict[str, Any] = {"fields": None, "image_root": None, "image_template": None}

SYSTEM_FORMAT_HINT = (
    "Think briefly inside <think> </think>, then give the final answer inside <answer> </answer>."
)


class Task:
    """Base class of task plugins. Subclasses set ``rewards`` and implement the methods."""

    name: str = "task"  # set by @register_task
    modality: str = "vlm"
    rewards: dict[str, float] = {}
    # Extra keyword arguments passed to individual rewards, e.g. {"format": {"mode": "lenient"}}.
    reward_kwargs: dict[str, dict[str, Any]] = {}
    # The rewards with the ``thinking`` option False (e.g. {"equality": 1.0}: an exact answer and
    # nothing else); None: ``rewards`` still, the format reward (if used) in its ``answer_only`` mode.
    answer_only_rewards: dict[str, float] | None = None
    # The task metric a report leads with, and whose per-example value 1.0 counts as solved for
    # pass@k (``eval.pass_k``); None where no metric is a per-example success (e.g. detection AP).
    success_metric: str | None = "accuracy"

    def __init__(self, **options: Any):
        unknown = set(options) - set(self.option_names())
        if unknown:
            raise ValueError(
                f"task {self.name!r} has no option(s) {sorted(unknown)}; "
                f"valid options: {sorted(self.option_names())}"
            )
        self.options = {**self._defaults(), **options}
        if not self.thinking:  # instance attributes: the class defaults stay those of the thinking layout
            if self.answer_only_rewards is not None:
                self.rewards, self.reward_kwargs = dict(self.answer_only_rewards), {}
            elif "format" in self.rewards:
                self.reward_kwargs = {**self.reward_kwargs, "format": {"mode": "answer_only"}}

    # -- options --------------------------------------------------------------------------------
    def default_options(self) -> dict[str, Any]:
        """Task-specific options (``task.options.*`` in the config) and their defaults."""
        return {}

    def _defaults(self) -> dict[str, Any]:
        """``default_options()``, plus :data:`FILE_OPTIONS` for a task that reads files (one with
        a ``train_path`` option), so every file reader takes the same ``fields``/``image_root``."""
        defaults = self.default_options()
        return {**FILE_OPTIONS, **defaults} if "train_path" in defaults else defaults

    def option_names(self) -> list[str]:
        return list(self._defaults())

    def bool_option(self, name: str) -> bool:
        """``options[name]``, which must be a real bool: a string "false" from a hand-edited
        config is truthy and would silently keep the default behaviour (e.g. ``thinking``)."""
        value = self.options[name]
        if not isinstance(value, bool):
            raise ValueError(f"{self.name}: option {name} must be true or false, got {value!r}")
        return value

    @property
    def thinking(self) -> bool:
        """Whether completions reason before they answer: the ``thinking`` option (a real bool),
        True for a task without one."""
        return self.bool_option("thinking") if "thinking" in self.options else True

    # -- data -----------------------------------------------------------------------------------
    def examples(self, split: str) -> Sequence[dict]:
        """The examples of ``split`` ("train" or "eval"): a sequence supporting len and indexing."""
        raise NotImplementedError(f"task {self.name!r} must implement examples(split)")

    # -- data sources: one, the task itself, unless it mixes several (tasks/mixture.py) -----------
    def source_names(self) -> list[str]:
        """The data sources this task draws from, by name."""
        return [self.name]

    def source_sizes(self, examples: Sequence[dict]) -> dict[str, int]:
        """How many of ``examples`` (a split of this task) each source holds: what the prompt
        samplers balance over."""
        return {self.name: len(examples)}

    def reward_sources(self) -> dict[str, tuple[dict[str, float], dict[str, dict]]] | None:
        """Each source's ``(reward weights, reward kwargs)`` where sources are scored by rewards
        of their own (a mixture of tasks); None: one set for every example, the task's."""
        return None

    def read_examples(self, path, parse: Callable[[dict], Any], split: str = "train", **reader_kwargs: Any):
        """The examples of a data file or folder (JSONL, JSON, parquet, a ``datasets`` directory;
        see :class:`mmrl.data.records.FileExamples`), read with ``parse`` after the ``fields``
        option mapped the record's keys, images under the ``image_root`` option (named through the
        ``image_template`` option when set)."""
        from .data.records import FileExamples

        return FileExamples(path, parse, self.options.get("image_root"), fields=self.options.get("fields"),
                            split=split, image_template=self.options.get("image_template"), **reader_kwargs)

    def file_or_synthetic(self, split: str, seeds: dict[str, int], parse: Callable[[dict], Any],
                          **reader_kwargs: Any):
        """The usual ``examples(split)``: the data at ``options["<split>_path"]`` read with
        ``parse`` (:meth:`read_examples`; indexed once, then cached) when it is set, else
        ``SyntheticExamples(self.make, options["<split>_size"], seeds[split])``."""
        if split not in seeds:
            raise ValueError(f"{self.name}: unknown split {split!r}; valid splits: {sorted(seeds)}")
        path = self.options.get(f"{split}_path")
        if not path:
            return SyntheticExamples(self.make, self.options[f"{split}_size"], seeds[split])
        cache = self.__dict__.setdefault("_file_splits", {})
        if split not in cache:
            cache[split] = self.read_examples(path, parse, split, **reader_kwargs)
        return cache[split]

    # (with-reasoning, answer-only) instruction appended to ``ex["question"]`` by the default
    # ``prompt``; a task sets it, or overrides ``prompt`` for anything else.
    instructions: tuple[str, str] | None = None

    def instruction(self) -> str:
        """The one of ``instructions`` that the ``thinking`` option picks."""
        if self.instructions is None:
            raise NotImplementedError(f"task {self.name!r} must implement prompt(ex) or set instructions")
        thinking, answer_only = self.instructions
        return thinking if self.thinking else answer_only

    def prompt(self, ex: dict) -> list[dict]:
        """Chat messages for one example; images go in as ``{"type": "image", "image": PIL}``.

        Default: the image and ``"<question> <instruction>"``, the instruction chosen by the
        ``thinking`` option from ``instructions``."""
        return image_prompt(ex["image"], f"{ex['question']} {self.instruction()}")

    def target(self, ex: dict) -> str:
        """A reference completion for ``ex`` (used by the SFT warm start):
        ``<think>{reasoning(ex)}</think><answer>{reference_answer(ex)}</answer>``, or the answer
        block alone when the ``thinking`` option is off. A task with another layout overrides it."""
        answer = self.reference_answer(ex)
        if not self.thinking:
            return f"<answer>{answer}</answer>"
        return f"<think>{self.reasoning(ex)}</think><answer>{answer}</answer>"

    def reference_answer(self, ex: dict) -> str:
        """The text of the answer block of :meth:`target`."""
        raise NotImplementedError(f"task {self.name!r} has no reference completions")

    def reasoning(self, ex: dict) -> str:
        """The text of the think block of :meth:`target`, a short thought that leads to the answer."""
        raise NotImplementedError(f"task {self.name!r} has no reference reasoning")

    # Keys of an example that the usual readers read back from a data file (see file_record).
    RECORD_KEYS = ("question", "problem", "instruction", "answer", "solution", "box", "boxes", "labels", "label",
                   "text", "choices", "options", "sentence", "segment", "problem_type", "prompt")

    def file_record(self, ex: dict, media: str) -> dict:
        """``ex`` as one record of the task's data files, its image or clip at path ``media``:
        what the task's reader reads back as ``ex`` (the demo starts an upload's record from it).
        Default: the example's :attr:`RECORD_KEYS` with ``image`` (or ``video``) = ``media``;
        a task whose files have another layout overrides it."""
        from .runs.logging import to_jsonable

        media_key = "video" if "video" in ex and "image" not in ex else "image"
        return {**{k: to_jsonable(ex[k]) for k in self.RECORD_KEYS if k in ex}, media_key: media}

    def hints(self, ex: dict) -> list[str]:
        """Tiered hints for ``ex``, least to most revealing (Scaf-GRPO's knowledge -> planning ->
        solution tiers); [] when the task has none. Used by ``algo.scaffold`` and by the
        "easier" side of difficulty-aware augmentation."""
        return []

    def augment(self, ex: dict, direction: str, rng, noise_std: float = 0.15) -> dict | None:
        """A harder or easier variant of ``ex`` for difficulty-aware augmentation (DeepVideo-R1),
        or None when there is none. Default: "harder" adds Gaussian pixel noise (std
        ``noise_std`` of the 0..255 range) to ``ex["image"]``, or to every frame of a clip in
        ``ex["video"]``; "easier" attaches the first hint. ``rng`` is a seeded
        ``numpy.random.Generator``. Override for other inputs (text)."""
        if direction == "harder":
            clip = ex.get("video")
            if getattr(clip, "frames", None) is not None:
                import dataclasses

                import torch

                noise = torch.from_numpy(rng.normal(0.0, noise_std * 255.0, size=tuple(clip.frames.shape)))
                frames = (clip.frames.double() + noise).clamp(0, 255).round().to(torch.uint8)
                return {**ex, "video": dataclasses.replace(clip, frames=frames)}
            image = ex.get("image")
            if image is None or not hasattr(image, "convert"):
                return None
            import numpy as np
            from PIL import Image

            from .media.pixels import to_rgb

            pixels = np.asarray(to_rgb(image), dtype=np.float32)
            noisy = pixels + rng.normal(0.0, noise_std * 255.0, size=pixels.shape)
            return {**ex, "image": Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))}
        if direction == "easier":
            hints = self.hints(ex)
            return {**ex, "hint": hints[0]} if hints else None
        raise ValueError(f"augment: direction must be 'harder' or 'easier', got {direction!r}")

    def record(self, ex: dict, completion: Any) -> dict[str, Any]:
        """What a saved rollout shows of ``ex`` besides the completion and its rewards: the input
        image, a visualisation (:meth:`visualize`), the prompt text and the reference answer."""
        return {
            "image": ex.get("image"),
            "visualization": self.visualize(ex, completion),
            "prompt": ex.get("question", ex.get("prompt", "")),
            "answer": str(ex.get("answer", "")),
        }

    def build_prompt(self, ex: dict) -> list[dict]:
        """``prompt(ex)`` with the example's scaffolding hint (``ex["hint"]``) appended, if any."""
        messages = self.prompt(ex)
        hint = ex.get("hint") if isinstance(ex, dict) else None
        return with_hint(messages, hint) if hint else messages

    # -- evaluation -----------------------------------------------------------------------------
    def metrics(self, completions: Sequence[str], examples: Sequence[dict]) -> dict[str, float]:
        """Task metrics on a batch (e.g. accuracy); defaults to none beyond the rewards."""
        return {}

    def success(self, completion: Any, ex: dict) -> bool | None:
        """Whether ``completion`` solves ``ex`` by :attr:`success_metric` (its value on this one
        example is 1); None where the task has no such metric."""
        if self.success_metric is None:
            return None
        value = self.metrics([completion], [ex]).get(self.success_metric)
        return None if value is None else float(value) >= 1.0

    def visualize(self, ex: dict, completion: str):
        """An image to save with a logged rollout (e.g. with boxes drawn); None for none."""
        return None


def make_task(name: str, **options: Any) -> Task:
    """The registered task ``name`` built with ``options`` (its ``task.options``), e.g.
    ``make_task("counting", query="color")``: how a plugin builds another task (a mixture of
    tasks, a wrapper) without reaching into the registry. An unknown name raises
    :class:`mmrl.UnknownNameError` naming the closest registered ones."""
    from .registry import TASKS

    return TASKS.get(name)(**options)


class SyntheticExamples(LazySequence):
    """A lazily generated, deterministic sequence of examples: item i is ``make(seed, i)``.

    Train and eval splits use disjoint seeds so held-out examples are never trained on.
    """

    def __init__(self, make: Callable[[int], dict], size: int, seed: int):
        self._make = make
        self._size = size
        self._seed = seed

    def __len__(self) -> int:
        return self._size

    def item(self, i: int) -> dict:
        return self._make(self._seed * 1_000_003 + i)


def is_held_out(prompt: str, every: int = 5) -> bool:
    """True for the prompts a synthetic task reserves for evaluation: a fixed ``1 / every`` of the
    prompt strings by a stable hash (CRC-32, the same on every run and machine), so the held-out
    score measures prompts RL never trained on."""
    return zlib.crc32(prompt.encode()) % every == 0


def held_out_prompt_examples(task: str, split: str, sample_spec: Callable[[Any], Any], spec_prompt: Callable[[Any], str],
                             sizes: dict[str, int], seeds: dict[str, int]) -> SyntheticExamples:
    """``{"spec", "prompt"}`` examples of a generator task's split: specs drawn by
    ``sample_spec(numpy rng)`` are rejection-sampled so the eval split only ever shows the held-out
    prompt strings (:func:`is_held_out`) and the train split only the others."""
    import numpy as np

    if split not in seeds:
        raise ValueError(f"{task}: unknown split {split!r}; valid splits: {sorted(seeds)}")
    held_out = split == "eval"

    def make(seed: int) -> dict:
        rng = np.random.default_rng(seed)
        while True:
            spec = sample_spec(rng)
            prompt = spec_prompt(spec)
            if is_held_out(prompt) == held_out:
                return {"spec": spec, "prompt": prompt}

    return SyntheticExamples(make, sizes[split], seeds[split])


@dataclass(frozen=True)
class GenerationPrompt:
    """A generator's prompt with an input image: the source image of an edit ("make the red circle
    blue") or the first frame of an image-to-video clip (a generator task's ``prompt(ex)``).
    ``str(prompt)`` is the text, so logs and text-only code read it as before; ``image`` is a PIL
    image (None: text only)."""

    text: str
    image: Any = None

    def __str__(self) -> str:
        return self.text


def image_prompt(image, text: str) -> list[dict]:
    """The common single-image user turn."""
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]


def video_prompt(video, text: str) -> list[dict]:
    """The common single-clip user turn (a :class:`mmrl.media.video.Clip`); an image where a
    video dataset's record is an image."""
    kind = "video" if getattr(video, "frames", None) is not None else "image"
    return [{"role": "user", "content": [{"type": kind, kind: video}, {"type": "text", "text": text}]}]


def with_hint(messages: list[dict], hint: str) -> list[dict]:
    """A copy of chat ``messages`` with ``hint`` appended to the last user turn's text (a new text
    item when that turn has none). The images and earlier turns are shared, not copied."""
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") != "user":
            continue
        content = out[i]["content"]
        if isinstance(content, str):
            out[i] = {**out[i], "content": f"{content} Hint: {hint}"}
            return out
        items = list(content)
        for j in range(len(items) - 1, -1, -1):
            if items[j].get("type") == "text":
                items[j] = {**items[j], "text": f"{items[j]['text']} Hint: {hint}"}
                break
        else:
            items.append({"type": "text", "text": f"Hint: {hint}"})
        out[i] = {**out[i], "content": items}
        return out
    raise ValueError("with_hint: the prompt has no user turn to add a hint to")
