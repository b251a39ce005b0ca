"""Rollouts on their own devices, on paper: samples/s and idle time of sync and k-stale training.

``mmrl bench async --simulate`` answers "what would 2 rollout GPUs + 6 training GPUs give me, sync or
one step off?" from costs measured once (:mod:`mmrl.bench.async_costs` reads them from a sync run):

- ``gen_s``: seconds to generate one step's batch on ONE rollout device (everything the rollout
  stage does before the update);
- ``update_s``: seconds of one step's update on ONE training device;
- ``sync_s``: seconds one weight push holds the trainer (NCCL broadcast or a reload);
- ``samples``: samples per step.

A layout ``M+N`` has M rollout devices (data-parallel vLLM servers, each generating 1/M of the
batch) and N training devices (DDP/FSDP2). n devices do a step's work ``1 + (n - 1) * efficiency``
times as fast: efficiency 1 is linear scaling; below 1, each added device adds less (an assumption
the caller states, not a measurement).

The schedule is the asynchronous trainer's (:mod:`mmrl.core.async_rollouts`): batch s is generated
from the weights published after step ``s - 1 - k`` (version 0 is the start), as soon as those are
published and the generator is free; step s trains once batch s is generated and step s - 1 is
done; then, once batch ``s + k`` is generated, the trainer pushes its weights (``sync_s``, the
generator paused meanwhile) and publishes them. k = 0 is sync training: push, generate, update,
one after another, ``step = sync + gen + update``, the trainer idle for ``gen``. With constant
costs and k >= 1 the steady state is ``step = max(gen, update) + sync``: the trainer idles
``max(0, gen - update)`` a step and the generator ``max(0, update - gen) + sync``. k = 1 is
one-step-off training (verl's one_step_off_policy recipe); k > 1 as in "AReaL: A Large-Scale
Asynchronous Reinforcement Learning System for Language Reasoning" (Fu et al., 2025). Costs
vary from step to step (completion lengths do): :func:`simulate` draws each step's costs from a
gamma distribution of the given coefficient of variation and plays the schedule step by step. As
each push waits for the batch k steps ahead, a deeper queue does not absorb a slow batch better
than k = 1 under this schedule (tests/test_bench_async.py works one through by hand).

``colocated`` is the baseline without a split: every device generates, then every device trains
(mmrl's hf or in-process vLLM engine), sync only, no push.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

SYNC = "sync"
COLOCATED = "colocated"


@dataclass(frozen=True)
class Costs:
    """One step's measured costs on one device of each kind (see the module doc)."""

    gen_s: float
    update_s: float
    sync_s: float = 0.0
    samples: int = 1
    gen_cv: float = 0.0  # step-to-step coefficient of variation of gen_s (std / mean)
    update_cv: float = 0.0

    def __post_init__(self):
        if self.gen_s < 0 or self.update_s < 0 or self.sync_s < 0:
            raise ValueError(f"costs must be >= 0 seconds, got gen {self.gen_s}, update {self.update_s}, "
                             f"sync {self.sync_s}")
        if self.gen_s + self.update_s <= 0:
            raise ValueError("generation and update cannot both cost 0 seconds")
        if self.samples < 1 or self.gen_cv < 0 or self.update_cv < 0:
            raise ValueError(f"samples must be >= 1 and the variations >= 0, got {self.samples}, "
                             f"{self.gen_cv}, {self.update_cv}")

    @classmethod
    def per_token(cls, gen_ms: float, update_ms: float, tokens: int, samples: int, sync_s: float = 0.0,
                  gen_cv: float = 0.0, update_cv: float = 0.0) -> "Costs":
        """From milliseconds per completion token (``tokens`` per sample, ``samples`` per step)."""
        n = tokens * samples / 1000.0
        return cls(gen_ms * n, update_ms * n, sync_s, samples, gen_cv, update_cv)

    def with_samples(self, samples: int) -> "Costs":
        """The same work per sample, ``samples`` a step (generation and update scale linearly; the
        push does not)."""
        f = samples / self.samples
        return Costs(self.gen_s * f, self.update_s * f, self.sync_s, samples, self.gen_cv, self.update_cv)

    def describe(self) -> str:
        return (f"one step of {self.samples} samples: generation {self.gen_s:.3g} s on one rollout device "
                f"(variation {self.gen_cv:.0%}), update {self.update_s:.3g} s on one training device "
                f"(variation {self.update_cv:.0%}), weight push {self.sync_s:.3g} s")


@dataclass(frozen=True)
class Layout:
    """M rollout devices + N training devices and how well each kind scales."""

    rollout: int
    train: int
    rollout_efficiency: float = 1.0
    train_efficiency: float = 1.0

    def __post_init__(self):
        if self.rollout < 1 or self.train < 1:
            raise ValueError(f"a layout needs >= 1 rollout and >= 1 training device, got {self.rollout}+{self.train}")
        for eff in (self.rollout_efficiency, self.train_efficiency):
            if not 0.0 <= eff <= 1.0:
                raise ValueError(f"a scaling efficiency is between 0 and 1, got {eff}")

    @classmethod
    def parse(cls, text: str, rollout_efficiency: float = 1.0, train_efficiency: float = 1.0) -> "Layout":
        """``"2+6"``: 2 rollout devices, 6 training devices."""
        try:
            m, n = (int(x) for x in text.strip().split("+"))
        except ValueError:
            raise ValueError(f"a layout is ROLLOUT+TRAIN devices, e.g. 2+6, got {text!r}") from None
        return cls(m, n, rollout_efficiency, train_efficiency)

    @property
    def name(self) -> str:
        return f"{self.rollout}+{self.train}"


def speedup(devices: int, efficiency: float) -> float:
    """How many times faster ``devices`` do one step's work than one: 1 + (devices - 1) * efficiency."""
    return 1.0 + (devices - 1) * efficiency


@dataclass(frozen=True)
class Prediction:
    layout: str
    mode: str  # "colocated", "sync", "k=1", ...
    step_s: float
    samples_per_s: float
    trainer_idle: float | None  # share of the time the training devices wait for rollouts
    rollout_idle: float | None  # share of the time the rollout devices wait for weights
    # (both None when colocated: the same devices generate, then train)


def mode_name(k: int) -> str:
    return SYNC if k == 0 else f"k={k}"


def _draw(rng: random.Random, mean: float, cv: float) -> float:
    if cv <= 0 or mean <= 0:
        return mean
    shape = 1.0 / (cv * cv)
    return rng.gammavariate(shape, mean / shape)


@dataclass(frozen=True)
class Timeline:
    """When each batch was generated and each step trained and pushed (index s - 1 for step s)."""

    gen_start: list[float]
    gen_end: list[float]
    train_start: list[float]
    push_start: list[float]  # the update is done; the push waits for batch s + k (then holds both sides)
    push_end: list[float]  # the weights of step s published


def schedule(gens: Sequence[float], updates: Sequence[float], sync_s: float, k: int) -> Timeline:
    """The schedule of the module doc, step by step, for the given per-step costs and staleness
    ``k`` (0: sync)."""
    if k < 0:
        raise ValueError(f"max_staleness k is >= 0, got {k}")
    if len(gens) != len(updates):
        raise ValueError(f"one generation and one update cost per step, got {len(gens)} and {len(updates)}")
    steps = len(gens)
    t = Timeline([], [], [], [], [])
    for s in range(1, steps + 1):
        while len(t.gen_end) < min(s + k, steps):  # batches up to s + k, each from version b - 1 - k
            b = len(t.gen_end) + 1
            published = t.push_end[b - 2 - k] if b - 1 - k >= 1 else 0.0
            t.gen_start.append(max(published, t.gen_end[-1] if t.gen_end else 0.0))
            t.gen_end.append(t.gen_start[-1] + gens[b - 1])
        t.train_start.append(max(t.gen_end[s - 1], t.push_end[-1] if t.push_end else 0.0))
        t.push_start.append(max(t.train_start[-1] + updates[s - 1], t.gen_end[min(s + k, steps) - 1]))
        t.push_end.append(t.push_start[-1] + sync_s)
    return t


def simulate(gen_s: float, update_s: float, sync_s: float, k: int, steps: int = 400, gen_cv: float = 0.0,
             update_cv: float = 0.0, seed: int = 0) -> dict[str, float]:
    """:func:`schedule` over ``steps`` steps whose costs are drawn around the means (gamma, the
    given coefficients of variation, seeded). Returns ``step_s`` (mean seconds a step),
    ``trainer_idle`` (the share of the time the trainer neither updates nor pushes) and
    ``rollout_idle`` (the share the generator does not generate), from the end of step ``k + 1``
    to the end of step ``steps - k``: the start-up (the generator runs ahead on the first weights)
    and the end (nothing left to generate ahead) left out."""
    warm, end = k + 1, steps - k  # the start-up and the last k steps (nothing left to generate ahead)
    if end <= warm:
        raise ValueError(f"simulate at least {2 * k + 2} steps for k={k}, got {steps}")
    rng = random.Random(seed)
    costs = [(_draw(rng, gen_s, gen_cv), _draw(rng, update_s, update_cv)) for _ in range(steps)]
    updates = [u for _, u in costs]
    t = schedule([g for g, _ in costs], updates, sync_s, k)
    window = t.push_end[end - 1] - t.push_end[warm - 1]
    # step s's gaps (waiting for its batch, then for batch s + k before its push) and batch s's gap
    # (waiting for its weights, or paused by a push)
    trainer_wait = sum(t.train_start[i] - t.push_end[i - 1] + t.push_start[i] - t.train_start[i] - updates[i]
                       for i in range(warm, end))
    rollout_wait = sum(t.gen_start[i] - t.gen_end[i - 1] for i in range(warm, end))
    return {"step_s": window / (end - warm), "trainer_idle": max(trainer_wait / window, 0.0),  # -1e-17 is 0
            "rollout_idle": max(rollout_wait / window, 0.0)}


def predict(costs: Costs, layout: Layout, mode: str, steps: int = 400, seed: int = 0) -> Prediction:
    """One row: ``mode`` is ``colocated``, ``sync`` or ``k=K``."""
    if mode == COLOCATED:
        n = layout.rollout + layout.train
        gen = costs.gen_s / speedup(n, layout.rollout_efficiency)
        upd = costs.update_s / speedup(n, layout.train_efficiency)
        out = simulate(gen, upd, 0.0, 0, steps, costs.gen_cv, costs.update_cv, seed)
        out["trainer_idle"] = out["rollout_idle"] = None
    else:
        k = 0 if mode == SYNC else _staleness(mode)
        gen = costs.gen_s / speedup(layout.rollout, layout.rollout_efficiency)
        upd = costs.update_s / speedup(layout.train, layout.train_efficiency)
        out = simulate(gen, upd, costs.sync_s, k, steps, costs.gen_cv, costs.update_cv, seed)
    return Prediction(layout.name, mode, out["step_s"], costs.samples / out["step_s"], out["trainer_idle"],
                      out["rollout_idle"])


def _staleness(mode: str) -> int:
    if mode.startswith("k="):
        try:
            return int(mode[2:])
        except ValueError:
            pass
    raise ValueError(f"a mode is colocated, sync or k=K (K >= 1), got {mode!r}")


def predict_table(costs: Costs, layouts: Sequence[Layout], staleness: Sequence[int] = (0, 1, 2),
                  colocated: bool = True, steps: int = 400, seed: int = 0) -> list[Prediction]:
    """Rows per layout: colocated (optional), then each k of ``staleness`` (0: sync)."""
    modes = ([COLOCATED] if colocated else []) + [mode_name(k) for k in staleness]
    return [predict(costs, layout, mode, steps, seed) for layout in layouts for mode in modes]


def format_predictions(rows: Sequence[Prediction]) -> list[str]:
    """Fixed-width lines of the table; 'x sync' is against the same layout's sync row."""
    sync = {r.layout: r.samples_per_s for r in rows if r.mode == SYNC}
    lines = [f"{'layout':<8}{'mode':<11}{'s/step':>9}{'samples/s':>11}{'x sync':>8}{'trainer idle':>14}"
             f"{'rollout idle':>14}"]
    for r in rows:
        ratio = f"{r.samples_per_s / sync[r.layout]:.2f}" if r.layout in sync else "-"
        lines.append(f"{r.layout:<8}{r.mode:<11}{r.step_s:>9.3g}{r.samples_per_s:>11.3g}{ratio:>8}"
                     f"{_share(r.trainer_idle):>14}{_share(r.rollout_idle):>14}")
    return lines


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
