"""Kill -9 a training run at random moments, resume it each time, and check what it left.

    python tests/campaigns/kill_resume.py --kind vlm --kills 20          # the tiny VLM default
    python tests/campaigns/kill_resume.py --kind diffusion --kills 20    # the tiny generator
    python tests/campaigns/kill_resume.py --kind ddp --kills 20          # 2 processes (torchrun, gloo)

A reference run trains ``--steps`` steps straight. The campaign run trains the same config with a
checkpoint every step: it is started, killed with SIGKILL (its whole process group) after a random
delay (during a step), or, for ``--save-kills`` of the kills, as soon as a checkpoint's temporary
directory appears (during a save), resumed with ``--resume``, and so on
``--kills`` times, then resumed to the end. After every kill it checks that the latest checkpoint
loads (weights and trainer state); at the end, that every step is in ``metrics.jsonl`` exactly
once and that the final weights equal the reference's. Prints one JSON line of figures (the
README's reliability section quotes them). Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMON = ["train.prompts_per_step=4", "rollout.num_generations=4", "eval.num_examples=8", "eval.pass_k=0",
          "log.save_every=1", "log.save_total_limit=2", "log.progress=false", "log.save_rollouts_every=1"]
KINDS = {
    "vlm": (["-m", "mmrl", "train", "vlm"], ["rollout.max_completion_length=24"]),
    "diffusion": (["-m", "mmrl", "train", "diffusion"], ["diffusion.num_steps=6", "diffusion.eval_num_steps=6"]),
    "ddp": (["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mmrl", "train", "vlm"],
            ["rollout.max_completion_length=24"]),
}


def command(kind: str, out: Path, name: str, steps: int, resume: bool) -> list[str]:
    launcher, extra = KINDS[kind]
    args = [sys.executable, *launcher, *COMMON, *extra, f"train.steps={steps}", f"log.output_dir={out}",
            f"log.run_name={name}"]
    return args + (["--resume"] if resume else [])


def run_to_end(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")


def checkpoint_loads(run: Path) -> bool | None:
    """None before the first checkpoint; else whether the latest one loads completely."""
    import torch

    from mmrl.runs.checkpoint import CheckpointManager

    latest = CheckpointManager(run / "checkpoints").latest()
    if latest is None:
        return None
    try:
        torch.load(latest / "trainer.pt", map_location="cpu", weights_only=False)
        final_weights(latest)
        return True
    except Exception as exc:  # the figure is the count of these
        print(f"corrupt checkpoint {latest}: {exc}", file=sys.stderr)
        return False


def final_weights(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted((checkpoint / "policy").rglob("*.safetensors"))
    out = {}
    for f in files:
        out.update({f"{f.parent.name}/{k}": v for k, v in load_file(str(f)).items()})
    if not out:
        raise FileNotFoundError(f"no weights under {checkpoint / 'policy'}")
    return out


def saving(run: Path) -> bool:
    """A checkpoint is being written: its temporary directory exists."""
    return (run / "checkpoints").exists() and any((run / "checkpoints").glob(".tmp-*"))


def wait_for_save(proc: subprocess.Popen, run: Path, limit: float) -> None:
    """Return (by TimeoutExpired) as soon as a save is under way, or after ``limit`` seconds."""
    end = time.time() + limit
    while time.time() < end:
        if proc.poll() is not None:
            return
        if saving(run):
            raise subprocess.TimeoutExpired(proc.args, limit)
        time.sleep(0.0005)
    raise subprocess.TimeoutExpired(proc.args, limit)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=sorted(KINDS), default="vlm")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--min-delay", type=float, default=3.0, help="seconds before a kill, at least")
    ap.add_argument("--max-delay", type=float, default=14.0)
    ap.add_argument("--out", type=Path, default=Path("runs/campaign"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-kills", type=float, default=0.5, help="share of kills aimed at a save in progress")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = a.out / a.kind
    t0 = time.time()
    run_to_end(command(a.kind, out, "reference", a.steps, False))
    reference = final_weights(out / "reference" / "checkpoints" / f"step_{a.steps:08d}")
    run = out / "killed"
    kills, corrupt, during_save, started = 0, 0, 0, False
    while kills < a.kills:
        # --resume only once the run exists (its config.yaml written): a resume of no run is an error
        resumable = started and (run / "config.yaml").exists()
        proc = subprocess.Popen(command(a.kind, out, "killed", a.steps, resumable), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        started = True
        try:
            if rng.random() < a.save_kills:  # this kill waits for a save to begin and lands inside it
                wait_for_save(proc, run, a.max_delay)
            else:
                proc.wait(timeout=rng.uniform(a.min_delay, a.max_delay))
        except subprocess.TimeoutExpired:
            during_save += saving(run)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            ok = checkpoint_loads(run)
            corrupt += ok is False
            continue
        if proc.returncode == 0:  # finished before the kill: start over from scratch to keep killing
            import shutil

            shutil.rmtree(run)
            started = False
    run_to_end(command(a.kind, out, "killed", a.steps, (run / "config.yaml").exists()))
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines if "reward" in r]
    weights = final_weights(run / "checkpoints" / f"step_{a.steps:08d}")
    diff = max(float((weights[k].float() - reference[k].float()).abs().max()) for k in reference)
    print(json.dumps({"kind": a.kind, "kills": kills, "kills_during_a_save": during_save,
                      "corrupt_checkpoints": corrupt, "steps_logged": steps,
                      "every_step_once": steps == list(range(1, a.steps + 1)),
                      "max_weight_difference_from_uninterrupted": diff, "wall_s": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
