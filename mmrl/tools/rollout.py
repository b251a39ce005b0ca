"""Multi-turn rollouts that call tools: the model writes, its calls run, their images come back.

"Thinking with images" (DeepEyes: "DeepEyes: Incentivizing 'Thinking with Images' via
Reinforcement Learning"; Mini-o3: "Mini-o3: Scaling Up Reasoning Patterns and Interaction Turns
for Visual Search"). :func:`run_trajectories` rolls out ``n`` trajectories of each example, all of
them batched: at every turn the policy writes one assistant message for each trajectory still
running (one ``policy.rollout`` call, so the HF engine and vLLM alike), the calls in it run
(:func:`mmrl.tools.calls.run_turn`), and their observations (tool images, error text) come back as
the next user turn inside ``<tool_response>``. With the task's ``stop_at_call`` (the default) a
message's generation stops where it closes its call (``</tool_call>``: transformers'
``stop_strings``, vLLM's ``stop``), so the model never writes past its call; the chat template closes
the message in the next turn's prompt, as context. A trajectory ends with a message that calls no
tool (its answer), or when its budget is spent (:class:`~mmrl.tools.base.ToolBudget`).

**Each turn is one row of the batch**, its prompt the whole conversation so far (every image the
tools returned included), its actions the tokens the model wrote in that turn. Why rows and not one
interleaved sequence with a mask: the tool outputs are then context by construction. They are in
no row's action mask, so their tokens are in neither the loss nor the KL; a row's log-probs are
those of the model's tokens given everything before them, exactly the masked positions of the
interleaved sequence that verl / DeepEyes train on. So with ``algo.loss_agg_mode=token_mean`` the
loss over a trajectory's rows equals the masked loss over its interleaved sequence (a test checks
it token by token), and re-scoring a row reproduces the sampled log-probs as for any completion.
The sequence-mean modes average per turn instead of per trajectory. The price is compute: each
turn reads the conversation again (no KV cache is kept across turns).

Each row's example carries the episode keys of :mod:`mmrl.core.episodes` (``episode_id``,
``step_index``, ``anchor_key``) and, once its trajectory is over, the trajectory record of
:mod:`mmrl.measures.tool_use` (``trajectory``: the whole text; ``tool_calls``; ``tool_budget``)
plus ``turns`` and ``over_turn``. Every row of a trajectory therefore scores the trajectory's
reward; ``episode_grpo`` with ``episode_return: final`` makes that one outcome per trajectory
(trajectory-level GRPO).

**Over-turn masking** (Mini-o3): a trajectory that the turn or token budget cut before it answered
(its last message still called a tool) is ``over_turn``. With the task's ``over_turn_masking``
its rows keep their reward in the group's statistics but get an all-zero action mask, so they add
nothing to the loss: no negative signal for running out of turns.
"""

from __future__ import annotations

from typing import Sequence

import torch

from mmrl.core.rollouts import Rollouts

from .base import ToolState
from .calls import run_turn

__all__ = ["observation_message", "observation_text", "run_trajectories"]

RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def observation_message(observations) -> dict:
    """The user turn that returns a turn's observations: ``<tool_response>``, each image and
    text in order, ``</tool_response>`` (DeepEyes' layout, which every chat template renders)."""
    content: list[dict] = [{"type": "text", "text": RESPONSE_OPEN}]
    for obs in observations:
        if obs.image is not None:
            content.append({"type": "image", "image": obs.image})
        if obs.text:
            content.append({"type": "text", "text": obs.text})
    content.append({"type": "text", "text": RESPONSE_CLOSE})
    return {"role": "user", "content": content}


def observation_text(observations) -> str:
    """The observations as they appear in a trajectory's text: an image as ``<image>``."""
    parts = [("<image>" if obs.image is not None else "") + (obs.text or "") for obs in observations]
    return RESPONSE_OPEN + "".join(parts) + RESPONSE_CLOSE


def conversation(task, ex: dict, turns: Sequence[tuple[str, list]]) -> list[dict]:
    """The chat messages of a trajectory's next turn (:meth:`ToolUseTask.build_prompt` with the
    earlier ``turns``: ``(text, observations)`` pairs)."""
    return task.build_prompt({**ex, "tool_turns": list(turns)})


def trajectory_text(turns: Sequence[tuple[str, list]], last: str) -> str:
    """The whole trajectory as one text (the record's ``trajectory``)."""
    return "".join(text + observation_text(obs) for text, obs in turns) + last


def _conversation_tokens(batch: Rollouts, row: int) -> int | None:
    """Tokens of a row's conversation so far (prompt + this turn), when the policy reports ids."""
    prompts, comps = batch.payload.get("prompt_ids"), batch.payload.get("completion_ids")
    if prompts is None or comps is None:
        return None
    return int(len(prompts[row]) + len(comps[row]))


def run_trajectories(policy, task, examples: Sequence[dict], n: int, mode: str, need_old_logps: bool = False,
                     need_ref_logps: bool = False) -> Rollouts:
    """``n`` trajectories of each of ``examples`` for ``task`` (a
    :class:`~mmrl.tools.task.ToolUseTask`), every turn a row (module docstring); group i holds the
    rows of ``examples[i]``'s trajectories, ordered by turn, then trajectory."""
    group_of = [g for g in range(len(examples)) for _ in range(n)]
    base = policy.prepare_examples([examples[g] for g in group_of])
    tools = task.make_tools()
    states = [ToolState(images=[ex["image"]] if ex.get("image") is not None else [], example=ex) for ex in base]
    budgets = [task.make_budget() for _ in base]
    turns: list[list[tuple[str, list]]] = [[] for _ in base]
    records: list[list[dict]] = [[] for _ in base]
    ended: dict[int, dict] = {}
    rows_of: dict[int, list[tuple[int, int]]] = {e: [] for e in range(len(base))}
    parts: list[Rollouts] = []
    running = list(range(len(base)))
    stop = {"stop": task.stop_texts} if task.stop_texts else {}  # a turn ends at its call (stop_at_call)
    for t in range(task.max_generations):
        if not running:
            break
        step_examples = [base[e] for e in running]
        prompts = [conversation(task, base[e], turns[e]) for e in running]
        batch = policy.rollout(step_examples, prompts, 1, mode, need_old_logps=need_old_logps,
                               need_ref_logps=need_ref_logps, **stop)
        still = []
        for row, e in enumerate(running):
            text = batch.completions[row]
            tokens = _conversation_tokens(batch, row)
            if tokens is not None:
                budgets[e].charge_tokens(tokens - budgets[e].tokens)
            spent = budgets[e].exhausted  # no tool turn left: a call now is refused, and ends it
            observations, recs = run_turn(text, tools, states[e], budgets[e], task.max_calls_per_turn)
            records[e].extend(recs)
            batch.examples[row] = {**batch.examples[row], "episode_id": e, "step_index": t,
                                   "anchor_key": f"{e}:{t}"}
            rows_of[e].append((len(parts), row))
            cut = bool(recs) and (spent or t == task.max_generations - 1)
            if not recs or cut:
                ended[e] = {"trajectory": trajectory_text(turns[e], text), "over_turn": cut, "turns": t + 1}
            else:
                turns[e].append((text, observations))
                still.append(e)
        batch.group_ids = torch.tensor([group_of[e] for e in running], dtype=torch.long)
        parts.append(batch)
        running = still
    for e in running:  # only when max_generations is 0: nothing was generated
        ended[e] = {"trajectory": "", "over_turn": True, "turns": 0}
    mask_over_turn = task.bool_option("over_turn_masking")
    for e, outcome in ended.items():
        record = {**outcome, "tool_calls": records[e], "tool_budget": budgets[e].summary()}
        for part, row in rows_of[e]:
            parts[part].examples[row] = {**parts[part].examples[row], **record}
            if mask_over_turn and outcome["over_turn"]:
                parts[part].action_mask[row] = 0.0
    return Rollouts.concat(parts, renumber_groups=False)
