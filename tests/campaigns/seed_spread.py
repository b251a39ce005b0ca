"""Measure the learning tests' gains over seeds, so each threshold can sit at twice the spread.

    python tests/campaigns/seed_spread.py --cases default,grpo --seeds 0,1,2 --out runs/seed-spread

Runs each case of ``tests/learning_cases.py`` once per seed (``train.seed``: other rollouts, other
sampling for pass@k), appends one JSON line per run to ``<out>/runs.jsonl`` (resumable: runs already
there are skipped) and prints, per case, the gain of its metric for every seed, the mean, the
standard deviation, twice it, the smallest gain and the test's threshold. Run it alone on the
machine: two trainings at once slow each other several times (the metrics do not change)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: learning_cases, learning_runs

from learning_cases import CASES  # noqa: E402
from learning_runs import train_quietly  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated names from learning_cases.CASES")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=Path("runs/seed-spread"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "runs.jsonl"
    done = {(r["case"], r["seed"]): r for r in map(json.loads, log.read_text().splitlines())} if log.exists() else {}
    seeds = [int(s) for s in a.seeds.split(",")]
    for name in a.cases.split(","):
        case = CASES[name]
        for seed in seeds:
            if (name, seed) in done:
                continue
            t0 = time.time()
            result = train_quietly(case.recipe, a.out, f"{name}-seed{seed}", *case.overrides, f"train.seed={seed}",
                                   "log.save_rollouts_every=0")
            row = {"case": name, "seed": seed, "metric": case.metric, "before": result.before[case.metric],
                   "after": result.after[case.metric], "wall_s": round(time.time() - t0, 1),
                   "before_all": result.before, "after_all": result.after}
            done[(name, seed)] = row
            with open(log, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(f"{'case':<14} {'metric':<15} {'gains':<30} {'mean':>7} {'sd':>7} {'2 sd':>7} {'min':>7} {'test':>7}")
    for name in a.cases.split(","):
        gains = [done[(name, s)]["after"] - done[(name, s)]["before"] for s in seeds if (name, s) in done]
        if not gains:
            continue
        sd = statistics.stdev(gains) if len(gains) > 1 else float("nan")
        print(f"{name:<14} {CASES[name].metric:<15} {' '.join(f'{g:+.3f}' for g in gains):<30} "
              f"{statistics.fmean(gains):+7.3f} {sd:7.3f} {2 * sd:7.3f} {min(gains):+7.3f} {CASES[name].gain:7.3f}")


if __name__ == "__main__":
    main()
