"""Where the trained weights live across processes, and what a training step must do about it.

One class per launch, behind one interface, so the policy reads the same whatever the launch (each
class says what its launch changes): :class:`SingleProcess`; :class:`DDP`, replicated weights;
:class:`FSDP2`, sharded weights (:mod:`mmrl.core.sharding`); :class:`DeepSpeed` (ZeRO-1/2) and
:class:`ZeRO3`, DeepSpeed's engine stepped by mmrl (:mod:`mmrl.core.zero`). The strategy steps the
optimizer, so it also judges whether the gradients are finite (DeepSpeed's engine judges its own).

Each wraps the ``accelerate.Accelerator`` that prepared the module (the launch's accelerate config
chose DDP, FSDP2 or DeepSpeed): EasyR1's actor and nanoGPT's train loop keep this choice out of the step in
the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import distributed as dist
from . import sharding, zero
from .backend import TrainForward, make_accelerator
from .gradient_check import non_finite_cause


class SingleProcess:
    """One process: the module trains as it is. Also the strategy of a policy before
    :meth:`prepare` (forwards are plain calls, state dicts the module's own)."""

    retries_out_of_memory = True  # a step that ran out of memory is redone with smaller forwards

    def __init__(self, accelerator=None):
        self.accelerator = accelerator
        self.train_module: torch.nn.Module | None = None  # the prepared TrainForward
        self.inner_optimizer = None  # the torch optimizer that accelerate's wrapper steps

    @property
    def backend(self) -> str:
        """accelerate's name of the backend ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP2")."""
        return sharding.backend(self.accelerator) if self.accelerator is not None else "NO"

    def check(self, policy) -> None:
        """Stop at setup when something of ``policy`` cannot train under this strategy."""

    def prepare(self, module: torch.nn.Module, optimizer):
        """``module`` (wrapped so every training forward passes through the backend) and
        ``optimizer`` through ``accelerator.prepare``; returns the prepared optimizer."""
        self.inner_optimizer = optimizer
        self.train_module, optimizer = self.accelerator.prepare(TrainForward(module), optimizer)
        return optimizer

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A training forward ``fn(*args, **kwargs)`` through the prepared module."""
        if self.train_module is None:
            return fn(*args, **kwargs)
        return self.train_module(fn, *args, **kwargs)

    # -- one optimizer step -------------------------------------------------------------------
    def begin_update(self, samples: int) -> None:
        """Before a mini-batch's loss terms (``samples`` of them on this rank)."""

    def accumulating(self) -> contextlib.AbstractContextManager:
        """The context of the loss terms' backwards."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def finish_backward(self, params: list[torch.nn.Parameter]) -> None:
        """After the last loss term: the gradients of ``params`` are then complete."""

    def step(self, module, params, optimizer, max_norm: float, loss: float) -> tuple[torch.Tensor, str | None]:
        """The optimizer step over ``params``' complete gradients: ``(their norm before clipping, None)``,
        or, one not finite, nothing applied and ``(NaN, the cause)`` (``loss``: summed over ranks)."""
        if (cause := non_finite_cause(module, params, loss)) is not None:
            return torch.tensor(float("nan")), cause
        norm = self.accelerator.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return norm, None

    def after_update(self) -> None:
        """After the optimizer step: the weights as rollouts need them."""

    # -- whole weights (checkpoints, the reference) -------------------------------------------
    @contextlib.contextmanager
    def whole_weights(self) -> Iterator[None]:
        """A context in which state dicts are read and written (FSDP2: the registered shards)."""
        yield

    def gathered_weights(self, module: torch.nn.Module, trained_only: bool) -> dict[str, torch.Tensor] | None:
        """What a checkpoint writes of ``module`` when it is not the module's own state (None)."""
        return None

    def gathered_optimizer(self, module: torch.nn.Module) -> dict[str, Any] | None:
        """The optimizer state keyed by parameter name when it must be gathered (else None)."""
        return None

    def load_state(self, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        module.load_state_dict(state)

    def load_adapters(self, module: torch.nn.Module, adapters: dict[str, torch.Tensor]) -> None:
        """LoRA adapter weights as peft saved them (``adapter_model.safetensors``)."""
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(module, adapters)

    def load_optimizer(self, module: torch.nn.Module, optimizer, saved: dict[str, Any], by_name: bool,
                       names: list[str]) -> None:
        """A saved optimizer state: torch's own (parameters numbered) or keyed by name (``by_name``)."""
        if by_name:
            sharding.load_full_optimizer_state(module, self.inner_optimizer, saved)
        else:
            optimizer.load_state_dict(saved)

    def copy_weights(self, source: torch.nn.Module, target: torch.nn.Module) -> None:
        """``target`` (an unsharded copy, such as the reference) takes ``source``'s weights."""
        target.load_state_dict(source.state_dict())


class DDP(SingleProcess):
    """Replicated weights over several processes; gradients averaged by one synchronising backward."""

    def accumulating(self):
        return self.accelerator.no_sync(self.train_module)

    def backward(self, loss: torch.Tensor) -> None:
        # the normalisers are global and the backend averages over ranks: scale by the world size
        self.accelerator.backward(loss * dist.world_size())

    def finish_backward(self, params: list[torch.nn.Parameter]) -> None:
        """The one backward that leaves ``no_sync``: a zero loss over every trained parameter.
        DDP then all-reduces the locally accumulated gradients (their sum is unchanged)."""
        with dist.watched("gradient all-reduce"):
            zero = self.forward(lambda: sum(p.sum() for p in params) * 0.0)
            self.accelerator.backward(zero)


class FSDP2(DDP):
    """Sharded weights (``fully_shard`` through accelerate): two phases, and gathered checkpoints."""

    retries_out_of_memory = False  # every rank would have to redo the step alike

    def check(self, policy) -> None:
        policy.check_shardable("FSDP2")
        if policy.trained_dtype != torch.float32 and self.accelerator.mixed_precision != "no":
            raise ValueError(
                f"train.optim={policy.cfg.train.optim} keeps the trained weights in bfloat16, but the accelerate "
                f"config's mixed_precision: {self.accelerator.mixed_precision} makes accelerate's FSDP2 upcast them to "
                "float32 master weights; launch with mixed_precision: 'no' (forwards still autocast to model.dtype) "
                "or set train.optim=adamw_torch")

    @property
    def backend(self) -> str:
        offload = sharding.offloaded(self.accelerator.state.fsdp_plugin)
        return "FSDP2 (CPU offload)" if offload else "FSDP2"

    def prepare(self, module, optimizer):
        optimizer = super().prepare(module, optimizer)
        sharding.gather_for_rollouts(self.train_module)
        return optimizer

    def begin_update(self, samples: int) -> None:
        """Sharded training forwards are collectives: every rank must run as many."""
        dist.require_equal_shares(samples, "FSDP2")
        sharding.shard_for_training(self.train_module)

    def accumulating(self):
        return contextlib.nullcontext()  # every backward reduce-scatters

    def finish_backward(self, params) -> None:
        sharding.reshard_all(self.train_module)  # the registered parameters are the optimizer's shards

    def after_update(self) -> None:
        sharding.gather_for_rollouts(self.train_module)  # the updated weights, whole on every rank

    @contextlib.contextmanager
    def whole_weights(self):
        sharding.reshard_all(self.train_module)
        yield
        sharding.gather_for_rollouts(self.train_module)

    def gathered_weights(self, module, trained_only):
        if trained_only:  # LoRA: only the adapters are written, so only they are gathered
            return {n: sharding.full_tensor(p.detach()).cpu() for n, p in module.named_parameters()
                    if p.requires_grad}
        return sharding.full_model_state(module, drop_tied=True)

    def gathered_optimizer(self, module):
        return sharding.full_optimizer_state(module, self.inner_optimizer)

    def load_state(self, module, state) -> None:
        sharding.load_full_model_state(module, state)

    def load_adapters(self, module, adapters) -> None:
        keys = sharding.adapter_keys(module)
        sharding.load_full_model_state(module, {keys[k]: v for k, v in adapters.items()}, strict=False)

    def load_optimizer(self, module, optimizer, saved, by_name, names) -> None:
        if not by_name:  # written by an unsharded run: numbered in the order of ``names``
            saved = sharding.optimizer_state_by_name(saved, names)
        sharding.load_full_optimizer_state(module, self.inner_optimizer, saved)

    def copy_weights(self, source, target) -> None:
        target.load_state_dict(sharding.full_model_state(source, everywhere=True))


class DeepSpeed(SingleProcess):
    """DeepSpeed ZeRO-1/2 through the engine accelerate returns (:mod:`.zero`): gradients and
    optimizer state partitioned (optionally in CPU memory), whole weights on every rank; mmrl
    steps the engine itself and checkpoints consolidated masters and optimizer state by name."""

    retries_out_of_memory = False  # every rank would have to redo the step alike

    @property
    def backend(self) -> str:
        return zero.describe(self.accelerator)

    def check(self, policy) -> None:
        policy.check_shardable(f"DeepSpeed ZeRO-{zero.stage(self.accelerator)}")
        zero.check_precision(policy.cfg.train.optim, policy.trained_dtype)
        self.max_grad_norm = float(policy.cfg.train.max_grad_norm)

    def prepare(self, module, optimizer):
        zero.configure(self.accelerator, self.max_grad_norm)
        self.group_names = zero.group_names(module, optimizer)  # ZeRO replaces the params by partitions
        return super().prepare(module, optimizer)  # train_module: the DeepSpeed engine

    def begin_update(self, samples: int) -> None:
        """Every backward reduces into the partitions (a collective): every rank must run as many."""
        dist.require_equal_shares(samples, "DeepSpeed ZeRO")

    def backward(self, loss: torch.Tensor) -> None:
        """Reduced into this rank's partition at once; the engine averages over ranks, as DDP does."""
        self.train_module.backward(loss * dist.world_size())

    def step(self, module, params, optimizer, max_norm, loss):
        """The engine steps and judges its own gradients (in its partitions; ``p.grad`` is None): it
        clips at ``train.max_grad_norm`` and skips an update that is not finite (:func:`.zero.step`)."""
        return zero.step(self.train_module, loss)

    def gathered_weights(self, module, trained_only):
        full = zero.full_weights(module)  # LoRA (trained_only): only the adapters are written
        return {n: full[n] for n, p in module.named_parameters() if p.requires_grad} if trained_only else full

    def gathered_optimizer(self, module):
        return zero.full_optimizer_state(module, self.inner_optimizer, self.group_names)

    def load_state(self, module, state) -> None:
        module.load_state_dict(state)
        zero.load_master_weights(module, state)

    def load_adapters(self, module, adapters) -> None:
        super().load_adapters(module, adapters)
        keys = sharding.adapter_keys(module)
        zero.load_master_weights(module, {keys[k]: v for k, v in adapters.items()})

    def load_optimizer(self, module, optimizer, saved, by_name, names) -> None:
        if not by_name:  # written by an unsharded run: numbered in the order of ``names``
            saved = sharding.optimizer_state_by_name(saved, names)
        zero.load_full_optimizer_state(module, self.train_module, self.inner_optimizer, saved, self.group_names)

    def copy_weights(self, source, target) -> None:
        target.load_state_dict(zero.full_weights(source))


class ZeRO3(DeepSpeed):
    """DeepSpeed ZeRO-3: the weights partitioned too, so two phases as FSDP2's: whole on every
    rank for rollouts (gathered once, DeepSpeed's per-layer hooks off), partitioned for training."""

    def prepare(self, module, optimizer):
        optimizer = super().prepare(module, optimizer)
        self.phases = zero.Phases(self.train_module)  # gathered for the first rollouts
        return optimizer

    def begin_update(self, samples: int) -> None:
        super().begin_update(samples)
        self.phases.partition_for_training()

    def after_update(self) -> None:
        self.phases.gather_for_rollouts()

    def whole_weights(self):
        return self.phases.writable()


def strategy_for(previous: SingleProcess | None = None) -> SingleProcess:
    """The strategy of this launch, on ``previous``'s ``Accelerator`` (one per process) or a new one."""
    accelerator = (previous.accelerator if previous is not None else None) or make_accelerator()
    backend = sharding.backend(accelerator)
    if backend == "FSDP1":
        raise NotImplementedError(
            "the accelerate config asks for FSDP1; mmrl trains with DDP, FSDP2 (fsdp_version: 2) or DeepSpeed "
            "ZeRO-2: launch with configs/accelerate/ddp.yaml, fsdp2.yaml or deepspeed_zero2.yaml")
    if backend == "FSDP2":
        return FSDP2(accelerator)
    if backend == "DEEPSPEED":
        return ZeRO3(accelerator) if zero.stage(accelerator) == 3 else DeepSpeed(accelerator)
    return DDP(accelerator) if dist.world_size() > 1 else SingleProcess(accelerator)
