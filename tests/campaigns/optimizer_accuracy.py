"""Held-out accuracy of the tiny default under each bf16 ``train.optim`` against float32 master
weights, over seeds: what decides which optimizer a bf16 run should default to (README, "Precision").

    python tests/campaigns/optimizer_accuracy.py --seeds 0,1,2 --out runs/optimizer-accuracy

Each run is the learning case ``grpo`` of ``tests/learning_cases.py`` turned back into the default
recipe's Dr. GRPO (24 steps of 16 prompts, pass@1 and greedy accuracy on 64 held-out scenes) with
``model.dtype=bfloat16``; only ``train.optim`` differs between the settings (``adamw_torch`` = float32
masters with a bf16 forward). Runs go through the learning tests' runner, two at a time at one
thread each; one JSON line per run in ``<out>/runs.jsonl``, then a table of the gains per seed."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: learning_cases, learning_runs

from learning_runs import Job, run_cases  # noqa: E402

OPTIMIZERS = ("adamw_torch", "adamw_bf16", "adamw_kahan", "adamw_bf16_sr")
SETTING = ("algo.advantage=dr_grpo", "model.dtype=bfloat16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--optims", default=",".join(OPTIMIZERS))
    ap.add_argument("--out", type=Path, default=Path("runs/optimizer-accuracy"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "runs.jsonl"
    done = {(r["optim"], r["seed"]): r for r in map(json.loads, log.read_text().splitlines())} if log.exists() else {}
    seeds, optims = [int(s) for s in a.seeds.split(",")], a.optims.split(",")
    jobs = [Job("grpo", seed, extra=(*SETTING, f"train.optim={o}"), tag=o)
            for o in optims for seed in seeds if (o, seed) not in done]

    def record(job: Job, run) -> None:
        if run.error:
            print(f"{job.run_name} failed: {run.error}")
            return
        row = {"optim": job.tag, "seed": job.seed, "before": run.before, "after": run.after, "wall_s": run.wall_s}
        done[(job.tag, job.seed)] = row
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")

    run_cases(jobs, a.out, on_done=record)
    print(f"{'train.optim':<15} {'pass@1 gain per seed':<26} {'mean':>7} {'sd':>6} {'greedy gain per seed':<26} {'mean':>7}")
    for o in optims:
        rows = [done[(o, s)] for s in seeds if (o, s) in done]
        if not rows:
            continue
        p1 = [r["after"]["pass@1"] - r["before"]["pass@1"] for r in rows]
        acc = [r["after"]["accuracy"] - r["before"]["accuracy"] for r in rows]
        sd = statistics.stdev(p1) if len(p1) > 1 else float("nan")
        print(f"{o:<15} {' '.join(f'{g:+.3f}' for g in p1):<26} {statistics.fmean(p1):+7.3f} {sd:6.3f} "
              f"{' '.join(f'{g:+.3f}' for g in acc):<26} {statistics.fmean(acc):+7.3f}")


if __name__ == "__main__":
    main()
