"""What both sides of ``mmrl bench speed`` record per step, and how memory is read.

Shared by the mmrl side (:mod:`mmrl.bench.speed`) and the TRL side (:mod:`mmrl.bench.speed_trl`)
so the two are measured by the same code: step boundaries synchronise CUDA, peak memory is the
CUDA allocator's peak on a GPU and the process's peak resident set on a CPU, both reset after the
warm-up step.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

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

    def add(self, step_s: float, rollout_s: float, samples: int, completion_tokens: int, prompt_tokens: int) -> None:
        self.step_s.append(float(step_s))
        self.rollout_s.append(float(rollout_s))
        self.samples.append(int(samples))
        self.completion_tokens.append(int(completion_tokens))
        self.prompt_tokens.append(int(prompt_tokens))

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
            out.logs += r.logs
        peaks = [r.peak_memory_gib for r in results if r.peak_memory_gib is not None]
        out.peak_memory_gib = max(peaks) if peaks else None
        out.micro_batch_used = results[-1].micro_batch_used
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "summary": self.summary()}


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a step's time is its own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
