"""One RL step's policy update: ``algo.num_iterations`` passes over the step's batch in shuffled
mini-batches, one optimizer step each, on the loss of that step (its KL weight from the
configured schedule).

Several processes: each rank trains its share of every mini-batch, the normalisers are the whole
mini-batch's, and every rank runs as many optimizer steps as the rank with the most samples needs.
"""

from __future__ import annotations

import dataclasses

import torch

from . import distributed as dist
from .losses import Objective, ObjectiveConfig, count_sequences, kl_penalty
from .rollouts import Rollouts
from .schedules import check_kl_schedule, kl_coef_at
from .seeding import STREAMS, stream_seed


class PolicyUpdate:
    """The update of the module docstring for one run (``cfg``, ``policy``); ``track_kl``: measure
    the KL between the policy before and after (estimators that adapt to it read ``policy_kl``)."""

    def __init__(self, cfg, policy, track_kl: bool = False):
        self.cfg, self.policy, self.track_kl = cfg, policy, track_kl
        self.objective_cfg = ObjectiveConfig.from_algo(cfg.algo, max_completion_length=policy.max_actions)
        check_kl_schedule(cfg.algo.kl_schedule, dict(cfg.algo.kl_schedule_kwargs))
        if not 1 <= cfg.algo.num_iterations <= STREAMS["minibatch_order"][1]:
            raise ValueError(f"algo.num_iterations={cfg.algo.num_iterations}: use 1 to {STREAMS['minibatch_order'][1]}")
        if track_kl and "scoring" not in policy.capabilities:
            raise ValueError(f"algo.advantage={cfg.algo.advantage!r} measures each update's policy KL by "
                             f"re-scoring the batch, which a {type(policy).__name__} cannot; set "
                             "algo.advantage_kwargs.rho to a fixed forgetting factor")
        self.skip_causes: list[str] = []  # why the last update's skipped optimizer steps were skipped
        self.policy_kl: float | None = None  # KL(before || after) of the last update, when tracked

    def objective_at(self, step: int) -> Objective:
        """The loss for ``step``, with the KL weight of the configured schedule."""
        algo = self.cfg.algo
        beta = kl_coef_at(step - 1, algo.beta, algo.kl_schedule, total_steps=self.cfg.train.steps,
                          **dict(algo.kl_schedule_kwargs))
        return Objective(dataclasses.replace(self.objective_cfg, beta=beta))

    def __call__(self, batch: Rollouts, step: int) -> dict[str, float]:
        """Train on ``batch``; the metrics averaged over the optimizer steps."""
        cfg, policy = self.cfg, self.policy
        objective = self.objective_at(step)
        before = None
        if self.track_kl:
            before = batch.old_logps if batch.old_logps is not None else policy.score(batch, reference=False)
        n = len(batch)
        mini, chunks = self.mini_batches(n)
        sums: dict[str, float] = {}
        count = 0
        self.skip_causes = []
        for it in range(cfg.algo.num_iterations):
            g = torch.Generator().manual_seed(stream_seed(cfg.train.seed, step, "minibatch_order", it))
            order = torch.randperm(n, generator=g) if mini < n else torch.arange(n)
            for c in range(chunks):
                sub = batch.select(order[c * mini:(c + 1) * mini])
                # Global normalisers: every rank's loss is a share of the whole mini-batch's.
                metrics = policy.train_step(sub, objective, num_tokens=dist.all_sum(sub.action_mask.sum()),
                                            num_seqs=dist.all_sum(count_sequences(sub.action_mask)))
                if metrics.get("skipped_update"):
                    self.skip_causes.append(policy.last_skip_cause)
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        out = {k: v / count for k, v in sums.items()}
        out["micro_batch_size"] = float(policy.micro_batch_size)
        if cfg.algo.beta > 0:
            out["kl_coef"] = objective.cfg.beta
        if self.track_kl:
            after = policy.score(batch, reference=False)
            kl = kl_penalty(before, after, "k3") * batch.action_mask
            self.policy_kl = dist.all_sum(kl.sum()) / max(dist.all_sum(batch.action_mask.sum()), 1.0)
            out["policy_kl"] = self.policy_kl
        return out

    def mini_batches(self, n: int) -> tuple[int, int]:
        """(samples per mini-batch on this rank, mini-batches per iteration). One process:
        ``train.mini_batch_size`` of the batch. Several: each rank takes its share of it, and all
        ranks run as many optimizer steps as the rank with the most samples needs (a rank with
        fewer trains on empty shares, which still join the gradient average)."""
        mini = self.cfg.train.mini_batch_size or n
        if dist.world_size() > 1:
            mini = max(1, self.cfg.train.mini_batch_size // dist.world_size()) if self.cfg.train.mini_batch_size \
                else max(1, int(dist.all_max(n)))
            return mini, int(dist.all_max(-(-n // mini)))
        return mini, -(-n // mini) if n else 0
