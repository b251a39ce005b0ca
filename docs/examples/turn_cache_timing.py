"""CPU time of a batch of 4-turn zoom trajectories on the tiny zoom model, with the turn cache and
without (``rollout.turn_cache=false``): the figure in docs/thinking-with-images.md.

    python docs/examples/turn_cache_timing.py [repeats]

One torch thread; 8 trajectories (4 examples x 2) of zoom_qa on the shipped tiny zoom model
(assets/tiny-qwen2.5-vl-zoom), a zoom_cell call answered after each of the first three messages
whatever they say (the tiny model seldom calls twice by itself), so every trajectory has 4 turns and
every later prompt a new tool image; greedy, 24 new tokens per message, generation only (no
old/reference log-probs). One warm-up run each, then ``repeats`` runs of each, alternated; prints
each run's process CPU seconds, then median and range.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def main(repeats: int = 3) -> None:
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_config
    from test_turn_cache import OPTIONS, ZOOM, ZoomEveryTurn

    from mmrl import make_task
    from mmrl.core.agent_loop import LoopOptions, run_agent_loop
    from mmrl.vlm.policy import VLMPolicy

    task = make_task("zoom_qa", **OPTIONS)
    specs = [task.examples("eval")[i] for i in range(4)]
    seconds: dict[str, list[float]] = {"true": [], "false": []}
    policies = {flag: VLMPolicy(make_config(f"model.path={ZOOM}", "train.device=cpu", "rollout.temperature=0",
                                            "rollout.max_completion_length=24", f"rollout.turn_cache={flag}"))
                for flag in seconds}
    for repeat in range(repeats + 1):  # the first is a warm-up, not counted
        for flag, policy in policies.items():  # alternated, so a busy spell of the machine hits both
            looks = [ZoomEveryTurn(task, ex) for ex in policy.prepare_examples([e for e in specs for _ in range(2)])]
            for it in looks:
                it.looks = 3
            started = time.process_time()
            rows = run_agent_loop(policy, looks, 2, LoopOptions(max_turns=4), "train")
            if repeat:
                seconds[flag].append(time.process_time() - started)
            assert len(rows) == 32
    for flag, values in seconds.items():
        print(f"turn_cache={flag}: " + " ".join(f"{v:.2f}" for v in values)
              + f" s; median {statistics.median(values):.2f} s, range {min(values):.2f}-{max(values):.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
