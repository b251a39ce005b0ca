"""Measure the learning tests' gains over seeds, so each threshold can sit at twice the spread.

    python tests/campaigns/seed_spread.py --cases default,grpo --seeds 0,1,2 --out runs/seed-spread
    python tests/campaigns/seed_spread.py --cases default --set model.dtype=bfloat16 --out runs/bf16

Runs each case of ``tests/learning_cases.py`` once per seed (``train.seed``: other rollouts, other
sampling for pass@k) through the runner the tests use (``learning_runs.run_cases``: one torch
thread a run, two runs at a time), appends one JSON line per run to ``<out>/runs.jsonl``
(resumable: runs already there are skipped) and prints, per case, the gain of its metric for every
seed, the mean, the standard deviation, twice it, the smallest gain and the test's threshold. Run it
alone on the machine: anything else running slows it (the metrics do not change)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: learning_cases, learning_runs

from learning_cases import CASES  # noqa: E402
from learning_runs import Job, run_cases  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated names from learning_cases.CASES")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=2, help="runs at a time (one torch thread each)")
    ap.add_argument("--out", type=Path, default=Path("runs/seed-spread"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every run (compare settings: one --out per setting)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "runs.jsonl"
    done = {(r["case"], r["seed"]): r for r in map(json.loads, log.read_text().splitlines())} if log.exists() else {}
    names, seeds = a.cases.split(","), [int(s) for s in a.seeds.split(",")]
    jobs = [Job(name, seed, extra=tuple(a.set)) for name in names for seed in seeds if (name, seed) not in done]

    def record(job: Job, run) -> None:
        if run.error:
            print(f"{job.run_name} failed: {run.error}")
            return
        metric = CASES[job.case].metric
        row = {"case": job.case, "seed": job.seed, "metric": metric, "before": run.before[metric],
               "after": run.after[metric], "wall_s": run.wall_s, "before_all": run.before, "after_all": run.after}
        done[(job.case, job.seed)] = row
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")

    run_cases(jobs, a.out, workers=a.workers, on_done=record)
    print(f"{'case':<14} {'metric':<15} {'gains':<30} {'mean':>7} {'sd':>7} {'2 sd':>7} {'min':>7} {'test':>7} {'wall s':>7}")
    for name in names:
        rows = [done[(name, s)] for s in seeds if (name, s) in done]
        if not rows:
            continue
        gains = [r["after"] - r["before"] for r in rows]
        sd = statistics.stdev(gains) if len(gains) > 1 else float("nan")
        print(f"{name:<14} {CASES[name].metric:<15} {' '.join(f'{g:+.3f}' for g in gains):<30} "
              f"{statistics.fmean(gains):+7.3f} {sd:7.3f} {2 * sd:7.3f} {min(gains):+7.3f} {CASES[name].gain:7.3f} "
              f"{statistics.fmean(r['wall_s'] for r in rows):7.0f}")


if __name__ == "__main__":
    main()
