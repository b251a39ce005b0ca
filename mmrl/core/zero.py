"""DeepSpeed ZeRO through accelerate (``distributed_type: DEEPSPEED``): what the RL loop needs on
top of the engine accelerate returns ("ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models"; ZeRO-Offload for the optimizer state in CPU memory).

- mmrl owns the step. The engine runs with ``managed_gradient_accumulation: false``: every loss
  term's ``engine.backward`` reduces its gradients into this rank's partition, and
  ``engine.step()`` is the boundary (it clips to ``train.max_grad_norm``, steps and zeroes).
  accelerate's own ``backward`` would step after every loss term; mmrl calls the engine directly.
- mmrl's optimizer (``train.optim``), not DeepSpeed's CPU Adam: with the optimizer offloaded
  DeepSpeed refuses a client optimizer unless ``zero_force_ds_cpu_optimizer`` is false, which mmrl
  sets, so every ``train.optim`` trains under ZeRO and a step is exact against one process (its
  C++ CPU Adam is faster but another implementation of the update).
- consolidated checkpoints: the float32 master weights and the optimizer state of every trained
  parameter gathered whole and keyed by name (DeepSpeed's public ``safe_get_full_*`` /
  ``safe_set_full_*``), in the format of :func:`mmrl.core.sharding.full_optimizer_state`, so a
  ZeRO run resumes with any process count and backend, and the other way round.
- on CPU too. accelerate turns DeepSpeed off on a CPU process group; :func:`enable_on_cpu` turns
  the launch's settings on there (DeepSpeed picks its CPU accelerator, collectives on gloo).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from .gradient_check import loss_cause


def requested() -> bool:
    """The launch asks for DeepSpeed (``accelerate launch`` with a DeepSpeed config sets this)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def enable_on_cpu(accelerator) -> None:
    """Turn on the launch's DeepSpeed settings where accelerate fell back to plain CPU data
    parallelism (gloo). The plugin reads the same ``ACCELERATE_DEEPSPEED_*`` variables accelerate's
    launcher exports; DeepSpeed's communication joins the existing gloo process group."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.MULTI_CPU or not requested():
        return
    import deepspeed
    from accelerate.utils import DeepSpeedPlugin

    from .library_internals import set_process_distributed_type

    deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.distributed_type = DistributedType.DEEPSPEED
    accelerator.state.deepspeed_plugins = plugin
    plugin.select(_from_accelerator_state=True)
    set_process_distributed_type(DistributedType.DEEPSPEED)  # a later AcceleratorState() copies it back


def configure(accelerator, max_grad_norm: float) -> None:
    """The engine's settings that mmrl's step decides, written into the launch's DeepSpeed config
    before ``accelerator.prepare``: no gradient accumulation of its own (mmrl's loss terms are
    normalised by the mini-batch), clipping at ``train.max_grad_norm``, mmrl's optimizer kept; the
    settings under which the engine would not judge its gradients (:func:`step`) refused."""
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    config.update({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                   "gradient_clipping": float(max_grad_norm) if max_grad_norm else 0.0,
                   "managed_gradient_accumulation": False, "zero_force_ds_cpu_optimizer": False,
                   "steps_per_print": 2**31 - 1})
    config.pop("train_batch_size", None)  # derived again by accelerate from the two above
    zero = config.get("zero_optimization", {})
    judges = {"zero_optimization.compute_grad_norm": zero.get("compute_grad_norm", True),  # DeepSpeed's defaults
              "bf16.check_grad_overflow": config.get("bf16", config.get("bfloat16", {})).get("check_grad_overflow", True)}
    if off := [key for key, value in judges.items() if str(value).lower() == "false"]:
        raise ValueError(
            f"the DeepSpeed config sets {' and '.join(off)} to false: then DeepSpeed's step applies a NaN or inf "
            "gradient without telling, where mmrl skips the update (the engine judges its gradients): remove it")
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        if zero.get(key) == "auto":  # accelerate fills these from model.config, which TrainForward has not
            del zero[key]


class Phases:
    """ZeRO-3's two phases. Rollouts, scoring and evaluation run a different number of forwards on
    each rank, and under ZeRO-3 every layer's forward gathers its weights (a collective every rank
    must join). So before them the whole weights are gathered once and DeepSpeed's per-layer hooks
    removed (DeepSpeed's own ``unwrap_model_for_generation``, what TRL does for generation); for
    training they are partitioned again and the hooks put back.

    transformers is told nothing of ZeRO-3 (accelerate registers its config with transformers when
    the plugin is selected): it would build a checkpoint's model partitioned (``zero.Init`` in
    ``from_pretrained``) and run ``generate`` in lockstep across ranks (``synced_gpus``), a
    collective per token that ranks generating different numbers of times cannot join."""

    def __init__(self, engine):
        from transformers.integrations import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
        self.engine = engine
        self.gathered: contextlib.ExitStack | None = None
        self.gather_for_rollouts()

    def gather_for_rollouts(self) -> None:
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

        if self.gathered is None:
            self.gathered = contextlib.ExitStack()
            self.gathered.enter_context(unwrap_model_for_generation(self.engine))

    def partition_for_training(self) -> None:
        if self.gathered is not None:
            self.gathered.close()  # discards the gathered copies: the partitions are unchanged
            self.gathered = None

    @contextlib.contextmanager
    def writable(self) -> Iterator[None]:
        """Whole weights that may be written (a checkpoint loaded): rank 0's are partitioned again
        on leaving (every rank loads the same values)."""
        import deepspeed

        self.partition_for_training()
        with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=0):
            yield
        self.gather_for_rollouts()


def check_precision(optim: str, trained_dtype: torch.dtype) -> None:
    """Stop at setup when ``train.optim`` keeps the trained weights in bfloat16."""
    if trained_dtype != torch.float32:
        raise ValueError(
            f"train.optim={optim} keeps the trained weights in bfloat16, but DeepSpeed keeps "
            "float32 master weights of its own (in its partitions); set train.optim=adamw_torch (with the "
            "accelerate config's mixed_precision: bf16 the weights the forwards use are bfloat16)")


def group_names(module: torch.nn.Module, optimizer) -> list[list[str]]:
    """The names of each param group's parameters, read before ZeRO replaces them by partitions."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def step(engine, loss: float) -> tuple[torch.Tensor, str | None]:
    """The engine's step (the accumulation boundary: clip, step, zero; the optimizer accelerate
    wraps then steps nothing) and its verdict: ``(the gradient norm it computed, None)``, or ``(NaN,
    the cause)`` when it skipped the update. DeepSpeed 0.19 computes the norm of the reduced
    gradients inside its step and skips the update when it is not finite (float32 and bf16, ZeRO-1/2/3;
    float16: its loss scaler's overflow check), then reports the norm as inf and
    ``was_step_applied()`` False; :func:`configure` refuses the settings under which it judges nothing.
    The gradients are then zeroed: a cause names the loss, or the norm, not a parameter."""
    engine.step()
    if not engine.was_step_applied():
        return torch.tensor(float("nan")), loss_cause(loss) or (
            "the gradient norm DeepSpeed computed is not finite (its step skipped the update)")
    return torch.as_tensor(float(engine.get_global_grad_norm())), None


def describe(accelerator) -> str:
    """The run banner's name: "DeepSpeed ZeRO-2 (optimizer offloaded to CPU)"."""
    moved = offloaded(accelerator)
    return f"DeepSpeed ZeRO-{stage(accelerator)}" + (f" ({' and '.join(moved)} offloaded to CPU)" if moved else "")


def stage(accelerator) -> int:
    return int(accelerator.state.deepspeed_plugin.zero_stage)


def offloaded(accelerator) -> list[str]:
    """What the config keeps in CPU memory: "optimizer" and/or "parameters"."""
    zero = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
    return [what for what, key in (("optimizer", "offload_optimizer"), ("parameters", "offload_param"))
            if str(zero.get(key, {}).get("device", "none")).lower() == "cpu"]


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s whole state dict with every trained parameter's float32 master weight (a
    collective: every rank calls it; ZeRO keeps the masters partitioned), each tied parameter
    once, as a checkpoint stores it (a bf16 copy beside its master would untie them on load)."""
    from deepspeed.utils import safe_get_full_fp32_param

    from .sharding import tied_duplicates

    tied = tied_duplicates(module)
    state = {k: v.detach().cpu() for k, v in module.state_dict().items() if k not in tied}
    for name, param in module.named_parameters():
        if param.requires_grad:
            state[name] = safe_get_full_fp32_param(param).detach().cpu().reshape(param.shape)
    return state


def load_master_weights(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """After ``state`` (keyed as ``module``'s state dict, whole) was loaded into ``module``: the
    partitioned float32 masters take it, from the saved values (the module's own may be their bf16
    rounding), or the next step would start from the old masters."""
    from deepspeed.utils import safe_set_full_fp32_param

    for name, param in module.named_parameters():
        if param.requires_grad and name in state:
            safe_set_full_fp32_param(param, state[name].detach().to(torch.float32))


def full_optimizer_state(module: torch.nn.Module, inner_optimizer, names: list[list[str]]) -> dict[str, Any]:
    """The optimizer state keyed by parameter name (torch's full ``get_optimizer_state_dict``
    format; a collective). ``names``: the trained parameters' names of each param group, in the
    order the optimizer was given them (ZeRO replaced them by flat partitions, whose state holds
    the per-element tensors, gathered here per parameter, and the scalars such as Adam's step)."""
    from deepspeed.utils import safe_get_full_optimizer_state

    params = dict(module.named_parameters())
    flat = next(iter(inner_optimizer.state.values()), {})  # every partition's: the same keys and step
    state = {}
    for name in (n for group in names for n in group) if flat else ():
        p = params[name]
        state[name] = {key: (safe_get_full_optimizer_state(p, key).detach().cpu().reshape(p.shape)
                             if _per_element(value) else _copy(value)) for key, value in flat.items()}
    groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": list(group_names)}
              for group, group_names in zip(inner_optimizer.param_groups, names, strict=True)]
    return {"state": state, "param_groups": groups}


def load_full_optimizer_state(module: torch.nn.Module, engine, inner_optimizer, saved: dict[str, Any],
                              names: list[list[str]]) -> None:
    """Restore a state of :func:`full_optimizer_state` (or of a sharded / one-process run, keyed by
    name) into the partitions: before the first step the partitions' state is created (zeros of
    the saved per-element keys, the saved scalars) and linked, then every parameter's part is
    written."""
    from deepspeed.utils import safe_set_full_optimizer_state

    from .library_internals import link_zero_optimizer_state, zero_flat_partitions

    for group, saved_group in zip(inner_optimizer.param_groups, saved["param_groups"], strict=True):
        group.update({k: v for k, v in saved_group.items() if k != "params"})
    params = dict(module.named_parameters())
    present = [n for group in names for n in group if n in saved["state"]]
    if not present:
        return
    example = saved["state"][present[0]]
    for flat in zero_flat_partitions(engine):
        state = inner_optimizer.state[flat]
        for key, value in example.items():
            if not _per_element(value):
                state[key] = _copy(value)
            elif key not in state:
                state[key] = torch.zeros_like(flat)
    link_zero_optimizer_state(engine)
    for name in present:
        for key, value in saved["state"][name].items():
            if _per_element(value):
                safe_set_full_optimizer_state(params[name], value.to(torch.float32), key)


def _per_element(value: Any) -> bool:
    """A state tensor with one entry per weight (Adam's moments), not a scalar (its step)."""
    return torch.is_tensor(value) and value.dim() > 0


def _copy(value: Any) -> Any:
    return value.clone() if torch.is_tensor(value) else value
