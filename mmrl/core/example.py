"""The keys of an example dict that pass between layers: one declared record.

An example is a plain dict (a task's data: its question, answer, boxes, ... are the task's own
business, read by its prompt and its rewards). A few keys are a contract between layers instead:
the trainer numbers examples, a mixture labels their source, the agent loop and the interactions it
drives write the episode keys and outcomes, and the estimators, metrics, rewards and viewers read
them. Those keys are declared here, each with what it means and who writes it.

``tests/test_example_keys.py`` holds the rule: every string-literal read of an example dict
(``ex["k"]``, ``ex.get("k")``, ``"k" in ex``, ``examples[i]["k"]``) in the core and in the
interactions the agent loop drives (``mmrl/*/interaction.py``) names a key of :class:`Example`.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["Example", "SHARED_KEYS"]


class Example(TypedDict, total=False):
    """An example's keys that mmrl's layers share (any other key is its task's own)."""

    _index: int
    """The example's position in its split, set by the trainer when it draws a step's examples and
    by the evaluation: SPO's per-prompt tracker keys on it, the metrics and the episode key
    (:func:`mmrl.core.episodes.episode_key`) use it, and it crosses ranks."""

    source: str
    """The data source of an example of a mixture task (``tasks/mixture.py`` sets it): rewards are
    computed per source (:class:`~mmrl.core.reward_computer.PerSourceRewards`) and Stratified GRPO's
    strata are sources; it crosses ranks."""

    # -- written by the agent loop on every row of a multi-turn trajectory (mmrl/core/agent_loop.py)
    episode_id: int
    """The trajectory the row belongs to, unique in one process's batch (with ``_index``, unique in
    the gathered batch); episode estimators group rows by it."""

    step_index: int
    """The row's turn in its trajectory: 0, 1, ..."""

    anchor_key: str
    """The state the row acted from (GiGPO's anchor states); by default a key of its own row, an
    environment's reply gives the state's key so that equal states match."""

    # -- an environment episode's rows (mmrl/envs/interaction.py: EnvEpisode's replies and outcome)
    step_reward: float
    """The reward the environment returned for the row's step (the ``env_reward`` reward)."""

    step_valid: bool
    """Whether the row's action was valid in the environment."""

    step_message: str
    """What the environment said of the step (an invalid action's reason; the episode viewer)."""

    episode_success: bool
    """Whether the episode accomplished its task; on every row once the episode is over."""

    episode_return: float
    """The sum of the episode's step rewards; on every row once the episode is over."""

    episode_length: int
    """The episode's number of steps; on every row once the episode is over."""

    episode_timed_out: bool
    """Whether a step (an environment's, or a tool call's) ran past ``task.options.step_timeout``
    and ended the episode."""

    task: Any
    """An environment task's spec (what ``Env.reset`` takes): an ``EnvTask`` example carries it,
    and the episode's interaction resets its environment with it."""

    # -- a tool-use trajectory's rows (mmrl/tools/interaction.py: ToolConversation)
    image: Any
    """The example's image (a VLM task's), the first image the tools of a tool-use trajectory act on;
    the core itself never reads it (the policy prepares the media)."""

    tool_turns: list
    """The conversation so far of a tool-use trajectory (its messages and tool observations), from
    which the task builds the next turn's prompt."""

    trajectory: str
    """The whole text the model wrote over the trajectory (the tool rewards score it); on every row
    once the trajectory is over, as the next four."""

    turns: int
    """The number of model messages in the trajectory."""

    over_turn: bool
    """Whether a budget or the turn limit cut the trajectory before it was done."""

    tool_calls: list
    """One record per tool call of the trajectory, in order (``mmrl.tools.calls.RECORD_KEYS``)."""

    tool_budget: dict
    """What the trajectory spent of its tool budget (turns, pixels, tokens)."""


SHARED_KEYS: frozenset[str] = frozenset(Example.__annotations__)  # every declared key
