"""Which train examples a step draws (``data.sampler``), and how that choice learns from rollouts.

Every sampler is deterministic: ``indices(step, round)`` is a function of the run seed, the step,
the refill round and the sampler's state, and the state is saved in checkpoints, so a resumed run
draws exactly what the uninterrupted run would have.

- ``uniform``: seeded epoch-wise permutations (every example once per epoch).
- ``variance``: MMR1's variance-aware sampling (prompts whose rollouts disagree are re-drawn).
- ``dump``: DUMP's UCB bandit over the data sources of a task mixture.

Refill rounds (``round >= 1``, DAPO dynamic sampling) draw uniformly at random with a seed of their
own, so they never shift the prompts of later steps.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Sequence

import torch

from mmrl.config.options import check_options
from mmrl.registry import PROMPT_SAMPLERS, register_sampler

from ..seeding import stream_seed


class PromptSampler:
    """Base class; register your own with ``@mmrl.register_sampler("name")``. ``sizes`` maps each data source to its number of train examples (one source
    for a plain task); global index ``i`` lies in the source whose offset range contains it."""

    name = "sampler"

    def __init__(self, sizes: dict[str, int], batch: int, seed: int):
        if not sizes or sum(sizes.values()) <= 0:
            raise ValueError("the task's train split is empty")
        self.sizes = dict(sizes)
        self.size = sum(self.sizes.values())
        self.batch, self.seed = batch, seed
        self.offsets: dict[str, int] = {}
        start = 0
        for name, n in self.sizes.items():
            self.offsets[name] = start
            start += n
        self._perm: tuple[int, torch.Tensor] | None = None

    # -- what every sampler shares ----------------------------------------------------------------
    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(stream_seed(self.seed, epoch, "epoch_order"))
            self._perm = (epoch, torch.randperm(self.size, generator=g))
        return self._perm[1]

    def uniform_indices(self, step: int) -> list[int]:
        """Step ``step``'s slice of the seeded epoch permutations (steps count from 1 or 0 alike)."""
        out = []
        for pos in range(step * self.batch, (step + 1) * self.batch):
            epoch, i = divmod(pos, self.size)
            out.append(int(self._permutation(epoch)[i]))
        return out

    def refill_indices(self, step: int, round: int, k: int) -> list[int]:
        """``k`` uniform random draws for refill round ``round`` of ``step``."""
        g = torch.Generator().manual_seed(stream_seed(self.seed, step, "prompt_refill", round))
        return torch.randint(self.size, (k,), generator=g).tolist()

    def source_of(self, index: int) -> str:
        for name in reversed(list(self.offsets)):
            if index >= self.offsets[name]:
                return name
        raise IndexError(index)

    # -- the sampler's policy ---------------------------------------------------------------------
    def indices(self, step: int, round: int = 0) -> list[int]:
        """The ``batch`` example indices of ``step`` (``round`` > 0: a dynamic-sampling refill)."""
        if round > 0:
            return self.refill_indices(step, round, self.batch)
        return self.uniform_indices(step)

    def observe(self, indices: Sequence[int], rewards: torch.Tensor, advantages: torch.Tensor,
                group_ids: torch.Tensor, completions: Sequence[str]) -> dict[str, float]:
        """Learn from one step's groups: ``indices[g]`` is group g's example index; ``rewards`` /
        ``advantages`` / ``completions`` are per sample. Returns metrics to log."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep to resume exactly; the uniform sampler keeps nothing (its
        draws are a function of seed and step)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; nothing to restore for a stateless sampler."""


@register_sampler("uniform")
class UniformSampler(PromptSampler):
    """Seeded epochs: every example once per epoch, in a fresh order each epoch."""


# --------------------------------------------------------------------------------------------
# MMR1 variance-aware sampling
# --------------------------------------------------------------------------------------------


def outcome_variance(rewards: torch.Tensor) -> float:
    """OVS: the population variance of one group's rewards; for 0/1 rewards with success rate
    p this is MMR1's Bernoulli variance p(1 - p) (e.g. 2 of 4 right -> 0.25)."""
    r = rewards.double()
    return float(((r - r.mean()) ** 2).mean())


def trajectory_diversity(completions: Sequence[str]) -> float:
    """TDS: the mean pairwise Jaccard distance 1 - |A & B| / |A | B| between the word sets of a
    group's completions (0 when all are identical, 1 when no two share a word). MMR1 scores
    diversity among a prompt's trajectories; this word-set distance is our choice of measure."""
    sets = [set(c.split()) for c in completions]
    pairs = [(a, b) for i, a in enumerate(sets) for b in sets[i + 1:]]
    if not pairs:
        return 0.0
    dist = [1.0 - (len(a & b) / len(a | b) if a | b else 1.0) for a, b in pairs]
    return sum(dist) / len(dist)


@register_sampler("variance")
class VarianceAwareSampler(PromptSampler):
    """Variance-aware sampling (VAS) from "MMR1: Enhancing Multimodal Reasoning with Variance-Aware
    Sampling and Open Resources" (Leng et al., 2025).

    GRPO's gradient vanishes on prompts whose rollouts all get the same reward, and MMR1 shows
    reward variance lower-bounds the expected improvement. Each prompt gets a Variance Promotion
    Score ``VPS = alpha * OVS + beta * TDS`` (:func:`outcome_variance`,
    :func:`trajectory_diversity`) from its latest rollouts; each batch takes a fraction
    ``mix`` (MMR1's lambda) of its prompts by sampling without replacement with probability
    proportional to VPS among the scored prompts, and the rest from the uniform stream (which
    keeps covering unseen prompts). MMR1 re-scores the whole dataset every T_update steps; we
    update a prompt's score whenever it is rolled out, which costs no extra generation.
    """

    def __init__(self, sizes, batch, seed, alpha: float = 1.0, beta: float = 1.0, mix: float = 0.5,
                 max_tracked: int = 100_000):
        super().__init__(sizes, batch, seed)
        if not 0.0 <= mix <= 1.0:
            raise ValueError(f"variance sampler: mix must be in [0, 1], got {mix}")
        self.alpha, self.beta, self.mix, self.max_tracked = alpha, beta, mix, max_tracked
        self.scores: dict[int, float] = {}

    def vps(self, rewards: torch.Tensor, completions: Sequence[str]) -> float:
        return self.alpha * outcome_variance(rewards) + self.beta * trajectory_diversity(completions)

    def indices(self, step: int, round: int = 0) -> list[int]:
        if round > 0:
            return self.refill_indices(step, round, self.batch)
        k = min(int(round_half_up(self.mix * self.batch)), sum(1 for s in self.scores.values() if s > 0))
        picked: list[int] = []
        if k > 0:
            keys = [i for i, s in self.scores.items() if s > 0]
            weights = torch.tensor([self.scores[i] for i in keys], dtype=torch.double)
            g = torch.Generator().manual_seed(stream_seed(self.seed, step, "variance_sampler"))
            picked = [keys[j] for j in torch.multinomial(weights, k, replacement=False, generator=g).tolist()]
        chosen = set(picked)
        rest = [i for i in self.uniform_indices(step) if i not in chosen][: self.batch - len(picked)]
        return picked + rest

    def observe(self, indices, rewards, advantages, group_ids, completions):
        fresh = []
        for g, idx in enumerate(indices):
            rows = (group_ids == g).nonzero().flatten().tolist()
            if not rows:
                continue
            score = self.vps(rewards[rows], [completions[i] for i in rows])
            self.scores.pop(int(idx), None)  # re-insert: dict order = recency, for eviction
            self.scores[int(idx)] = score
            fresh.append(score)
        while len(self.scores) > self.max_tracked:
            self.scores.pop(next(iter(self.scores)))
        return {"sampler/vps_mean": sum(fresh) / max(len(fresh), 1), "sampler/tracked": float(len(self.scores))}

    def state_dict(self):
        return {"scores": list(self.scores.items())}

    def load_state_dict(self, state):
        self.scores = {int(k): float(v) for k, v in state.get("scores", [])}


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


# --------------------------------------------------------------------------------------------
# DUMP
# --------------------------------------------------------------------------------------------


@register_sampler("dump")
class DUMPSampler(PromptSampler):
    """Distribution-level curriculum from "DUMP: Automated Distribution-Level Curriculum Learning
    for RL-based LLM Post-training" (Wang et al., 2025).

    The mean absolute advantage a source's samples produce measures how much the policy can still
    learn from it (it is ~0 both where the model always succeeds and where it always fails). Each
    source j keeps a sliding window of its last ``window`` values |A_i| and the count n_j of its
    samples so far; its UCB score is

        UCB_j = mean_window(|A|)_j + c * sqrt(2 * ln(sum_k n_k) / n_j)

    (unseen sources score +inf, so each is tried first), and each prompt's source is drawn from
    ``softmax(UCB / temperature)``; the example within the source is uniform. Defaults follow the
    paper's setup as far as we know it: window 300, c = 1, temperature 0.1.
    """

    def __init__(self, sizes, batch, seed, window: int = 300, c: float = 1.0, temperature: float = 0.1):
        super().__init__(sizes, batch, seed)
        if len(self.sizes) < 2:
            raise ValueError(
                "data.sampler=dump chooses between data sources, and this task has one; "
                "train a task mixture (task.name=mixture, see configs/vlm/mixture_tiny.yaml)"
            )
        if temperature <= 0:
            raise ValueError(f"dump sampler: temperature must be > 0, got {temperature}")
        self.window, self.c, self.temperature = window, c, temperature
        self.abs_adv: dict[str, deque] = {s: deque(maxlen=window) for s in self.sizes}
        self.counts: dict[str, int] = {s: 0 for s in self.sizes}

    def ucb(self) -> dict[str, float]:
        total = sum(self.counts.values())
        out = {}
        for s in self.sizes:
            n = self.counts[s]
            if n == 0:
                out[s] = math.inf
                continue
            window = self.abs_adv[s]
            mean = sum(window) / len(window) if window else 0.0
            out[s] = mean + self.c * math.sqrt(2.0 * math.log(max(total, 1)) / n)
        return out

    def probabilities(self) -> dict[str, float]:
        """softmax(UCB / temperature); unseen (+inf) sources share all the mass."""
        scores = self.ucb()
        if any(math.isinf(v) for v in scores.values()):
            unseen = [s for s, v in scores.items() if math.isinf(v)]
            return {s: (1.0 / len(unseen) if s in unseen else 0.0) for s in scores}
        probs = torch.softmax(torch.tensor(list(scores.values()), dtype=torch.double) / self.temperature, 0)
        return dict(zip(scores, probs.tolist()))

    def indices(self, step: int, round: int = 0) -> list[int]:
        g = torch.Generator().manual_seed(stream_seed(self.seed, step, "dump_sampler", round))
        probs = self.probabilities()
        names = list(probs)
        draws = torch.multinomial(torch.tensor([probs[s] for s in names], dtype=torch.double), self.batch,
                                  replacement=True, generator=g).tolist()
        out = []
        for j in draws:
            name = names[j]
            local = int(torch.randint(self.sizes[name], (1,), generator=g))
            out.append(self.offsets[name] + local)
        return out

    def observe(self, indices, rewards, advantages, group_ids, completions):
        adv = advantages if advantages.dim() == 1 else advantages.mean(-1)
        for g, idx in enumerate(indices):
            source = self.source_of(int(idx))
            values = adv[group_ids == g].abs().tolist()
            self.abs_adv[source].extend(values)
            self.counts[source] += len(values)
        metrics = {f"sampler/p/{s}": p for s, p in self.probabilities().items()}
        metrics.update({f"sampler/abs_adv/{s}": (sum(w) / len(w) if w else 0.0) for s, w in self.abs_adv.items()})
        return metrics

    def state_dict(self):
        return {"abs_adv": {s: list(w) for s, w in self.abs_adv.items()}, "counts": dict(self.counts)}

    def load_state_dict(self, state):
        for s, values in state.get("abs_adv", {}).items():
            if s in self.abs_adv:
                self.abs_adv[s] = deque(values, maxlen=self.window)
        self.counts.update({s: int(n) for s, n in state.get("counts", {}).items() if s in self.counts})


def make_sampler(name: str, sizes: dict[str, int], batch: int, seed: int, **kwargs: Any) -> PromptSampler:
    """The registered prompt sampler ``name`` (``data.sampler``) with ``data.sampler_kwargs``, which
    are checked against its constructor (an option it does not take is a ConfigError)."""
    cls = PROMPT_SAMPLERS.get(name, "data.sampler")  # unknown names raise, listing the registered samplers
    check_options(cls, kwargs, "data.sampler_kwargs", f"the {name} sampler", ("sizes", "batch", "seed"))
    return cls(sizes, batch, seed, **kwargs)
