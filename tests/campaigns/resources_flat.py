"""Does a long run leak? Train the tiny VLM default in this process and record, at every logged
step, the resident memory, the open file descriptors and the child processes.

    python tests/campaigns/resources_flat.py --steps 200

Prints one JSON line: the figures at the first logged step after a warm-up, at the end, and the
largest step-to-step growth over the second half (the README's reliability section quotes them).
Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def resident_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def children() -> int:
    me = str(os.getpid())
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                count += Path(f"/proc/{pid}/stat").read_text().split()[3] == me
            except OSError:
                pass
    return count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("runs/campaign"))
    a = ap.parse_args()
    import mmrl
    from mmrl.runs.logging import RunLogger

    samples: list[dict] = []
    log = RunLogger.log

    def recording_log(self, step, metrics):
        log(self, step, metrics)
        if "reward" in metrics:
            samples.append({"step": step, "rss_mib": resident_mib(), "fds": open_files(), "children": children()})

    RunLogger.log = recording_log
    t0 = time.time()
    mmrl.train("vlm/counting_tiny", [f"train.steps={a.steps}", "train.prompts_per_step=8", "eval.num_examples=16", "eval.pass_k=0",
                                     f"log.output_dir={a.out}", "log.run_name=resources", "log.progress=false",
                                     "log.save_every=25", "log.save_rollouts_every=25"])
    after = [s for s in samples if s["step"] > a.warmup]
    half = after[len(after) // 2:]
    print(json.dumps({"steps": a.steps, "at_warmup_end": after[0], "at_end": after[-1],
                      "rss_growth_second_half_mib": round(half[-1]["rss_mib"] - half[0]["rss_mib"], 1),
                      "max_fds": max(s["fds"] for s in after), "min_fds": min(s["fds"] for s in after),
                      "max_children": max(s["children"] for s in after), "wall_s": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
