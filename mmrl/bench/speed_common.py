"""What both sides of ``mmrl bench speed`` record per step, and how time and memory are read.

Shared by the mmrl side (:mod:`mmrl.bench.speed`) and the TRL side (:mod:`mmrl.bench.speed_trl`)
so the two are measured by the same code: step boundaries synchronise CUDA, the phases of a step
(generation, old/reference log-probs) are timed by the same :class:`PhaseClock` around each side's
own methods, peak memory is the CUDA allocator's peak on a GPU and the process's peak resident set
on a CPU, both reset after the warm-up step.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import torch

# mmrl's loss aggregation (algo.loss_agg_mode) -> TRL's loss_type with the same normalisation.
LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum_norm": "dr_grpo"}


@dataclass
class SideResult:
    """One trainer's steps. Lists hold one entry per step, warm-up step(s) included (first)."""

    name: str
    warmup: int
    step_s: list[float] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    peak_memory_gib: float | None = None
    memory_kind: str = ""
    logs: list[dict] = field(default_factory=list)  # the trainer's own per-step log entries
    micro_batch_used: int | None = None  # mmrl: samples per forward at the end (lower after an out-of-memory back-off)
    generate_s: list[float] = field(default_factory=list)  # the rollout's generation
    logprobs_s: list[float] = field(default_factory=list)  # the rollout's old/reference log-prob passes
    trained_params: int | None = None  # parameters the optimizer steps (each tensor once)

    def add(self, step_s: float, rollout_s: float, samples: int, completion_tokens: int, prompt_tokens: int,
            generate_s: float = 0.0, logprobs_s: float = 0.0) -> None:
        self.step_s.append(float(step_s))
        self.rollout_s.append(float(rollout_s))
        self.samples.append(int(samples))
        self.completion_tokens.append(int(completion_tokens))
        self.prompt_tokens.append(int(prompt_tokens))
        self.generate_s.append(float(generate_s))
        self.logprobs_s.append(float(logprobs_s))

    @property
    def measured(self) -> slice:
        return slice(self.warmup, None)

    def summary(self) -> dict[str, float]:
        """Means over the measured steps (warm-up left out); rates are totals over total time."""
        m = self.measured
        steps, rollouts = self.step_s[m], self.rollout_s[m]
        if not steps:
            raise ValueError(f"{self.name}: no measured steps (only warm-up)")
        total = sum(steps)
        updates = [s - r for s, r in zip(steps, rollouts)]
        return {
            "steps": len(steps),
            "samples_per_s": sum(self.samples[m]) / total,
            "tokens_per_s": sum(self.completion_tokens[m]) / total,
            "step_s": total / len(steps),
            "rollout_s": statistics.fmean(rollouts),
            "update_s": statistics.fmean(updates),
            "update_s_median": statistics.median(updates),
            "generate_s": statistics.fmean(self.generate_s[m]) if self.generate_s else None,
            "logprobs_s": statistics.fmean(self.logprobs_s[m]) if self.logprobs_s else None,
            "samples_per_step": statistics.fmean(self.samples[m]),
            "completion_tokens_per_step": statistics.fmean(self.completion_tokens[m]),
            "prompt_tokens_per_step": statistics.fmean(self.prompt_tokens[m]),
            "peak_memory_gib": self.peak_memory_gib,
        }

    @classmethod
    def merged(cls, results: "list[SideResult]") -> "SideResult":
        """The measured steps of several repeats of one side as one result (peak: the largest)."""
        out = cls(results[0].name, 0, memory_kind=results[0].memory_kind)
        for r in results:
            m = r.measured
            out.step_s += r.step_s[m]
            out.rollout_s += r.rollout_s[m]
            out.samples += r.samples[m]
            out.completion_tokens += r.completion_tokens[m]
            out.prompt_tokens += r.prompt_tokens[m]
            out.generate_s += r.generate_s[m]
            out.logprobs_s += r.logprobs_s[m]
            out.logs += r.logs
        peaks = [r.peak_memory_gib for r in results if r.peak_memory_gib is not None]
        out.peak_memory_gib = max(peaks) if peaks else None
        out.micro_batch_used = results[-1].micro_batch_used
        out.trained_params = results[-1].trained_params
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "summary": self.summary()}


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a step's time is its own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def optimizer_params(optimizer) -> int:
    """Elements of the parameters ``optimizer`` steps, each tensor counted once (tied weights)."""
    seen = {id(p): p for group in optimizer.param_groups for p in group["params"]}
    return sum(p.numel() for p in seen.values())


class PhaseClock:
    """Seconds per named phase of a step, CUDA synchronised at each boundary.

    :meth:`wrap` replaces a method of one object by a timed call (the instance attribute shadows
    the class's method; the class is untouched); ``within`` counts a call only while that phase is
    running, so a method the trainer also calls in its update (TRL's and mmrl's log-prob forward)
    is counted in the rollout's phase only when the rollout calls it. A phase running inside itself
    (recursion) is counted once. :meth:`take` returns the seconds since the last take.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)
        self.running: set[str] = set()

    @contextmanager
    def phase(self, name: str, within: str | None = None) -> Iterator[None]:
        if name in self.running or (within is not None and within not in self.running):
            yield
            return
        self.running.add(name)
        sync(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync(self.device)
            self.seconds[name] += time.perf_counter() - t0
            self.running.discard(name)

    def wrap(self, owner, attr: str, name: str, within: str | None = None) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.phase(name, within):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)

    def take(self) -> dict[str, float]:
        out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


def median_spread(values: list[float]) -> dict[str, float] | None:
    """``{"median", "min", "max", "n"}`` of ``values`` (None when empty): the table's figure and
    its spread over the repeats."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_rss_reset = {"ok": False}


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's on a GPU; on a CPU the process's resident-set high
    water mark (Linux: writing 5 to /proc/self/clear_refs resets VmHWM; elsewhere it cannot be
    reset and the reading is the peak of the whole process so far)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        _CLEAR_REFS.write_text("5")
        _rss_reset["ok"] = True
    except OSError:
        _rss_reset["ok"] = False


def peak_memory(device: torch.device) -> tuple[float, str]:
    """``(GiB, what was measured)`` since :func:`reset_peak_memory`."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "CUDA peak allocated"
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:") and _rss_reset["ok"]:
                return int(line.split()[1]) / 2**20, "process peak RSS (VmHWM, reset after the warm-up)"
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS since start (not resettable here)"
