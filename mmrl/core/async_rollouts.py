"""Asynchronous training (``train.async_rollouts``, ``train.max_staleness`` = k): the rollouts of
steps t+1..t+k are generated in a background thread while step t trains.

The schedule is fixed, so a run is reproducible and resumes exactly: the batch of step s is
generated from the weights published after step ``s - 1 - k`` (version ``max(base, s - 1 - k)``,
where version v = the weights after v optimizer steps of the run, ``base`` the version a launch
starts from), and the weights after step t are published (pushed to the rollout engine) once the
batch of step ``t + k`` is generated. So while step t trains, the engine generates the batch of
step t + k from version t - 1: with k = 1 this is verl's one-step-off policy. The generation stage
holds a lock the training thread takes to publish weights and to evaluate, so an engine never sees
half the weights and the global RNG is the generator's alone while it builds a batch (it reseeds
from ``(train.seed, step)`` first, as the on-policy loop does). The training thread takes the lock
only once the thread has generated every batch the published weights allow (:meth:`RolloutsAhead.paused`),
so it never waits for a batch in the middle of being built, and every rank pauses at the same
point of the schedule.

Several training processes: every rank generates its share of each step's prompts, on the same
schedule, so all ranks publish after the same steps (a publish is collective: the weights are
pushed by rank 0, the others wait for it, :mod:`mmrl.vlm.engines.vllm_server`). Building a batch
gathers what the estimators need of the whole batch (:mod:`mmrl.core.batch.whole`): the
generator thread runs those gathers on a process group of its own
(:mod:`mmrl.core.thread_groups`), as collectives of two threads on one group would interleave and
deadlock; the training thread's collectives (gradients, the publish, evaluation, checkpoints)
stay on the default group.

Each trained sample records the version that made it; samples more than k versions behind the
weights being trained (a resume with a smaller ``train.max_staleness``) are dropped by group and
counted. The importance-sampling correction (``algo.vllm_importance_sampling_*``: the trainer's
log-probs at the step over the engine's) covers the gap, as in "AReaL: A Large-Scale Asynchronous
Reinforcement Learning System for Language Reasoning" (Fu et al., 2025).

A checkpoint after step t holds the batches generated but not trained (steps t+1..t+k, and t+k+1
when the thread had built it), each rank its own, so a resumed run trains exactly what the
uninterrupted run would have. ``max_staleness = 0`` is the
on-policy loop itself (no thread).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

import torch

from . import thread_groups
from .rollouts import Rollouts

GENERATOR_GROUP = "rollouts-ahead/"  # how a stall of the generator thread's collectives is named


def batch_version(step: int, k: int, base: int = 0) -> int:
    """The weights version the batch of ``step`` is generated from: ``max(base, step - 1 - k)``.
    E.g. k=1: steps 1 and 2 from version 0 (the initial weights), step 3 from version 1."""
    return max(base, step - 1 - k)


def stale_groups(group_ids: torch.Tensor, versions: torch.Tensor, current: int, k: int) -> torch.Tensor:
    """(N,) bool: samples of a group any of whose samples is more than ``k`` versions behind
    ``current`` (the weights the step trains: version step - 1). E.g. current 5, k 1, versions
    [4, 4, 3, 3] in groups [0, 0, 1, 1] -> [False, False, True, True]."""
    too_old = (current - versions) > k
    bad = torch.unique(group_ids[too_old])
    return torch.isin(group_ids, bad)


def staleness_metrics(versions: torch.Tensor, current: int, dropped: int) -> dict[str, float]:
    """What a trained batch logs: the mean and largest version lag of its samples and how many
    samples were dropped as too old."""
    lag = (current - versions).float()
    return {"async/staleness": float(lag.mean()) if len(lag) else 0.0,
            "async/staleness_max": float(lag.max()) if len(lag) else 0.0,
            "async/dropped_stale": float(dropped)}


def check_async(cfg, policy, tracks_policy_kl: bool) -> None:
    """Stop at setup when ``train.async_rollouts`` cannot run as asked."""
    from ..config import ConfigError

    t = cfg.train
    if t.max_staleness < 0:
        raise ConfigError(f"train.max_staleness={t.max_staleness} must be >= 0 (0: the on-policy loop)")
    if not t.async_rollouts or t.max_staleness == 0:
        return
    if "async_rollouts" not in policy.capabilities:
        raise ConfigError(f"train.async_rollouts=true needs a rollout engine that generates from its own copy of the "
                          f"weights (rollout.engine=vllm_server; see `mmrl rollout-server`); a {type(policy).__name__} "
                          f"with rollout.engine={cfg.rollout.engine} generates from the module it trains. Set "
                          "train.async_rollouts=false or rollout.engine=vllm_server")
    if tracks_policy_kl:
        raise ConfigError(f"algo.advantage={cfg.algo.advantage!r} adapts to each update's policy KL, which an "
                          "asynchronous batch is built before; set algo.advantage_kwargs.rho or train.async_rollouts=false")


class RolloutsAhead:
    """The generator thread and its schedule (module docstring).

    ``build(step)`` makes the batch of ``step`` and its metrics (called in the thread, under the
    lock); ``publish()`` pushes the current weights to the engine (called here, in the training
    thread, under the lock). Steps ``start + 1 .. last`` are generated; ``pending`` maps steps
    already generated (a checkpoint's) to ``(batch, metrics, version)``."""

    def __init__(self, build: Callable[[int], tuple[Rollouts, dict[str, float]]], publish: Callable[[], None],
                 k: int, start: int, last: int, pending: dict[int, tuple] | None = None):
        if k < 1:
            raise ValueError(f"train.max_staleness={k}: the generator thread runs only for k >= 1")
        self.build, self.publish_fn, self.k, self.last = build, publish, k, last
        self.base = self.version = start  # the weights after `start` steps are the engine's first
        self.ready: dict[int, tuple[Rollouts, dict[str, float], int]] = dict(pending or {})
        self.next = max([start, *self.ready]) + 1  # the next step to generate
        self.lock = threading.Lock()  # held while a batch is generated, weights published, or eval runs
        self.changed = threading.Condition()
        self.error: BaseException | None = None
        self.stopping = False
        self.group = thread_groups.new_group()  # the thread's collectives (several processes; None in one)
        self.thread = threading.Thread(target=self._run, name="mmrl-rollouts-ahead", daemon=True)
        self.thread.start()

    # -- the generator thread ---------------------------------------------------------------------
    def _run(self) -> None:
        with thread_groups.own_group(self.group, GENERATOR_GROUP):
            self._loop()

    def _loop(self) -> None:
        try:
            while True:
                with self.changed:
                    step = self.next
                    self.changed.wait_for(lambda: self.stopping or step > self.last
                                          or self.version >= batch_version(step, self.k, self.base))
                    if self.stopping or step > self.last:
                        return
                with self.lock:
                    version = self.version
                    batch, metrics = self.build(step)
                with self.changed:
                    self.ready[step] = (batch, metrics, version)
                    self.next = step + 1
                    self.changed.notify_all()
        except BaseException as exc:  # re-raised in the training thread
            with self.changed:
                self.error = exc
                self.changed.notify_all()

    def _wait(self, condition: Callable[[], bool]) -> None:
        with self.changed:
            self.changed.wait_for(lambda: condition() or self.error is not None)
            if self.error is not None:
                raise RuntimeError(f"rollout generation failed: {self.error}") from self.error

    # -- the training thread ----------------------------------------------------------------------
    def take(self, step: int) -> tuple[Rollouts, dict[str, float], torch.Tensor, float]:
        """The batch of ``step``, its generation metrics, each sample's version, and the seconds
        the trainer waited for it."""
        t0 = time.perf_counter()
        self._wait(lambda: step in self.ready)
        with self.changed:
            batch, metrics, version = self.ready.pop(step)
        return batch, metrics, torch.full((len(batch),), version, dtype=torch.long), time.perf_counter() - t0

    def _idle(self) -> bool:
        """Every batch the published weights allow is generated: the thread waits for the next
        publish (the batch of step s needs version s - 1 - k), or has generated the last step."""
        return self.next > min(self.version + self.k + 1, self.last)

    def publish(self, version: int) -> float:
        """After step ``version`` trained: once the batch of step ``version + k`` is generated
        (from the previous weights), push these weights; the next batches are generated from them.
        Returns the seconds the trainer waited for that batch (idle, like waiting in :meth:`take`)."""
        t0 = time.perf_counter()
        self._wait(self._idle)  # the previous version allows steps up to version + k
        waited = time.perf_counter() - t0
        with self.lock:
            self.publish_fn()
        with self.changed:
            self.version = version
            self.changed.notify_all()
        return waited

    @contextlib.contextmanager
    def paused(self):
        """No generation while the block runs (an evaluation uses the engine and the global RNG),
        entered once the thread has generated what the published weights allow: the same point
        of the schedule on every rank, and never a wait for a batch half built (whose gathers
        would wait for the other ranks' threads while they wait here)."""
        self._wait(self._idle)
        with self.lock:
            yield

    def pending(self) -> dict[int, tuple[Rollouts, dict[str, float], int]]:
        """The generated batches not trained yet (what a checkpoint keeps): after step t has
        published its weights, steps t+1..t+k."""
        with self.changed:
            return dict(self.ready)

    def close(self) -> None:
        """Stop the thread (after the batch it is generating, if any)."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        self.thread.join()
