"""The agent loop: every multi-turn rollout (GUI episodes, tool use, a calculator) runs through it.

A trajectory is a conversation of turns between the policy and an :class:`Interaction` (one per
trajectory: an environment, a tool set, a calculator, a remote service). At each turn the
interaction says what the policy sees (:meth:`Interaction.ask`: the turn's example and prompt), the
policy writes one message, and the interaction answers it (:meth:`Interaction.answer`: a
:class:`Reply`, whose ``done`` ends the trajectory). :func:`run_agent_loop` drives a batch of
trajectories turn by turn: one ``policy.rollout(..., 1, mode)`` per turn for every trajectory still
running (so the HF engine and vLLM alike), then the interactions' answers of that turn run
concurrently in a thread pool (a slow environment holds no other), collected in order, so the
result does not depend on which finished first.

**Each turn is one row of the batch**, its prompt everything seen so far, its actions the tokens the
model wrote in that turn. What the interaction returns (an observation, a tool's image, a result) is
in the next turn's prompt and in no row's action mask: context, never in the loss or the KL. Rows
are ordered by turn, then trajectory; group ``i`` holds the rows of trajectories ``i * n`` to
``i * n + n - 1``. Each row's example carries the episode keys of :mod:`mmrl.core.episodes`
(``episode_id``, ``step_index``, ``anchor_key``: by default a key of its own, GiGPO's anchors
never matching) and what the reply adds (:attr:`Reply.row`); once the trajectory is over, every
one of its rows also carries the interaction's outcome record (:meth:`Interaction.outcome`).

The loop's settings (:class:`LoopOptions`): the turn limit, stop texts (a message's generation ends
where it writes one), a time limit per answer (an answer still running then is abandoned:
:meth:`Interaction.timed_out` replies for it), and Mini-o3's over-turn masking ("Mini-o3: Scaling
Up Reasoning Patterns and Interaction Turns for Visual Search"): a trajectory that a budget or the
turn limit cut before it was done keeps its reward in its group's statistics, but its rows get an
all-zero action mask, so running out of turns sends no negative signal.

A policy declaring ``turn_cache`` keeps, while the loop runs, what each turn computed for the next
(the VLM's keys/values of the conversation so far), so a turn reads only what is new.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .rollouts import Rollouts

__all__ = ["Interaction", "LoopOptions", "Reply", "run_agent_loop"]


@dataclass
class Reply:
    """An interaction's answer to one model message."""

    done: bool = False  # the trajectory is over: the model answered, the task ended or failed
    cut: bool = False  # a budget ended it before it was done (over-turn, like reaching the turn limit)
    row: dict = field(default_factory=dict)  # keys this turn's row carries (a step reward, the state acted from)


@dataclass(frozen=True)
class LoopOptions:
    """How :func:`run_agent_loop` runs a task's trajectories (the task's :meth:`loop_options`)."""

    max_turns: int  # model messages per trajectory at most
    stop: tuple[str, ...] = ()  # texts that end a message's generation besides the end of turn
    step_timeout: float = 0.0  # seconds one answer may take; 0: no limit
    mask_over_turn: bool = False  # Mini-o3's over-turn masking (module docstring)
    # threads answering one turn's messages (with a time limit: one per message); 0: the loop's own
    # thread answers them one by one (an environment bound to the thread that made it)
    workers: int = 16

    def __post_init__(self) -> None:
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"the agent loop's max_turns must be an int >= 1, got {self.max_turns!r}")
        if self.step_timeout < 0:
            raise ValueError(f"the agent loop's step_timeout must be >= 0 seconds, got {self.step_timeout!r}")
        if self.workers < 0 or (self.workers == 0 and self.step_timeout):
            raise ValueError(f"the agent loop's workers must be >= 1 with a step_timeout, >= 0 without, "
                             f"got {self.workers!r}")


class Interaction:
    """The other side of one trajectory (module docstring); one instance per trajectory.

    :meth:`ask` and :meth:`outcome` are called in the loop's thread, :meth:`answer` in a worker
    thread. An answer abandoned at its time limit may still finish in its thread later: it must
    then leave what :meth:`timed_out` and :meth:`outcome` report unchanged."""

    def ask(self) -> tuple[dict, Any]:
        """The example and the prompt of the next turn (the policy's input for ``policy.rollout``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement ask()")

    def answer(self, batch: Rollouts, row: int) -> Reply:
        """The reply to the message of row ``row`` of ``batch`` (``batch.completions[row]``; its
        example and the policy's payload are there too); the next :meth:`ask` shows what it led to."""
        raise NotImplementedError(f"{type(self).__name__} must implement answer(batch, row)")

    def timed_out(self, seconds: float) -> Reply:
        """The reply for an answer that ran past ``seconds`` (``LoopOptions.step_timeout``)."""
        raise NotImplementedError(f"{type(self).__name__} has no reply for an answer past its time limit "
                                  "(implement timed_out, or leave the task's step_timeout at 0)")

    def outcome(self, turns: int, over_turn: bool) -> dict:
        """The keys every row of the trajectory carries once it is over, after ``turns`` messages
        (``over_turn``: a budget or the turn limit ended it before it was done); none by default."""
        return {}


def run_agent_loop(policy, interactions: Sequence[Interaction], n: int, options: LoopOptions, mode: str,
                   need_old_logps: bool = False, need_ref_logps: bool = False) -> Rollouts:
    """The rows of the trajectories of ``interactions`` (module docstring), ``n`` consecutive ones
    per group; ``mode`` and the log-prob flags are ``policy.rollout``'s."""
    # a policy that keeps a trajectory's keys/values for its next turn does so for this batch only
    with policy.turn_cache() if "turn_cache" in policy.capabilities else contextlib.nullcontext():
        parts, rows_of, outcomes = _turns(policy, interactions, n, options, mode, need_old_logps, need_ref_logps)
    for e, (record, over_turn) in outcomes.items():
        for part, row in rows_of[e]:
            parts[part].examples[row] = {**parts[part].examples[row], **record}
            if options.mask_over_turn and over_turn:
                parts[part].action_mask[row] = 0.0
    return Rollouts.concat(parts, renumber_groups=False)


def _turns(policy, interactions: Sequence[Interaction], n: int, options: LoopOptions, mode: str,
           need_old_logps: bool, need_ref_logps: bool):
    """The turns of :func:`run_agent_loop`: each turn's batch, where each trajectory's rows are
    (batch, row), and each finished trajectory's outcome record and whether it went over turn."""
    stop = {"stop": tuple(options.stop)} if options.stop else {}
    running = list(range(len(interactions)))
    parts: list[Rollouts] = []
    rows_of: dict[int, list[tuple[int, int]]] = {e: [] for e in running}
    outcomes: dict[int, tuple[dict, bool]] = {}
    for t in range(options.max_turns):
        if not running:
            break
        asked = [interactions[e].ask() for e in running]
        batch = policy.rollout([ex for ex, _ in asked], [prompt for _, prompt in asked], 1, mode,
                               need_old_logps=need_old_logps, need_ref_logps=need_ref_logps, **stop)
        replies = _answer_all([interactions[e] for e in running], batch, options)
        still = []
        for row, (e, reply) in enumerate(zip(running, replies)):
            batch.examples[row] = {**batch.examples[row], "episode_id": e, "step_index": t,
                                   "anchor_key": f"{e}:{t}", **reply.row}
            rows_of[e].append((len(parts), row))
            over_turn = not reply.done and (reply.cut or t == options.max_turns - 1)
            if reply.done or over_turn:
                outcomes[e] = (interactions[e].outcome(t + 1, over_turn), over_turn)
            else:
                still.append(e)
        batch.group_ids = torch.tensor([e // n for e in running], dtype=torch.long)
        parts.append(batch)
        running = still
    return parts, rows_of, outcomes


def _answer_all(interactions: Sequence[Interaction], batch: Rollouts, options: LoopOptions) -> list[Reply]:
    """Each interaction's reply to its row of ``batch``, answered concurrently, in order. With a
    time limit every answer gets its own thread, so all start at once and share one deadline; an
    answer still running then is abandoned (Python cannot stop a thread: it finishes on its own)."""
    timeout = float(options.step_timeout)
    if options.workers == 0:
        return [it.answer(batch, row) for row, it in enumerate(interactions)]
    workers = len(interactions) if timeout else max(1, min(options.workers, len(interactions)))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mmrl-agent-loop")
    try:
        futures = [pool.submit(it.answer, batch, row) for row, it in enumerate(interactions)]
        deadline = time.monotonic() + timeout
        replies = []
        for it, future in zip(interactions, futures):
            try:
                replies.append(future.result(timeout=max(0.0, deadline - time.monotonic())) if timeout
                               else future.result())
            except concurrent.futures.TimeoutError:
                replies.append(it.timed_out(timeout))
        return replies
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
