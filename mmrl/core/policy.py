"""The interface every trainable policy implements, and the base class that owns the optimizer step.

A VLM's actions are generated tokens; a diffusion model's are denoising steps. Either way the
policy samples groups, reports per-action log-probs, and takes optimizer steps on the core's loss.
What does not depend on the modality is written once, in :class:`PolicyBase`:

- precision: ``model.dtype`` is the *compute* dtype. Trainable parameters are kept in float32
  (master weights) and forward passes run under ``torch.autocast`` in bfloat16/float16, the way
  AMP and FSDP's mixed precision train; frozen weights (the reference copy, a frozen vision tower,
  a LoRA base model) are stored in the compute dtype. Pure-bf16 weights lose most AdamW updates at
  small learning rates (one step at lr 1e-6 changes ~2% of bf16 weights of std 0.02).
- the optimizer and LR scheduler, micro-batch gradient accumulation, metric averaging, gradient
  clipping, the optimizer step (gradients freed right after it, so they do not live through the
  next rollout);
- the reference model of the KL term (a frozen copy, or with LoRA the adapters disabled);
- checkpoints: LoRA adapters through peft's state-dict helpers, full weights through the
  subclass, optimizer and scheduler state;
- several processes: an ``accelerate.Accelerator`` prepares the trained module and the optimizer
  (DDP or FSDP2, chosen by the accelerate config of the launch). Training forwards run
  through :meth:`PolicyBase.forward`, so the backend's hooks see them whatever submodules the
  policy calls. DDP: gradients of all loss terms accumulate locally (``no_sync``) and one
  synchronising backward averages them (see :meth:`PolicyBase.train_step`). FSDP2: weights are
  gathered for the rollouts and sharded for training (:mod:`mmrl.core.sharding`), where every
  backward reduce-scatters.

A modality policy supplies sampling (``rollout``), per-micro-batch loss terms (``loss_terms``),
its full-weight save/load and its optional capabilities, declared in ``capabilities`` and checked
once at setup by the trainer.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from mmrl.registry import LOSSES

from . import distributed as dist
from . import sharding
from .backend import TrainForward, make_accelerator
from .oom import OOMBackoff, is_out_of_memory
from .rollouts import Rollouts

# Optional capabilities a policy can declare (``Policy.capabilities``).
CAPABILITIES = {
    "scoring": "re-scores a batch's actions without gradient (score(batch, reference))",
    "teacher_forcing": "turns given completions into samples (rollout_given: off-policy guidance)",
    "coordinates": "answers in a coordinate space of its own (prepare_examples records it)",
    "image_inputs": "reads images in its prompts (data.perturbation applies)",
    "video_inputs": "reads video clips in its prompts (video tasks; algo.temporal_grpo shuffles their frames)",
    "multi_turn": "acts over several turns of an episode, one prompt per turn (environment tasks)",
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Policy(Protocol):
    """What the trainer calls; :class:`PolicyBase` implements everything but sampling."""

    capabilities: frozenset[str]

    @property
    def max_actions(self) -> int:
        """The most actions one sample can have (a VLM's ``max_completion_length``, a generator's
        denoising steps): Dr. GRPO's constant normaliser."""

    def begin_step(self, step: int) -> None:
        """Called before each RL step's rollouts (policies that seed by step)."""

    def prepare_examples(self, examples: Sequence[dict]) -> list[dict]:
        """Copies of ``examples`` with what this policy's rewards need to read its answers."""

    def rollout(self, examples: Sequence[dict], prompts: Sequence[Any], n: int, mode: str,
                need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """``n`` samples per prompt (no grad); group i holds prompt i's samples. ``mode`` is
        ``"train"`` (the rollout settings), ``"eval"`` (the eval settings) or ``"sample"`` (held-out
        samples for pass@k: the policy's sampling distribution, leaving training state untouched)."""

    def configure_optimizer(self, train_cfg: Any, total_steps: int) -> None: ...

    def train_step(self, batch: Rollouts, objective: Callable[..., tuple[torch.Tensor, dict]],
                   num_tokens: float, num_seqs: float) -> dict[str, float]:
        """One optimizer step over a mini-batch; ``objective`` is the core's loss."""

    def reset_reference(self) -> None: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


def pick_device(name: str) -> torch.device:
    """``train.device``: ``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def policy_device(cfg) -> torch.device:
    """``train.device``, except that a launched run puts each rank on its own accelerator."""
    dist.init(cfg.train.device, cfg.train.distributed_timeout)
    if dist.active() and cfg.train.device in ("auto", "cuda"):
        return dist.device()
    return pick_device(cfg.train.device)


def compute_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def make_optimizer(params, train_cfg: Any, total_steps: int):
    """AdamW over ``params`` and the configured transformers LR scheduler over ``total_steps`` RL
    steps (stepped by :meth:`PolicyBase.begin_step`)."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(params, lr=train_cfg.learning_rate, weight_decay=train_cfg.weight_decay,
                                  betas=(train_cfg.adam_beta1, train_cfg.adam_beta2))
    scheduler = get_scheduler(train_cfg.lr_scheduler_type, optimizer, num_warmup_steps=train_cfg.warmup_steps,
                              num_training_steps=max(total_steps, 1))
    return optimizer, scheduler


class PolicyBase:
    """The modality-free half of a policy (module docstring). Subclasses set ``self.module`` (the
    trained network) during ``__init__`` and call :meth:`finish_setup` at its end."""

    capabilities: frozenset[str] = frozenset()
    # What this policy can compute for a loss (a loss's ``register_loss(requires=...)``).
    loss_inputs: frozenset[str] = frozenset({"logps"})
    # Config keys (or whole sections, "vlm") that mean nothing for this policy: set to anything but
    # their default, the run stops at setup instead of silently ignoring them.
    unused_config: tuple[str, ...] = ()

    module: torch.nn.Module

    def __init__(self, cfg, device: torch.device | None = None):
        self.cfg = cfg
        self.device = device or policy_device(cfg)
        self.compute_dtype = compute_dtype(cfg.model.dtype)
        self.lora = bool(cfg.model.lora.enabled)
        self.ref_module: torch.nn.Module | None = None
        self.optimizer = None
        self.scheduler = None
        self.accelerator = None
        self.train_module: torch.nn.Module | None = None  # the prepared TrainForward
        # Samples per forward: train.micro_batch_size, halved when a step runs out of memory.
        self.micro_batch_backoff = OOMBackoff("samples per forward", cfg.train.oom_grow_back_steps)
        self.last_skip_cause: str | None = None  # why the last optimizer step was skipped, if it was
        unknown = set(self.capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"{type(self).__name__} declares unknown capabilities {sorted(unknown)}")
        missing = set(LOSSES.get(cfg.algo.loss_type).loss_requires) - set(self.loss_inputs)
        if missing:
            raise ValueError(f"algo.loss_type={cfg.algo.loss_type!r} needs {sorted(missing)}, which a "
                             f"{type(self).__name__} does not compute; valid losses here: "
                             f"{', '.join(self.valid_losses())}")
        if self.lora and cfg.algo.ref_reset_every:
            raise ValueError("algo.ref_reset_every (ProRL reference reset) is not supported with LoRA "
                             "(the reference is the base model); use full fine-tuning or set it to 0")

    @classmethod
    def valid_losses(cls) -> list[str]:
        return [n for n in LOSSES.names() if set(LOSSES.get(n).loss_requires) <= set(cls.loss_inputs)]

    # -- precision ------------------------------------------------------------------------------
    @property
    def mixed_precision(self) -> bool:
        return self.compute_dtype != torch.float32

    def autocast(self):
        """The forward-pass context: autocast to the compute dtype (a no-op in float32)."""
        if not self.mixed_precision:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def finish_setup(self) -> None:
        """After the subclass built ``self.module`` (LoRA applied, frozen parts frozen): trainable
        parameters to float32 master weights, and the frozen reference copy when one is needed."""
        for p in self.trainable_parameters():
            if p.dtype != torch.float32:
                p.data = p.data.float()
        if self.cfg.algo.beta > 0 and not self.lora:
            # The reference of the KL term (with LoRA the base weights, reached by disabling the
            # adapters, play this role and no copy is made); frozen, so in the compute dtype.
            self.ref_module = copy.deepcopy(self.module).eval().requires_grad_(False).to(self.compute_dtype)

    # -- the reference model --------------------------------------------------------------------
    @contextlib.contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The reference network: the frozen copy, or with LoRA this module with its adapters off."""
        if self.ref_module is not None:
            yield self.ref_module
        elif self.lora:
            with self.adapters_disabled():
                yield self.module
        else:
            raise RuntimeError("a reference model is needed (algo.beta > 0) but none was set up")

    def adapters_disabled(self):
        """A context in which ``self.module`` runs without its LoRA adapters (library-specific)."""
        raise NotImplementedError(f"{type(self).__name__} does not support LoRA references")

    def reset_reference(self) -> None:
        """ProRL's reference reset: the reference becomes the current policy, optimizer state is
        cleared (LoRA is refused at setup: its reference is the base model)."""
        if self.ref_module is not None:
            if self.sharded:
                sharding.reshard_all(self.train_module)
                self.ref_module.load_state_dict(sharding.full_model_state(self.module, everywhere=True))
                sharding.gather_for_rollouts(self.train_module)
            else:
                self.ref_module.load_state_dict(self.module.state_dict())
        if self.optimizer is not None:
            self.optimizer.state.clear()

    # -- the optimizer step ---------------------------------------------------------------------
    def configure_optimizer(self, train_cfg, total_steps: int) -> None:
        """AdamW + scheduler; the module and optimizer prepared by accelerate. The scheduler stays
        ours: accelerate's would step once per process per optimizer step."""
        optimizer, self.scheduler = make_optimizer(self.trainable_parameters(), train_cfg, total_steps)
        self.accelerator = self.accelerator or make_accelerator()
        backend = sharding.backend(self.accelerator)
        if backend in ("FSDP1", "DEEPSPEED"):
            raise NotImplementedError(
                f"the accelerate config asks for {backend}; mmrl trains with DDP or FSDP2 (fsdp_version: 2): "
                "launch with configs/accelerate/ddp.yaml or configs/accelerate/fsdp2.yaml")
        if backend == "FSDP2":
            self.check_shardable()
        self.train_module, self.optimizer = self.accelerator.prepare(TrainForward(self.module), optimizer)
        if self.sharded:
            sharding.gather_for_rollouts(self.train_module)

    @property
    def sharded(self) -> bool:
        """The trained weights are sharded across ranks (FSDP2)."""
        return self.train_module is not None and sharding.backend(self.accelerator) == "FSDP2"

    def check_shardable(self) -> None:
        """Stop at setup when something of this run cannot train sharded (FSDP2) yet."""

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a training forward ``fn(*args, **kwargs)`` through the prepared module (a plain
        call before :meth:`configure_optimizer`)."""
        if self.train_module is None:
            return fn(*args, **kwargs)
        return self.train_module(fn, *args, **kwargs)

    def _synchronise_gradients(self) -> None:
        """The one backward that leaves ``no_sync``: a zero loss over every trained parameter.
        DDP then all-reduces the locally accumulated gradients (their sum is unchanged), whatever
        number of loss terms each rank ran, an empty share included."""
        params = self.trainable_parameters()
        zero = self.forward(lambda: sum(p.sum() for p in params) * 0.0)
        self.accelerator.backward(zero)

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
        in :attr:`last_skip_cause`)."""
        if self.optimizer is None:
            raise RuntimeError("call configure_optimizer() before train_step()")
        while True:
            try:
                out = self._train_step(batch, objective, num_tokens, num_seqs)
            except Exception as exc:
                if not is_out_of_memory(exc) or self.sharded:  # sharded: every rank must redo it alike
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
        self.module.train()
        sums: dict[str, float] = {}
        count = 0
        # Several processes: ``num_tokens`` / ``num_seqs`` are the global normalisers, and the
        # backend averages gradients over ranks, so each rank's loss is scaled by the world size.
        world = dist.world_size()
        if self.sharded:
            self._check_equal_shares(len(batch))
            sharding.shard_for_training(self.train_module)
        terms = self.loss_terms(batch, objective, num_tokens, num_seqs) if len(batch) else iter(())
        # DDP: accumulate locally, synchronise once; FSDP2: every backward reduce-scatters
        local = world > 1 and not self.sharded
        with self.accelerator.no_sync(self.train_module) if local else contextlib.nullcontext():
            while True:
                with self.autocast():
                    term = next(terms, None)
                if term is None:
                    break
                loss, metrics = term
                self.accelerator.backward(loss * world if world > 1 else loss)
                count += 1
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        if local:
            with dist.watched("gradient all-reduce"):
                self._synchronise_gradients()
        if world > 1:
            sums, count = dist.sum_over_ranks(sums, count)
        if self.sharded:
            sharding.reshard_all(self.train_module)  # the registered parameters are the optimizer's shards
        params = self.trainable_parameters()
        self.last_skip_cause = self._non_finite_gradient(params, sums.get("loss", 0.0))
        if self.last_skip_cause is None:
            grad_norm = self.accelerator.clip_grad_norm_(params, self.cfg.train.max_grad_norm)
            self.optimizer.step()
        else:
            grad_norm = torch.tensor(float("nan"))
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held through the next rollout
        if self.sharded:
            sharding.gather_for_rollouts(self.train_module)  # the updated weights, whole on every rank
        if self.last_skip_cause is None:
            self.after_optimizer_step()
        self.module.eval()
        out = {k: v / max(count, 1) for k, v in sums.items() if k != "loss"}
        out["loss"] = sums.get("loss", 0.0)
        out["grad_norm"] = float(grad_norm)
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        out["skipped_update"] = float(self.last_skip_cause is not None)
        return out

    def _check_equal_shares(self, size: int) -> None:
        """Sharded training forwards are collectives: every rank must run as many. The policies'
        loss terms follow the mini-batch size, so the ranks' shares must be equal."""
        sizes = dist.gather(size)
        if len(set(sizes)) > 1:
            raise RuntimeError(
                f"FSDP2 needs every rank to train on as many samples per mini-batch; this one has {sizes} "
                "(one per rank). Make train.prompts_per_step and train.mini_batch_size multiples of the "
                "process count, and avoid what keeps a different number of samples per rank (dynamic "
                "sampling, multi-turn episodes), or launch with DDP (configs/accelerate/ddp.yaml)")

    def _non_finite_gradient(self, params: list[torch.nn.Parameter], loss: float) -> str | None:
        """None when every gradient is finite (one norm over them all), else what went wrong:
        the loss, or the first parameter whose gradient holds NaN / inf, by name. Sharded
        gradients are judged whole (the same verdict on every rank)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads or bool(torch.isfinite(sharding.full_tensor(torch.nn.utils.get_total_norm(grads)))):
            return None
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        names = {id(p): n for n, p in self.module.named_parameters()}
        for p in params:
            if p.grad is not None and not bool(torch.isfinite(sharding.full_tensor(p.grad)).all()):
                return f"the gradient of {names.get(id(p), '?')} is not finite"
        return "the gradient norm is not finite"  # the squares overflowed: every gradient is finite

    # -- hooks with defaults --------------------------------------------------------------------
    def take_generation_timeouts(self) -> int:
        """Samples whose generation was cut by a time limit since the last call (``rollout.max_time``)."""
        return 0

    def after_optimizer_step(self) -> None:
        """Called after every optimizer step (e.g. a rollout engine reloads the new weights)."""

    def begin_step(self, step: int) -> None:
        """Called before each RL step's rollouts: sets the learning rate of RL step ``step``.

        The schedule counts RL steps, the unit of ``train.steps`` and ``train.warmup_steps`` (as
        verl steps its scheduler once per training step), whatever number of optimizer steps an RL
        step takes (mini-batches x ``num_iterations``, or a batch that dynamic sampling resized):
        stepped per optimizer step, a linear decay would reach 0 part-way through the run.
        Subclasses that override this call it too."""
        if self.scheduler is not None:
            while self.scheduler.last_epoch < step - 1:
                self.scheduler.step()

    def prepare_examples(self, examples: Sequence[dict]) -> list[dict]:
        """Examples as the rewards must see them; unchanged by default."""
        return list(examples)

    # -- checkpoints ----------------------------------------------------------------------------
    ADAPTER_FILE = "adapter_model.safetensors"

    def save_weights(self, path: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Write the full trained weights under ``path`` (subclass): ``state``, the whole state
        dict gathered from sharded weights, or the module's own when None."""
        raise NotImplementedError

    def load_weights(self, path: Path) -> None:
        """Read what :meth:`save_weights` wrote (subclass), through :meth:`load_module_state`."""
        raise NotImplementedError

    def load_module_state(self, state: dict[str, torch.Tensor]) -> None:
        """A whole state dict into ``self.module`` (sharded into the ranks' shares under FSDP2)."""
        if self.sharded:
            sharding.load_full_model_state(self.module, state)
        else:
            self.module.load_state_dict(state)

    def _inner_optimizer(self):
        return getattr(self.optimizer, "optimizer", self.optimizer)  # under accelerate's wrapper

    def _trained_names(self) -> list[str]:
        """The trained parameters' names, in the order the optimizer was given them."""
        return [n for n, p in self.module.named_parameters() if p.requires_grad]

    def save(self, path: Path) -> None:
        """Weights (LoRA: the adapters only, through peft) and optimizer + scheduler state.
        Called on every rank (sharded weights and optimizer state are gathered here, keyed by
        parameter name); rank 0 writes."""
        weights = optimizer = None
        if self.sharded:
            sharding.reshard_all(self.train_module)
            if self.lora:  # only the adapters are written: gather them, not the whole model
                weights = {n: sharding.full_tensor(p.detach()).cpu() for n, p in self.module.named_parameters()
                           if p.requires_grad}
            else:
                weights = sharding.full_model_state(self.module, drop_tied=True)
            optimizer = sharding.full_optimizer_state(self.module, self._inner_optimizer())
            sharding.gather_for_rollouts(self.train_module)
        if not dist.is_main():
            return
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.lora:
            from peft import get_peft_model_state_dict
            from safetensors.torch import save_file

            state = get_peft_model_state_dict(self.module, state_dict=weights)  # weights: None unless sharded
            save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path / self.ADAPTER_FILE))
        else:
            self.save_weights(path, weights)
        if self.optimizer is not None:
            by_name = optimizer is not None
            torch.save({"optimizer": optimizer if by_name else self.optimizer.state_dict(), "by_name": by_name,
                        "scheduler": self.scheduler.state_dict()}, path / "optimizer.pt")

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote (optimizer state only when an optimizer exists); every
        rank reads the same consolidated files, whatever number of processes wrote them, sharded
        or not."""
        path = Path(path)
        if self.sharded:
            sharding.reshard_all(self.train_module)
        if self.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            adapters = load_file(str(path / self.ADAPTER_FILE))
            if self.sharded:
                keys = sharding.adapter_keys(self.module)
                sharding.load_full_model_state(self.module, {keys[k]: v for k, v in adapters.items()}, strict=False)
            else:
                set_peft_model_state_dict(self.module, adapters)
        else:
            self.load_weights(path)
        opt = path / "optimizer.pt"
        if opt.exists() and self.optimizer is not None:
            state = torch.load(opt, map_location="cpu", weights_only=False)
            saved = state["optimizer"]
            if self.sharded or state.get("by_name"):
                if not state.get("by_name"):
                    saved = sharding.optimizer_state_by_name(saved, self._trained_names())
                sharding.load_full_optimizer_state(self.module, self._inner_optimizer(), saved)
            else:
                self.optimizer.load_state_dict(saved)
            self.scheduler.load_state_dict(state["scheduler"])
        if self.sharded:
            sharding.gather_for_rollouts(self.train_module)
