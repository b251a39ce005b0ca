"""The interface the core calls on a policy: everything, and nothing more
(``tests/test_policy_protocol.py`` checks that mmrl/core calls no other attribute of a policy).

A VLM's actions are generated tokens; a diffusion model's are denoising steps. Either way the
policy samples groups, reports per-action log-probs, and takes optimizer steps on the core's loss.
:class:`~mmrl.core.policy.PolicyBase` implements everything here but sampling and the loss terms;
optional parts are declared in ``capabilities`` and checked once at setup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from .rollouts import Rollouts

# Optional capabilities a policy can declare (``Policy.capabilities``).
CAPABILITIES = {
    "scoring": "re-scores a batch's actions without gradient (score(batch, reference))",
    "teacher_forcing": "turns given completions into samples (rollout_given: off-policy guidance)",
    "coordinates": "answers in a coordinate space of its own (prepare_examples records it)",
    "image_inputs": "reads images in its prompts (data.perturbation applies: perturb)",
    "video_inputs": "reads video clips in its prompts (algo.temporal_grpo shuffles their frames: temporally_shuffled)",
    "multi_turn": "acts over several turns of an episode, one prompt per turn (environment tasks)",
    "turn_cache": "keeps what a trajectory's turns computed for the next turn while turn_cache() is open",
    "fused_loss": "computes the objective fused with its log-probs where configured (train.use_liger_loss)",
    "async_rollouts": "rolls out from an engine's own weights copy, concurrently with training (train.async_rollouts)",
}

# Members of the protocol that only a policy declaring the capability has.
OPTIONAL_MEMBERS = {"score": "scoring", "rollout_given": "teacher_forcing", "perturb": "image_inputs",
                    "temporally_shuffled": "video_inputs", "turn_cache": "turn_cache",
                    "publish_weights": "async_rollouts"}


class Policy(Protocol):
    """What the core calls on a policy."""

    capabilities: frozenset[str]
    # Config keys (or whole sections) that mean nothing for this policy: set to anything but their
    # default, the run stops at setup instead of silently ignoring them.
    unused_config: tuple[str, ...]
    # Why the last optimizer step was skipped (a non-finite gradient), or None.
    last_skip_cause: str | None

    @property
    def max_actions(self) -> int:
        """The most actions one sample can have (a VLM's ``max_completion_length``, a generator's
        denoising steps): Dr. GRPO's constant normaliser."""

    @property
    def micro_batch_size(self) -> int:
        """Samples per training forward now (``train.micro_batch_size`` under the out-of-memory cap)."""

    @property
    def distributed_backend(self) -> str:
        """The backend training runs on, for the run's banner ("MULTI_CPU", "FSDP2", ...)."""

    def begin_step(self, step: int) -> None:
        """Called before each RL step's rollouts (the learning rate of that step; policies that seed by step)."""

    def prepare_examples(self, examples: Sequence[dict]) -> list[dict]:
        """Copies of ``examples`` with what this policy's rewards need to read its answers."""

    def rollout(self, examples: Sequence[dict], prompts: Sequence[Any], n: int, mode: str,
                need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """``n`` samples per prompt (no grad); group i holds prompt i's samples. ``mode`` is
        ``"train"`` (the rollout settings), ``"eval"`` (the eval settings) or ``"sample"`` (held-out
        samples for pass@k: the policy's sampling distribution, leaving training state untouched).
        The agent loop (:mod:`mmrl.core.agent_loop`) also passes ``stop`` when a task sets stop
        texts: texts that end a sample where it writes them (the VLM policy takes it)."""

    def rollout_given(self, examples: Sequence[dict], prompts: Sequence[Any], completions: Sequence[str],
                      need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """Capability ``teacher_forcing``: the given completions as samples of these prompts."""

    def score(self, batch: Rollouts, reference: bool) -> torch.Tensor:
        """Capability ``scoring``: per-action log-probs of ``batch`` under the policy (or the reference)."""

    def perturb(self, ex: dict, kind: str, rng: np.random.Generator, other: dict | None,
                options: dict | None) -> dict:
        """Capability ``image_inputs``: ``ex`` with the registered image perturbation ``kind`` of
        "Vision Matters" applied to the inputs this policy reads (``data.perturbation``); ``other``
        is another training example (the distractor / mixup partner)."""

    def temporally_shuffled(self, ex: dict, rng: np.random.Generator) -> dict | None:
        """Capability ``video_inputs``: T-GRPO's twin of ``ex``, its clip's frames in a shuffled
        order (never the original), or None when ``ex`` holds no clip of two frames or more."""

    def turn_cache(self) -> AbstractContextManager:
        """Capability ``turn_cache``: while the returned context is open, a rollout whose prompt
        continues a sequence the previous rollout processed (the agent loop's next turn) computes
        only what is new; the same samples and log-probs, to float rounding. Closed, what was kept
        is freed (the agent loop holds it for one batch of trajectories, whose weights are fixed)."""

    def take_rollout_stats(self) -> dict[str, float]:
        """Counters of the rollouts since the last call, logged with the step's metrics (samples cut
        by ``rollout.max_time``, a rollout server's retries and errors)."""

    def publish_weights(self) -> None:
        """Capability ``async_rollouts``: hand the current weights to the rollout engine now (the
        training thread calls it between steps; rollouts generated afterwards use them)."""

    def configure_optimizer(self, train_cfg: Any, total_steps: int) -> None:
        """The optimizer and schedule over ``total_steps`` RL steps, prepared for this launch."""

    def train_step(self, batch: Rollouts, objective: Callable[..., tuple[torch.Tensor, dict]],
                   num_tokens: float, num_seqs: float) -> dict[str, float]:
        """One optimizer step over a mini-batch; ``objective`` is the core's loss."""

    def reset_reference(self) -> None:
        """ProRL's reset: the reference becomes the current policy, optimizer state is cleared."""

    def save(self, path: Path) -> None:
        """Write a checkpoint (called on every rank)."""

    def load(self, path: Path) -> None:
        """Restore a checkpoint written by :meth:`save`."""
