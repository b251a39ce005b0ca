"""The batch ``mmrl sft`` trains on (:mod:`mmrl.vlm.sft_run`): a task's prompts as context and its
reference completions as the actions, and where those completions come from.

R1-style recipes run SFT before RL so that RL starts from a policy that already follows the answer
format and is sometimes right (GRPO learns nothing from groups whose rewards are all zero). The
shipped tiny models are warm-started this way (:mod:`mmrl.vlm.tiny_builders`).
"""

from __future__ import annotations

import re
from typing import Sequence

import torch

from ..core.rollouts import Rollouts
from ..task import Task
from .processing import split_patches


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
