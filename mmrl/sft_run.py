"""``mmrl sft``: supervised fine-tuning on a task's reference completions, with RL's machinery.

The warm start of the R1-style recipes (SFT, then RL from its weights) as a command of its own::

    mmrl sft vlm/counting_tiny log.run_name=warm            # writes runs/warm/model
    mmrl train vlm vlm/counting_tiny model.path=runs/warm/model

It reads the same config as ``mmrl train`` and builds the same policy (``model.path``,
``model.lora``, precision, ``train.padding_free`` packing, DDP/FSDP2 launches), optimizer and
schedule (``train.optim``, ``train.learning_rate``, ``train.lr_scheduler_type``,
``train.warmup_steps``, counted in SFT steps). Each of ``train.steps`` steps takes
``train.prompts_per_step`` examples of the task's train split, drawn by RL's prompt sampler
(``data.sampler``: ``uniform``, seeded epoch permutations, every example once per epoch; or
``weighted``, a mixture's sources by ``data.sampler_kwargs.weights``), in mini-batches of
``train.mini_batch_size`` (0: one optimizer step per step), ``train.micro_batch_size`` samples per
forward. The examples' completions are the task's reference answers
(:func:`mmrl.vlm.sft.sft_target`: ``task.target(ex)``, or the record's own ``messages``/``solution``
for a task without one); ``data.thought_dropout`` of them lose their ``<think>`` block.

The loss is the mean negative log-likelihood of the completion tokens (the assistant's answer and
its EOS; the prompt is context, never in the action mask), at temperature 1:

    L = - sum_{i, t} m_it log p(y_it | prompt_i, y_i<t) / sum_{i, t} m_it

Held-out loss (``eval/loss``, the same mean over the first ``eval.num_examples`` examples of the
eval split) is logged before and after training and printed. Checkpoints, ``metrics.jsonl``,
``config.yaml`` and resuming (``resume=true log.run_name=NAME``) are the RL run's; at the end
``<run>/model`` holds the trained weights (LoRA merged) in the layout ``from_pretrained`` and
``model.path`` read.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .core import distributed as dist
from .core.losses import ObjectiveConfig
from .core.policy_checkpoint import save_run_checkpoint
from .core.seeding import stream_seed
from .runs.checkpoint import set_rng_state


@dataclass
class SFTResult:
    run_dir: Path
    model_dir: Path  # the trained weights as a model.path
    before: float | None  # held-out loss of the starting model (None: eval.before=false)
    after: float | None
    steps: int


class NLLObjective:
    """The SFT loss in the place of the core objective (``policy.train_step`` calls it per
    micro-batch): the masked token NLL over the mini-batch's token count ``num_tokens``, so the
    micro-batches' losses sum to the mini-batch's mean. ``cfg`` is the core's defaults (no
    entropy, no token selection), which is what the policy reads of it."""

    def __init__(self):
        self.cfg = ObjectiveConfig()

    def __call__(self, logps: torch.Tensor, old_logps, advantages, mask: torch.Tensor, ref_logps=None,
                 rollout_logps=None, num_tokens: float = 0.0, num_seqs: float = 0.0):
        loss = -(logps * mask).sum() / max(float(num_tokens), 1.0)
        return loss, {"loss": float(loss.detach())}


def sft_config(recipe: str | Path | None, overrides: Sequence[str] = ()):
    """The config of an SFT run: the recipe (path or built-in name; None: the tiny VLM default)
    with ``overrides``, the loss read at temperature 1 (``rollout.temperature=1``) and no KL term
    (``algo.beta=0``: no frozen reference copy of the model is made)."""
    from .config import builtin_config_path, load_config

    cfg = load_config(builtin_config_path(str(recipe or "vlm/counting_tiny")), list(overrides))
    return load_config(None, ["rollout.temperature=1.0", "algo.beta=0.0"], base=cfg)


def sft(config: str | Path | None = None, overrides: Sequence[str] = ()) -> SFTResult:
    """Supervised fine-tuning (module docstring) of a recipe with dotted ``overrides``."""
    return SFTRun(sft_config(config, overrides)).run()


class SFTRun:
    """One SFT run of ``cfg`` (module docstring): ``run()`` trains, evaluates and exports."""

    def __init__(self, cfg, task=None, policy=None):
        from .api import make_policy
        from .core.trainer import build_task, run_name
        from .runs.resume import open_run
        from .vlm.sft import sft_split

        dist.init(cfg.train.device, cfg.train.distributed_timeout)
        self.cfg = cfg
        self.task = task or build_task(cfg)
        if self.task.modality != "vlm":
            raise ValueError(f"mmrl sft trains vision-language policies; task {self.task.name!r} is a "
                             f"{self.task.modality} task")
        if cfg.resume and not cfg.log.run_name:
            raise ValueError("resume=true: say which run to continue with log.run_name=NAME")
        self.policy = policy or make_policy(cfg, self.task)
        self.train_examples = sft_split(self.task, "train")
        self.eval_examples = sft_split(self.task, "eval")
        self.sampler = sft_sampler(cfg, self.task.source_sizes(self.train_examples))
        self.run_dir = Path(dist.broadcast(str(Path(cfg.log.output_dir) / run_name(cfg))))
        self.main = dist.is_main()
        self.ckpt = open_run(self.run_dir, cfg, self.main)  # as RL's: a resume checked, stale .tmp removed

    # -- batches and losses -------------------------------------------------------------------------
    def batch(self, examples: Sequence[dict], drop: Sequence[bool] | None = None):
        """This rank's share of ``examples`` as an SFT batch (:func:`mmrl.vlm.sft.sft_batch`);
        ``drop[i]``: example i without its reasoning block."""
        from .vlm.sft import sft_batch

        mine = [i for i in range(len(examples)) if i % dist.world_size() == dist.rank()]
        drop = [bool(drop[i]) for i in mine] if drop is not None else None
        batch = sft_batch(self.policy, [self.task], [(0, examples[i]) for i in mine], drop) if mine else None
        if batch is not None:
            batch.advantages = torch.zeros(len(batch))  # read, never used, by the policy's loss terms
        return batch

    def train_step(self, step: int) -> dict[str, float]:
        """One SFT step: the step's examples, one optimizer step per mini-batch."""
        from .core.seeding import seed_everything

        seed_everything(stream_seed(self.cfg.train.seed, step, "step", rank_salt=dist.rank_salt()))
        self.policy.begin_step(step)  # the learning rate of this step
        picks = self.sampler.indices(step - 1)
        rate = float(self.cfg.data.thought_dropout)
        dropout = random.Random(stream_seed(self.cfg.train.seed, step, "thought_dropout"))
        drop = [rate > 0 and dropout.random() < rate for _ in picks]
        mini = self.cfg.train.mini_batch_size or len(picks)
        sums: dict[str, float] = {}
        chunks = [range(c, min(c + mini, len(picks))) for c in range(0, len(picks), mini)]
        total_tokens = 0.0
        for chunk in chunks:
            batch = self.batch([self.train_examples[picks[j]] for j in chunk], [drop[j] for j in chunk])
            tokens = dist.all_sum(float(batch.action_mask.sum()) if batch is not None else 0.0)
            out = self.policy.train_step(batch if batch is not None else _empty(), NLLObjective(),
                                         num_tokens=tokens, num_seqs=float(len(chunk)))
            total_tokens += tokens
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + v
        return {**{k: v / len(chunks) for k, v in sums.items()}, "tokens": total_tokens}

    @torch.no_grad()
    def held_out_loss(self) -> float:
        """The mean token NLL of the first ``eval.num_examples`` eval examples' references."""
        n = min(self.cfg.eval.num_examples, len(self.eval_examples))
        width = max(self.cfg.train.prompts_per_step, 1)
        nll, tokens = 0.0, 0.0
        for start in range(0, n, width):
            batch = self.batch([self.eval_examples[i] for i in range(start, min(start + width, n))])
            if batch is not None:
                logps = self.policy.score(batch, reference=False)
                nll -= float((logps * batch.action_mask).sum())
                tokens += float(batch.action_mask.sum())
        return dist.all_sum(nll) / max(dist.all_sum(tokens), 1.0)

    # -- checkpoints ----------------------------------------------------------------------------------
    def save(self, step: int, before: float | None) -> None:
        """As the RL trainer saves: every rank takes part, rank 0 publishes atomically."""
        save_run_checkpoint(self.ckpt, step, self.policy,
                            lambda rngs: {"step": step, "rank_rngs": rngs, "before": before, "sft": True,
                                          "sampler_state": self.sampler.state_dict()})

    def resume(self) -> tuple[int, float | None]:
        latest = self.ckpt.latest()
        if latest is None:
            return 0, None
        state = torch.load(latest / "trainer.pt", map_location="cpu", weights_only=False)
        if not state.get("sft"):
            raise ValueError(f"{latest} is a checkpoint of an RL run, not of mmrl sft: resume it with mmrl train")
        self.policy.load(latest / "policy")
        self.sampler.load_state_dict(state.get("sampler_state") or {})
        if dist.rank() < len(state["rank_rngs"]):
            set_rng_state(state["rank_rngs"][dist.rank()])
        return int(state["step"]), state.get("before")

    def export(self) -> Path:
        """``<run>/model``, written beside it first and renamed (a killed export leaves no half model)."""
        out = self.run_dir / "model"
        if self.main:
            staging = self.run_dir / "model.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            self.policy.export_pretrained(staging)
            shutil.rmtree(out, ignore_errors=True)
            staging.rename(out)
        dist.barrier()
        return out

    # -- the loop -------------------------------------------------------------------------------------
    def _announce(self) -> None:
        if self.main:
            print("\nCtrl-C: finishing this step, then saving a checkpoint and stopping. Press Ctrl-C again to "
                  "stop at once.", file=sys.stderr, flush=True)

    def run(self) -> SFTResult:
        from .core.interrupt import StopOnInterrupt, TrainingInterrupted
        from .runs.config_history import record_start
        from .runs.logging import RunLogger, write_summary
        from .runs.resume import resuming_line
        from .runs.terminal import TrainingProgress

        cfg, main = self.cfg, self.main
        self.policy.configure_optimizer(cfg.train, cfg.train.steps)
        logger = RunLogger(self.run_dir, tensorboard=cfg.log.tensorboard) if main else None
        log = logger.log if main else (lambda step, metrics: None)
        start, before = self.resume() if cfg.resume else (0, None)
        if main:
            record_start(self.run_dir, cfg, resumed_from=start)
            if cfg.resume:
                print(resuming_line(self.run_dir, start, cfg.train.steps), flush=True)
                logger.truncate_after(start if start else -1, final=start == cfg.train.steps)
        stopped, done = False, start
        try:
            if not start and cfg.eval.before:
                before = self.held_out_loss()
                log(0, {"eval/loss": before})
            with TrainingProgress(cfg.train.steps, start_step=start, enabled=cfg.log.progress and main,
                                  description=f"mmrl sft {self.task.name}", metric="loss") as progress, \
                    StopOnInterrupt(self._announce) as interrupt:
                for step in range(start + 1, cfg.train.steps + 1):
                    t0 = time.perf_counter()
                    metrics = self.train_step(step)
                    metrics["step_time"] = time.perf_counter() - t0
                    if step % max(cfg.log.log_every, 1) == 0 or step == cfg.train.steps:
                        log(step, metrics)
                    done = step  # as soon as it is logged (a second Ctrl-C may land in the bar's update)
                    progress.update(step, loss=metrics["loss"], step_time=metrics["step_time"])
                    stopped = step < cfg.train.steps and dist.all_max(float(interrupt.requested)) > 0
                    if step < cfg.train.steps and (stopped or (cfg.log.save_every and step % cfg.log.save_every == 0)):
                        self.save(step, before)
                    if stopped:
                        break
            if not stopped:
                if start < cfg.train.steps:
                    self.save(cfg.train.steps, before)
                after = self.held_out_loss()
                log(cfg.train.steps, {"eval/loss": after})
        except KeyboardInterrupt as exc:
            raise TrainingInterrupted(self.run_dir, done, self.ckpt.latest_step()) from exc
        finally:
            if logger is not None:
                logger.close()
        if stopped:
            raise TrainingInterrupted(self.run_dir, done, done, saved=True)
        model_dir = self.export()
        if main:
            write_summary(self.run_dir, before={"loss": before} if before is not None else {}, after={"loss": after},
                          steps=cfg.train.steps, model=str(model_dir))
            from .runs.report import report_after_run

            report_after_run(self.run_dir)  # report.html, as an RL run writes: the loss curves; a failure warns
        return SFTResult(self.run_dir, model_dir, before, after, cfg.train.steps)


def command(args: Sequence[str]) -> None:
    """The body of ``mmrl sft [RECIPE] [key=value ...]`` (mmrl/cli.py): train, print the held-out
    loss before -> after, where the model is and the RL command that starts from it."""
    import shlex

    import typer

    from .cli_errors import console, user_errors
    from .core.interrupt import TrainingInterrupted
    from .recipes import split_args
    from .runs.disk import check_writable
    from .threads import configure_threads

    args = list(args)

    def again(run_dir: Path) -> str:  # the command that continues the run
        return shlex.join(["mmrl", "sft", *[a for a in args if not a.startswith(("resume=", "log.run_name="))],
                           "resume=true", f"log.run_name={run_dir.name}"])

    with user_errors():
        recipe, overrides = split_args(args)
        cfg = sft_config(recipe, overrides)
        configure_threads(cfg, echo=lambda line: console.print(line, highlight=False))
        check_writable(Path(cfg.log.output_dir) / (cfg.log.run_name or ""))  # before the model loads
        run = SFTRun(cfg)
    if run.main:
        console.print(f"run directory: [bold]{run.run_dir}[/]")
    try:
        with user_errors(setup=False, resume=again(run.run_dir)):
            result = run.run()
    except TrainingInterrupted as exc:
        state = "checkpoint saved" if exc.saved else f"last checkpoint: step {exc.checkpoint_step or 'none'}"
        console.print(f"[yellow]stopped after step {exc.step} ({state}); continue with: {again(exc.run_dir)}[/]",
                      highlight=False)
        raise typer.Exit(130)
    if run.main:
        before = "-" if result.before is None else f"{result.before:.4f}"
        print(f"held-out loss ({run.task.name}, {min(cfg.eval.num_examples, len(run.eval_examples))} examples): "
              f"{before} -> {result.after:.4f}")
        print(f"model: {result.model_dir}")
        print(" ".join(["RL from it: mmrl train", run.task.modality, *([recipe] if recipe else []),
                        f"model.path={result.model_dir}"]))


def sft_sampler(cfg, sizes: dict[str, int]):
    """RL's prompt sampler of ``data.sampler`` over the train split's sources; a sampler that
    learns from rollouts' rewards (``variance``, ``dump``) has nothing to learn from here."""
    from .config import ConfigError
    from .core.batch.prompts import PromptSampler, make_sampler

    sampler = make_sampler(cfg.data.sampler, sizes, cfg.train.prompts_per_step, cfg.train.seed,
                           **dict(cfg.data.sampler_kwargs))
    if type(sampler).observe is not PromptSampler.observe:
        raise ConfigError(f"data.sampler={cfg.data.sampler} chooses prompts by their rollouts' rewards, which "
                          "mmrl sft does not make: use data.sampler=uniform or weighted")
    return sampler


def _empty():
    """An empty batch: a rank with no example of a mini-batch still joins its gradient average."""
    from .core.rollouts import Rollouts

    return Rollouts(group_ids=torch.zeros(0, dtype=torch.long), action_mask=torch.zeros(0, 1),
                    advantages=torch.zeros(0))
