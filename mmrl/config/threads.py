"""``train.threads``: how many CPU threads torch uses, picked from the cores actually free.

Why not torch's default (one thread per core): OpenMP threads spin while they wait for each other,
so a torch thread on a core that another process keeps busy stalls every parallel region. Measured
on a 2-core machine with one core busy (2026-11-25): a tiny-model linear layer took 16 ms with two
threads against 0.18 ms with one, and ``mmrl train vlm`` 25 minutes instead of 7.5. ``auto`` (the
default) samples how busy the cores are for a quarter of a second before the run and uses only the
free ones; ``OMP_NUM_THREADS``, when set, is taken as the user's choice; a number wins over both
(0 keeps torch's default). The command line applies it (``mmrl train``, ``mmrl eval``) and writes
the number picked into the run's config, so a resume uses the same count (float reductions can
depend on it); the Python API leaves the process's threads alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # None: torch's default left alone
    why: str


def busy_cores(interval: float = 0.25) -> float | None:
    """Cores' worth of CPU time other processes used over ``interval`` seconds (this process is
    idle meanwhile), from ``/proc/stat``; None where it cannot be read."""
    def sample() -> tuple[int, int] | None:
        try:
            fields = [int(x) for x in _STAT.read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    first = sample()
    if first is None:
        return None
    time.sleep(interval)
    second = sample()
    if second is None or second[0] <= first[0]:
        return None
    total, idle = second[0] - first[0], second[1] - first[1]
    return (total - idle) / total * (os.cpu_count() or 1)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pick_threads(setting, busy: float | None = None, cores: int | None = None) -> ThreadChoice:
    """The thread count for ``train.threads=setting`` (``busy``/``cores`` measured when not given)."""
    from mmrl.config import ConfigError

    if isinstance(setting, bool) or not (setting == "auto" or isinstance(setting, int) and setting >= 0):
        raise ConfigError(f"train.threads={setting!r}: expected auto (the free cores) or a number of threads "
                          "(0: torch's default, one per core)")
    if setting != "auto":
        return ThreadChoice(setting or None, "train.threads=0: torch's default" if not setting
                            else f"train.threads={setting}")
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return ThreadChoice(int(env), f"train.threads=auto: OMP_NUM_THREADS={env}")
    cores = cores or usable_cores()
    busy = busy_cores() if busy is None else busy
    if busy is None:
        return ThreadChoice(cores, f"train.threads=auto: {cores} cores (their load could not be read)")
    free = max(1, min(cores, cores - round(busy)))
    return ThreadChoice(free, f"train.threads=auto: {cores} cores, {busy:.1f} busy with other work")


def configure_threads(cfg, echo=print) -> ThreadChoice:
    """Apply ``cfg.train.threads`` to torch, record the number picked in ``cfg`` (a resume reads it
    back) and say what was picked."""
    import torch

    choice = pick_threads(cfg.train.threads)
    if choice.threads:
        torch.set_num_threads(choice.threads)
        cfg.train.threads = choice.threads
    echo(f"torch CPU threads: {torch.get_num_threads()} ({choice.why})")
    return choice
