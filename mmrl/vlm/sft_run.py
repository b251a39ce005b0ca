"""``mmrl sft``: supervised fine-tuning on a task's reference completions, in RL's run lifecycle.

The warm start of the R1-style recipes (SFT, then RL from its weights) as a command of its own::

    mmrl sft vlm/counting_tiny log.run_name=warm            # writes runs/warm/model
    mmrl train vlm vlm/counting_tiny model.path=runs/warm/model

SFT is not a second training loop: :class:`SFTRun` is a step source of
:class:`~mmrl.core.lifecycle.RunLifecycle`, the loop ``mmrl train`` runs (resume, evaluation before
and after, Ctrl-C, the save cadence, ``metrics.jsonl``, ``summary.json``, ``report.html``). A step
is a batch of reference completions and the likelihood objective
(:meth:`~mmrl.core.losses.ObjectiveConfig.reference_likelihood`) through the policy's own
optimizer step. It lives beside the VLM policy because its batch is VLM data
(:func:`mmrl.vlm.sft.sft_batch`).

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
eval split) is logged before and after training (and every ``eval.every`` steps). Checkpoints,
``metrics.jsonl``, ``config.yaml`` and resuming (``resume=true log.run_name=NAME``) are the RL
run's; at the end ``<run>/model`` holds the trained weights (LoRA merged) in the layout
``from_pretrained`` and ``model.path`` read.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ..core import distributed as dist
from ..core.evaluation import Evaluation
from ..core.lifecycle import RunLifecycle, begin_step
from ..core.losses import Objective, ObjectiveConfig
from ..core.rollouts import Rollouts
from ..core.seeding import stream_seed
from ..core.trainer import build_task
from ..registry import POLICIES
from .sft import sft_batch, sft_split


@dataclass
class SFTResult:
    run_dir: Path
    model_dir: Path  # the trained weights as a model.path
    before: float | None  # held-out loss of the starting model (None: eval.before=false)
    after: float | None
    steps: int


def sft_config(recipe: str | Path | None, overrides: Sequence[str] = ()):
    """The config of an SFT run: the recipe (path or built-in name; None: the tiny VLM default)
    with ``overrides``, the loss read at temperature 1 (``rollout.temperature=1``) and no KL term
    (``algo.beta=0``: no frozen reference copy of the model is made)."""
    from ..config import builtin_config_path, load_config

    cfg = load_config(builtin_config_path(str(recipe or "vlm/counting_tiny")), list(overrides))
    return load_config(None, ["rollout.temperature=1.0", "algo.beta=0.0"], base=cfg)


def sft(config: str | Path | None = None, overrides: Sequence[str] = ()) -> SFTResult:
    """Supervised fine-tuning (module docstring) of a recipe with dotted ``overrides``."""
    return SFTRun(sft_config(config, overrides)).run()


class SFTRun:
    """One SFT run of ``cfg`` (module docstring), the :class:`~mmrl.core.lifecycle.StepSource` of
    ``mmrl sft``: ``run()`` trains, evaluates and exports."""

    kind = "sft"
    progress_metric = "loss"

    def __init__(self, cfg, task=None, policy=None):
        dist.init(cfg.train.device, cfg.train.distributed_timeout)
        self.cfg = cfg
        self.task = task or build_task(cfg)
        if self.task.modality != "vlm":
            raise ValueError(f"mmrl sft trains vision-language policies; task {self.task.name!r} is a "
                             f"{self.task.modality} task")
        if cfg.resume and not cfg.log.run_name:
            raise ValueError("resume=true: say which run to continue with log.run_name=NAME")
        self.description = f"mmrl sft {self.task.name}"
        self.policy = policy or POLICIES.get("vlm").for_task(cfg, self.task)  # mmrl.api.make_policy's for this task
        self.train_examples = sft_split(self.task, "train")
        self.eval_examples = sft_split(self.task, "eval")
        self.splits = {"train": self.train_examples, "eval": self.eval_examples}
        self.sampler = sft_sampler(cfg, self.task.source_sizes(self.train_examples))
        self.objective = Objective(ObjectiveConfig.reference_likelihood())
        self.skip_causes: list[str] = []
        self.lifecycle = RunLifecycle(cfg, self.policy, self)  # as RL's: a resume checked, stale .tmp removed
        self.run_dir, self.main = self.lifecycle.run_dir, self.lifecycle.main

    def run(self) -> SFTResult:
        """Train (the run lifecycle: resume, Ctrl-C), export ``<run>/model``; the held-out losses."""
        result = self.lifecycle.train()
        return SFTResult(self.run_dir, self.run_dir / "model", result.before.get("loss"), result.after.get("loss"),
                         result.steps)

    # -- batches and losses -------------------------------------------------------------------------
    def batch(self, examples: Sequence[dict], drop: Sequence[bool] | None = None):
        """This rank's share of ``examples`` as an SFT batch (:func:`mmrl.vlm.sft.sft_batch`);
        ``drop[i]``: example i without its reasoning block."""
        mine = [i for i in range(len(examples)) if i % dist.world_size() == dist.rank()]
        drop = [bool(drop[i]) for i in mine] if drop is not None else None
        batch = sft_batch(self.policy, [self.task], [(0, examples[i]) for i in mine], drop) if mine else None
        if batch is not None:
            batch.advantages = torch.zeros(len(batch))  # read, never used, by the policy's loss terms
        return batch

    def train_step(self, step: int) -> dict[str, float]:
        """One SFT step: the step's examples, one optimizer step per mini-batch."""
        begin_step(self.cfg, self.policy, step)  # the seeds and the learning rate of this step
        picks = self.sampler.indices(step - 1)
        rate = float(self.cfg.data.thought_dropout)
        dropout = random.Random(stream_seed(self.cfg.train.seed, step, "thought_dropout"))
        drop = [rate > 0 and dropout.random() < rate for _ in picks]
        mini = self.cfg.train.mini_batch_size or len(picks)
        sums: dict[str, float] = {}
        chunks = [range(c, min(c + mini, len(picks))) for c in range(0, len(picks), mini)]
        total_tokens = 0.0
        self.skip_causes = []
        for chunk in chunks:
            batch = self.batch([self.train_examples[picks[j]] for j in chunk], [drop[j] for j in chunk])
            tokens = dist.all_sum(float(batch.action_mask.sum()) if batch is not None else 0.0)
            out = self.policy.train_step(batch if batch is not None else _empty(), self.objective,
                                         num_tokens=tokens, num_seqs=float(len(chunk)))
            if out.get("skipped_update"):
                self.skip_causes.append(self.policy.last_skip_cause)
            total_tokens += tokens
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + v
        return {**{k: v / len(chunks) for k, v in sums.items()}, "tokens": total_tokens}

    @torch.no_grad()
    def held_out_loss(self) -> float:
        """The mean token NLL of the first ``eval.num_examples`` eval examples' references."""
        n = self.num_held_out
        width = max(self.cfg.train.prompts_per_step, 1)
        nll, tokens = 0.0, 0.0
        for start in range(0, n, width):
            batch = self.batch([self.eval_examples[i] for i in range(start, min(start + width, n))])
            if batch is not None:
                logps = self.policy.score(batch, reference=False)
                nll -= float((logps * batch.action_mask).sum())
                tokens += float(batch.action_mask.sum())
        return dist.all_sum(nll) / max(dist.all_sum(tokens), 1.0)

    @property
    def num_held_out(self) -> int:
        return min(self.cfg.eval.num_examples, len(self.eval_examples))

    # -- the rest of the step source (mmrl.core.lifecycle.StepSource) --------------------------------
    def held_out(self, when: str) -> Evaluation:
        return Evaluation({"loss": self.held_out_loss()}, num_scored=self.num_held_out)

    def state_dict(self) -> dict[str, Any]:
        return {"sampler_state": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state.get("sampler_state") or {})

    def samples(self) -> None:
        return None  # the references are the task's: nothing sampled to show

    def close(self) -> None:
        """Nothing runs beside SFT's loop."""

    def finish(self, before: Evaluation, after: Evaluation) -> dict[str, Any]:
        """The trained weights as ``<run>/model`` (:meth:`export`), named in summary.json."""
        return {"model": str(self.export())}

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


def sft_sampler(cfg, sizes: dict[str, int]):
    """RL's prompt sampler of ``data.sampler`` over the train split's sources; a sampler that
    learns from rollouts' rewards (``variance``, ``dump``) has nothing to learn from here."""
    from ..config import ConfigError
    from ..core.batch.prompts import PromptSampler, make_sampler

    sampler = make_sampler(cfg.data.sampler, sizes, cfg.train.prompts_per_step, cfg.train.seed,
                           **dict(cfg.data.sampler_kwargs))
    if type(sampler).observe is not PromptSampler.observe:
        raise ConfigError(f"data.sampler={cfg.data.sampler} chooses prompts by their rollouts' rewards, which "
                          "mmrl sft does not make: use data.sampler=uniform or weighted")
    return sampler


def _empty() -> Rollouts:
    """An empty batch: a rank with no example of a mini-batch still joins its gradient average."""
    return Rollouts(group_ids=torch.zeros(0, dtype=torch.long), action_mask=torch.zeros(0, 1),
                    advantages=torch.zeros(0))
