"""One run's lifecycle, the same for every kind of training (``mmrl train``'s RL, ``mmrl sft``):
resume -> evaluate before -> the steps (log, evaluate, save, Ctrl-C) -> save -> evaluate after ->
summary and report, written once.

What a step trains on is the :class:`StepSource`'s: the RL trainer (:mod:`mmrl.core.trainer`)
builds a batch of rollouts and updates the policy with the policy-gradient objective; ``mmrl sft``
(:mod:`mmrl.vlm.sft_run`) takes a batch of reference completions and the likelihood objective. So
a fix to resuming, Ctrl-C or the save cadence is made once, for both.

Exactness: every step reseeds from ``(train.seed, step)`` (:func:`begin_step`) and a source's data
order is a pure function of the step plus the state it checkpoints, so a run resumed from a
checkpoint continues exactly as the uninterrupted run would have. Several processes: every rank
runs the loop, rank 0 alone logs, shows progress and writes checkpoints (every rank's RNG included);
a Ctrl-C on any rank stops every rank after the same step.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

import torch

from ..runs.checkpoint import set_rng_state
from ..runs.config_history import record_start
from ..runs.logging import RunLogger, write_summary
from ..runs.report import report_after_run
from ..runs.resume import finished_steps, open_run, resuming_line
from ..runs.terminal import TrainingProgress
from ..runs.trackers import tracker_names
from . import distributed as dist
from .evaluation import Evaluation
from .interrupt import StopOnInterrupt, TrainingInterrupted
from .policy_checkpoint import RANK_FILE, save_run_checkpoint
from .seeding import seed_everything, stream_seed
from .skip_record import SkipRecord

log = logging.getLogger(__name__)


class NonFiniteTrainingError(RuntimeError):
    """Too many consecutive steps had non-finite gradients (``train.max_consecutive_skipped_steps``)."""


@dataclass
class TrainResult:
    run_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    finished: bool = False  # the run had already trained every step (a resume found nothing to do)


class StepSource(Protocol):
    """What one kind of training does; :class:`RunLifecycle` does everything around it."""

    kind: str  # the command that trains it ("train", "sft"): a checkpoint of another kind is refused
    description: str  # the progress bar's title
    progress_metric: str  # the metric the progress bar shows ("reward", "loss")
    skip_causes: list[str]  # why the last step's optimizer steps were skipped (non-finite gradients)
    splits: dict[str, Sequence]  # the train and eval examples whose skips the run records

    def train_step(self, step: int) -> dict[str, float]:
        """One step (:func:`begin_step` first): its batch, its update(s); the metrics to log."""

    def held_out(self, when: str) -> Evaluation:
        """The held-out evaluation ``"before"`` or ``"after"`` training, or ``"during"`` it (``eval.every``)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps beyond the weights to resume exactly (the data order's state);
        called on every rank: under ``"rank"``, what this rank alone holds (asynchronous training's
        batches generated ahead), saved per rank and given back to the same rank on resume."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def samples(self) -> Optional[list[dict[str, Any]]]:
        """A few of the last step's samples to save (``log.save_rollouts_every``); None: none."""

    def finish(self, before: Evaluation, after: Evaluation) -> dict[str, Any]:
        """After the last evaluation, on every rank: what ``summary.json`` holds besides the
        metrics (the RL table's intervals, SFT's exported model); rank 0 prints its results."""

    def close(self) -> None:
        """The loop ended (finished, stopped or failed): stop what runs beside it (a generator thread)."""


def run_name(cfg) -> str:
    return cfg.log.run_name or f"{cfg.task.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def begin_step(cfg, policy, step: int) -> None:
    """The start of every step: reseed (:func:`seed_step`) and the policy's step (its learning rate)."""
    seed_step(cfg, step)
    policy.begin_step(step)


def seed_step(cfg, step: int) -> None:
    """Reseed the global generators from ``(train.seed, step)`` (rank 0: salt 0), so the step is
    the same whether the run got here in one go or resumed."""
    seed_everything(stream_seed(cfg.train.seed, step, "step", rank_salt=dist.rank_salt()))


class RunLifecycle:
    """The run of ``steps`` (a :class:`StepSource`) with ``policy`` in ``run_dir`` (default
    ``log.output_dir/<run name>``). Built at setup, after ``dist.init``: a resume's config changes and
    an unknown tracker stop the run before anything trains."""

    def __init__(self, cfg, policy, steps: StepSource, run_dir: Path | None = None):
        self.cfg, self.policy, self.steps = cfg, policy, steps
        tracker_names(cfg.log.report_to, cfg.log.tensorboard)  # every rank: a bad name stops them all, not rank 0 alone
        # Rank 0 names the run (a timestamp): every rank must agree on it.
        self.run_dir = Path(dist.broadcast(str(run_dir or Path(cfg.log.output_dir) / run_name(cfg))))
        self.main = dist.is_main()
        self.ckpt = open_run(self.run_dir, cfg, self.main)  # a resume's changes checked, stale .tmp removed
        self.step_done = 0
        if cfg.resume:
            self._latest_state()  # a checkpoint of the other command stops the run at setup

    def _latest_state(self) -> tuple[Optional[Path], dict[str, Any]]:
        """The latest checkpoint and its ``trainer.pt``; one written by another kind of training
        (``mmrl sft``'s resumed by ``mmrl train``, or the reverse) is a ``ValueError``."""
        latest = self.ckpt.latest()
        if latest is None:
            return None, {}
        state = torch.load(latest / "trainer.pt", map_location="cpu", weights_only=False)
        # written since both kinds share this lifecycle; an earlier mmrl sft checkpoint says "sft": True
        kind = state.get("kind") or ("sft" if state.get("sft") else self.steps.kind)
        if kind != self.steps.kind:
            raise ValueError(f"{latest} is a checkpoint of mmrl {kind}, not of mmrl {self.steps.kind}: "
                             f"resume it with mmrl {kind}")
        return latest, state

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, step: int, before: Evaluation) -> None:
        """Every rank takes part (a sharding backend gathers the weights; each rank's RNG state
        is gathered); rank 0 writes into the temp directory and publishes it atomically."""
        own = self.steps.state_dict()  # on every rank: what this rank alone holds is under "rank"
        mine = own.pop("rank", {})
        save_run_checkpoint(self.ckpt, step, self.policy, lambda rngs: {
            "step": step, "kind": self.steps.kind, "rng": rngs[0], "rank_rngs": rngs, "world_size": dist.world_size(),
            "before": before.metrics, "before_intervals": before.intervals, **own,
            **(mine if dist.world_size() == 1 else {})}, rank_state=mine)

    def resume(self) -> tuple[int, Evaluation]:
        """The step of the latest checkpoint and the evaluation before training it recorded. Every
        rank reads the same checkpoint (a shared run directory); each restores its own RNG state
        when the process count is unchanged (the per-step reseeding makes later draws exact either way)."""
        latest, state = self._latest_state()
        if latest is None:
            return 0, Evaluation({})
        self.policy.load(latest / "policy")
        rngs = state.get("rank_rngs") or [state["rng"]]
        if dist.rank() < len(rngs):
            set_rng_state(rngs[dist.rank()])
        own = latest / RANK_FILE.format(dist.rank())  # this rank's own part (a launch of several processes)
        if own.exists():  # the steps' state refuses it if the process count changed
            state = {**state, **torch.load(own, map_location="cpu", weights_only=False)}
        self.steps.load_state_dict(state)
        before = state.get("before") or {}
        if not isinstance(before, dict):  # an earlier mmrl sft checkpoint: its held-out loss alone
            before = {"loss": float(before)}
        return int(state["step"]), Evaluation(dict(before), dict(state.get("before_intervals") or {}))

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Train to ``train.steps``. A first Ctrl-C finishes the step, saves it and raises
        :class:`~mmrl.core.interrupt.TrainingInterrupted`; a second raises it at once."""
        cfg, main, steps = self.cfg, self.main, self.steps
        if cfg.resume and finished_steps(self.run_dir, cfg.train.steps):
            return self._finished()
        self.policy.configure_optimizer(cfg.train, cfg.train.steps)
        if main and dist.world_size() > 1:
            print(f"mmrl: {dist.world_size()} processes, {self.policy.distributed_backend}", flush=True)
        logger = RunLogger(self.run_dir, cfg.log.tensorboard, cfg.log.report_to, config=cfg) if main else None
        skips = SkipRecord(steps.splits)
        log = skips.with_counts(logger.log if main else None)  # + data/<split>/<count> of what was skipped
        start, before = self.resume() if cfg.resume else (0, Evaluation({}))
        if main:
            record_start(self.run_dir, cfg, resumed_from=start)
        if cfg.resume and main:  # what a killed attempt logged after its checkpoint is re-run: drop it
            print(resuming_line(self.run_dir, start, cfg.train.steps), flush=True)
            logger.truncate_after(start if start else -1, final=start == cfg.train.steps)
        self.step_done, stopped = start, False
        try:
            if not start and cfg.eval.before:
                before = steps.held_out("before")
                log(0, {f"eval/{k}": v for k, v in before.metrics.items()})
            skipped_in_a_row = 0
            with TrainingProgress(cfg.train.steps, start_step=start, enabled=cfg.log.progress and main,
                                  description=steps.description, metric=steps.progress_metric) as progress, \
                    StopOnInterrupt(self._announce_stop) as interrupt:
                for step in range(start + 1, cfg.train.steps + 1):
                    t0 = time.perf_counter()
                    metrics = steps.train_step(step)
                    metrics["step_time"] = time.perf_counter() - t0
                    if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps:
                        metrics.update({f"eval/{k}": v for k, v in steps.held_out("during").metrics.items()})
                    if step % max(cfg.log.log_every, 1) == 0 or step == cfg.train.steps:
                        log(step, metrics)
                    # done as soon as it is logged: a second Ctrl-C during the writes below must not
                    # report one step fewer than metrics.jsonl holds
                    self.step_done = step
                    if main and cfg.log.save_rollouts_every and step % cfg.log.save_rollouts_every == 0:
                        records = steps.samples()
                        if records is not None:
                            logger.save_rollouts(step, records)
                    skipped_in_a_row = self._record_skips(step, skipped_in_a_row, before)
                    progress.update(step, step_time=metrics["step_time"],
                                    **{steps.progress_metric: metrics[steps.progress_metric]})
                    saved = bool(cfg.log.save_every) and step % cfg.log.save_every == 0
                    stopped = step < cfg.train.steps and _agreed(interrupt.requested)
                    if (saved or stopped) and step < cfg.train.steps:
                        self.save(step, before)
                    if stopped:
                        break
            if not stopped:
                if start < cfg.train.steps:  # a resumed run that stopped in its final eval has this one
                    self.save(cfg.train.steps, before)
                after = steps.held_out("after")
                log(cfg.train.steps, {f"eval/{k}": v for k, v in after.metrics.items()})
        except KeyboardInterrupt as exc:  # a second Ctrl-C, or one before the loop
            raise TrainingInterrupted(self.run_dir, self.step_done, self.ckpt.latest_step()) from exc
        finally:
            steps.close()
            if logger is not None:
                logger.close()
        if stopped:
            raise TrainingInterrupted(self.run_dir, self.step_done, self.step_done, saved=True)
        extra = steps.finish(before, after)
        if main:
            write_summary(self.run_dir, before=before.metrics, after=after.metrics, steps=cfg.train.steps,
                          data=skips.summary(self.run_dir / "metrics.jsonl"), **extra)
            report_after_run(self.run_dir)  # report.html; a failure is a warning
        return TrainResult(self.run_dir, before.metrics, after.metrics, cfg.train.steps)

    def _announce_stop(self) -> None:
        if self.main:
            last = self.ckpt.latest_step()
            lost = f"the steps after step {last} are then lost" if last else "nothing has been saved yet"
            print(f"\nCtrl-C: finishing step {self.step_done + 1}, then saving a checkpoint and stopping. "
                  f"Press Ctrl-C again to stop at once ({lost}).", file=sys.stderr, flush=True)

    def _finished(self) -> TrainResult:
        """A resumed run that already trained every step: its summary, nothing trained again."""
        summary = json.loads((self.run_dir / "summary.json").read_text(encoding="utf-8"))
        return TrainResult(self.run_dir, summary.get("before") or {}, summary.get("after") or {},
                           self.cfg.train.steps, finished=True)

    def _record_skips(self, step: int, in_a_row: int, before: Evaluation) -> int:
        """Steps whose optimizer update was skipped (a non-finite gradient): each goes to
        ``skipped_steps.jsonl`` with its cause and a warning; after
        ``train.max_consecutive_skipped_steps`` in a row the run saves the last good weights (a
        skipped step changed nothing) and stops. Returns the new count of skips in a row."""
        causes = self.steps.skip_causes  # those of this step's update
        if not causes:
            return 0
        in_a_row += 1
        if self.main:
            with open(self.run_dir / "skipped_steps.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "causes": causes}) + "\n")
            log.warning("step %d: %d update(s) skipped: %s", step, len(causes), causes[0])
        limit = self.cfg.train.max_consecutive_skipped_steps
        if limit and in_a_row >= limit:
            self.save(step, before)
            raise NonFiniteTrainingError(
                f"{in_a_row} steps in a row skipped their update ({causes[0]}, step {step}); the run "
                f"stopped, its last good weights are in {self.ckpt.latest()} (see skipped_steps.jsonl; lower "
                "train.learning_rate, compute in bfloat16 or float32 rather than float16, or check the rewards)")
        return in_a_row


def _agreed(flag: bool) -> bool:
    """Whether any rank's ``flag`` is set: every rank must stop after the same step."""
    return dist.all_max(float(flag)) > 0 if dist.world_size() > 1 else flag
