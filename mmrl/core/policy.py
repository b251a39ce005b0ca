"""The modality-free half of a policy: the optimizer step around the modality's loss terms.

:class:`PolicyBase` implements :class:`~mmrl.core.protocol.Policy` except sampling. One RL
update's optimizer step reads top to bottom in :meth:`PolicyBase.train_step`: loss terms
(micro-batches, denoising steps) each backward, gradients complete, a non-finite gradient skips
the step, else clip and step, gradients freed (they must not live through the next rollout). The
rest lives with its concern:

- precision, master or bf16 weights: :mod:`.precision`; the optimizer (``train.optim``) and
  schedule: :mod:`.optimizer`;
- the launch (one process, DDP, FSDP2, DeepSpeed ZeRO): a strategy object of :mod:`.strategy`, chosen when the
  optimizer is configured, so nothing here branches on it;
- the reference model and its ProRL reset: :mod:`.reference`;
- checkpoints: :mod:`.policy_checkpoint`; out-of-memory back-off: :mod:`.oom`.

A modality policy sets ``self.module`` (the trained network) in ``__init__`` and calls
:meth:`finish_setup` at its end; it supplies ``rollout``, ``loss_terms``, ``save_weights`` /
``load_weights`` and, with LoRA, ``adapters_disabled``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from mmrl.registry import LOSSES

from . import distributed as dist
from .activation_checkpointing import checkpoint_options
from .oom import OOMBackoff, is_out_of_memory
from .optimizer import make_optimizer, step_schedule
from .policy_checkpoint import load_policy, save_policy
from .precision import autocast, compute_dtype, keep_trained_weights, trained_dtype
from .protocol import CAPABILITIES
from .reference import ReferenceModel
from .rollouts import Rollouts
from .strategy import SingleProcess, strategy_for


class PolicyBase:
    """The modality-free half of a policy (module docstring)."""

    capabilities: frozenset[str] = frozenset()
    # What this policy can compute for a loss (a loss's ``register_loss(requires=...)``).
    loss_inputs: frozenset[str] = frozenset({"logps"})
    unused_config: tuple[str, ...] = ()  # see Policy.unused_config
    last_skip_cause: str | None = None  # see Policy.last_skip_cause

    module: torch.nn.Module

    def __init__(self, cfg, device: torch.device | None = None):
        self.cfg = cfg
        self.device = device or dist.policy_device(cfg)
        self.compute_dtype = compute_dtype(cfg.model.dtype)
        # float32 master weights, or bf16 for an optimizer that keeps bf16 weights (train.optim)
        self.trained_dtype = trained_dtype(cfg.train.optim, self.compute_dtype)
        self.lora = bool(cfg.model.lora.enabled)
        self.reference_model: ReferenceModel | None = None
        self.optimizer = None
        self.scheduler = None
        self.strategy = SingleProcess()  # the launch's, from configure_optimizer on
        # Samples per forward: train.micro_batch_size, halved when a step runs out of memory.
        self.micro_batch_backoff = OOMBackoff("samples per forward", cfg.train.oom_grow_back_steps)
        if unknown := set(self.capabilities) - set(CAPABILITIES):
            raise ValueError(f"{type(self).__name__} declares unknown capabilities {sorted(unknown)}")
        if cfg.train.use_liger_loss and "fused_loss" not in self.capabilities:
            raise ValueError(f"train.use_liger_loss=true: {type(self).__name__} has no fused loss; set it false")
        missing = set(LOSSES.get(cfg.algo.loss_type).loss_requires) - set(self.loss_inputs)
        if missing:
            raise ValueError(f"algo.loss_type={cfg.algo.loss_type!r} needs {sorted(missing)}, which a "
                             f"{type(self).__name__} does not compute; valid losses here: "
                             f"{', '.join(self.valid_losses())}")
        if self.lora and cfg.algo.ref_reset_every:
            raise ValueError("algo.ref_reset_every (ProRL reference reset) is not supported with LoRA "
                             "(the reference is the base model); use full fine-tuning or set it to 0")

    @classmethod
    def for_task(cls, cfg, task) -> PolicyBase:
        """The policy that trains ``task`` (``mmrl.api.make_policy`` calls this on the class
        registered for the task's modality); a subclass may first warn of a mismatch."""
        return cls(cfg)

    @classmethod
    def valid_losses(cls) -> list[str]:
        return [n for n in LOSSES.names() if set(LOSSES.get(n).loss_requires) <= set(cls.loss_inputs)]

    # -- set-up -------------------------------------------------------------------------------
    def finish_setup(self) -> None:
        """After the subclass built ``self.module`` (LoRA applied, frozen parts frozen): trainable
        parameters to :attr:`trained_dtype` (float32 master weights unless ``train.optim`` keeps
        bf16 weights), ``train.gradient_checkpointing``, and the reference of the KL term (a frozen
        copy in the compute dtype when ``algo.beta > 0`` without LoRA; with LoRA the base model)."""
        keep_trained_weights(self.trainable_parameters(), self.trained_dtype)
        if self.cfg.train.gradient_checkpointing:
            self.enable_gradient_checkpointing(checkpoint_options(self.cfg.train.gradient_checkpointing_kwargs))
        self.reference_model = ReferenceModel(
            self.module, self.compute_dtype, needs_copy=self.cfg.algo.beta > 0 and not self.lora,
            adapters_disabled=self.adapters_disabled if self.lora else None)

    def enable_gradient_checkpointing(self, options: dict[str, Any]) -> None:
        """Checkpoint the trained network's layers through its library, with these
        ``torch.utils.checkpoint`` options (:mod:`.activation_checkpointing`; subclass)."""
        raise ValueError(f"train.gradient_checkpointing=true: {type(self).__name__} cannot checkpoint; set it false")

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    @property
    def mixed_precision(self) -> bool:
        return self.compute_dtype != torch.float32

    def autocast(self):
        """The forward-pass context: autocast to the compute dtype (a no-op in float32)."""
        return autocast(self.device, self.compute_dtype)

    def configure_optimizer(self, train_cfg, total_steps: int) -> None:
        """The optimizer of ``train.optim`` + scheduler; the module and optimizer prepared for the
        launch's strategy. The scheduler stays ours: accelerate's would step once per process per
        optimizer step."""
        optimizer, self.scheduler = make_optimizer(self.trainable_parameters(), train_cfg, total_steps)
        strategy = strategy_for(self.strategy)
        strategy.check(self)
        self.optimizer = strategy.prepare(self.module, optimizer)
        self.strategy = strategy

    @property
    def distributed_backend(self) -> str:
        return self.strategy.backend

    def check_shardable(self, backend: str) -> None:
        """Stop at setup when something of this run cannot train with its weights, gradients or
        optimizer state spread over the ranks yet; ``backend`` ("FSDP2", "DeepSpeed ZeRO-2", ...)
        is named in the refusal."""

    # -- the reference model ------------------------------------------------------------------
    @property
    def ref_module(self) -> torch.nn.Module | None:
        """The frozen reference copy (None with LoRA or without a KL term)."""
        return self.reference_model.copy if self.reference_model is not None else None

    def reference(self):
        """A context yielding the reference network (the frozen copy, or with LoRA this module
        with its adapters off)."""
        if self.reference_model is None:
            raise RuntimeError(f"{type(self).__name__} did not call finish_setup()")
        return self.reference_model()

    def adapters_disabled(self):
        """A context in which ``self.module`` runs without its LoRA adapters (library-specific)."""
        raise NotImplementedError(f"{type(self).__name__} does not support LoRA references")

    def reset_reference(self) -> None:
        """ProRL's reference reset: the reference becomes the current policy, optimizer state is
        cleared (LoRA is refused at setup: its reference is the base model)."""
        if self.reference_model is not None:
            self.reference_model.reset(self.strategy)
        if self.optimizer is not None:
            self.optimizer.state.clear()

    # -- the optimizer step -------------------------------------------------------------------
    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a training forward ``fn(*args, **kwargs)`` through the prepared module, so the
        backend's hooks see it whatever submodules the policy calls (a plain call before
        :meth:`configure_optimizer`)."""
        return self.strategy.forward(fn, *args, **kwargs)

    def loss_terms(self, batch: Rollouts, objective, num_tokens: float, num_seqs: float
                   ) -> Iterator[tuple[torch.Tensor, dict[str, float]]]:
        """Yield ``(loss, metrics)`` per forward (a micro-batch, a denoising step ...): each loss
        is scaled by the mini-batch normalisers, so their sum is the mini-batch loss. Runs under
        autocast; the base class calls ``backward`` on each."""
        raise NotImplementedError

    def train_step(self, batch: Rollouts, objective, num_tokens: float, num_seqs: float) -> dict[str, float]:
        """One optimizer step over ``batch`` (a mini-batch), gradients accumulated over the loss
        terms of :meth:`loss_terms`. Metrics are averaged over the terms, except ``loss`` (summed:
        the terms' losses add up to the mini-batch loss).

        Out of memory: the accumulated gradients are dropped, the micro-batch is halved (kept so,
        or grown back after ``train.oom_grow_back_steps`` steps; the normalisers are the
        mini-batch's, so the gradient is the same) and the step is redone; with one sample per
        forward it stops with the numbers.
        A non-finite gradient is not applied: the step is skipped (``skipped_update`` 1, the cause
        in :attr:`last_skip_cause`), as the strategy judges it (DeepSpeed's engine judges its own)."""
        if self.optimizer is None:
            raise RuntimeError("call configure_optimizer() before train_step()")
        while True:
            try:
                out = self._train_step(batch, objective, num_tokens, num_seqs)
            except Exception as exc:
                if not is_out_of_memory(exc) or not self.strategy.retries_out_of_memory:
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                self.module.eval()
                size = min(self.micro_batch_size, max(len(batch), 1))
                if size <= 1:
                    raise RuntimeError(
                        f"out of memory with one sample per forward ({len(batch)} samples in the mini-batch, "
                        f"longest action {batch.action_mask.shape[1]}): use LoRA, a frozen vision tower, a smaller "
                        "model.dtype, max_pixels or max_completion_length") from exc
                self.micro_batch_backoff.shrink(size)
                continue
            self.micro_batch_backoff.fitted(self.cfg.train.micro_batch_size)
            return out

    @property
    def micro_batch_size(self) -> int:
        """Samples per forward now: ``train.micro_batch_size`` under the out-of-memory cap."""
        return self.micro_batch_backoff.size(int(self.cfg.train.micro_batch_size))

    def _train_step(self, batch: Rollouts, objective, num_tokens: float, num_seqs: float) -> dict[str, float]:
        # Several processes: ``num_tokens`` / ``num_seqs`` are the global normalisers, and the
        # backend averages gradients over ranks (the strategy scales each rank's loss to match).
        self.module.train()
        strategy = self.strategy
        sums: dict[str, float] = {}
        count = 0
        strategy.begin_update(len(batch))
        terms = self.loss_terms(batch, objective, num_tokens, num_seqs) if len(batch) else iter(())
        with strategy.accumulating():
            while True:
                with self.autocast():
                    term = next(terms, None)
                if term is None:
                    break
                loss, metrics = term
                strategy.backward(loss)
                count += 1
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        params = self.trainable_parameters()
        strategy.finish_backward(params)
        if dist.world_size() > 1:
            sums, count = dist.sum_over_ranks(sums, count)
        grad_norm, self.last_skip_cause = strategy.step(self.module, params, self.optimizer,
                                                        self.cfg.train.max_grad_norm, sums.get("loss", 0.0))
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held through the next rollout
        strategy.after_update()
        if self.last_skip_cause is None:
            self.after_optimizer_step()
        self.module.eval()
        out = {k: v / max(count, 1) for k, v in sums.items() if k != "loss"}
        out["loss"] = sums.get("loss", 0.0)
        out["grad_norm"] = float(grad_norm)
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        out["skipped_update"] = float(self.last_skip_cause is not None)
        return out

    # -- hooks with defaults ------------------------------------------------------------------
    def take_rollout_stats(self) -> dict[str, float]:
        """Counters of the rollouts since the last call (none by default)."""
        return {}

    def after_optimizer_step(self) -> None:
        """Called after every optimizer step (e.g. a rollout engine reloads the new weights)."""

    def begin_step(self, step: int) -> None:
        """Called before each RL step's rollouts: sets the learning rate of RL step ``step``
        (:func:`~mmrl.core.optimizer.step_schedule`). Subclasses that override this call it too."""
        if self.scheduler is not None:
            step_schedule(self.scheduler, step)

    def prepare_examples(self, examples: Sequence[dict]) -> list[dict]:
        """Examples as the rewards must see them; unchanged by default."""
        return list(examples)

    # -- checkpoints (mmrl.core.policy_checkpoint) --------------------------------------------
    def save_weights(self, path: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Write the full trained weights under ``path`` (subclass): ``state``, the whole state
        dict gathered from sharded weights, or the module's own when None."""
        raise NotImplementedError

    def load_weights(self, path: Path) -> None:
        """Read what :meth:`save_weights` wrote (subclass), through :meth:`load_module_state`."""
        raise NotImplementedError

    def load_module_state(self, state: dict[str, torch.Tensor]) -> None:
        """A whole state dict into ``self.module`` (sharded into the ranks' shares under FSDP2)."""
        self.strategy.load_state(self.module, state)

    def save(self, path: Path) -> None:
        save_policy(self, path)

    def load(self, path: Path) -> None:
        load_policy(self, path)

    # -- handing the model on (mmrl export) ------------------------------------------------------
    export_library = ""  # the library that loads an export: the model card's library_name

    def export_pretrained(self, out: Path, adapters: bool = False) -> None:
        """Write the trained model to ``out`` as its library loads it (``mmrl export``): each
        built-in policy does; a plugin policy without it is refused with this message."""
        raise ValueError(f"{type(self).__name__} has no export_pretrained: mmrl export cannot write it; "
                         "its checkpoints under <run>/checkpoints hold the weights")
