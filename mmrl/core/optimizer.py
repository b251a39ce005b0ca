"""The optimizer and learning-rate schedule of a policy's trained parameters.

``train.optim`` (transformers' ``TrainingArguments.optim``) names a factory of the ``OPTIMIZERS``
registry (``mmrl list``); each declares whether the trained weights are float32 master weights
(``master_weights=True``) or kept in bfloat16, which :func:`mmrl.core.precision.trained_dtype`
reads. Bytes per trained parameter, weight + gradient + optimizer state (``mmrl bench optimizers``
measures them):

==================  =====  ==================================================================
``train.optim``     bytes  what it is
==================  =====  ==================================================================
``adamw_torch``        16  ``torch.optim.AdamW`` on float32 master weights (the default)
``adamw_bf16``          8  ``torch.optim.AdamW`` on bfloat16 weights (TRL's pure bf16): loses
                           the updates below half a weight's bf16 spacing
``adamw_kahan``        10  optimi's AdamW with Kahan summation on bfloat16 weights
``adamw_bf16_sr``       8  torchao's AdamW with stochastic rounding on bfloat16 weights
``adamw_bnb_8bit``     10  bitsandbytes' 8-bit AdamW on float32 master weights (alias
                           ``adamw_8bit``, as in transformers)
``paged_adamw_8bit``   10  the same with its state in CUDA unified memory, paged out to CPU RAM
                           under GPU memory pressure (on a CPU: bitsandbytes warns and runs
                           ``adamw_bnb_8bit``)
==================  =====  ==================================================================

The libraries are imported when their optimizer is built; a missing one is one line naming
the pip command. Every factory returns a ``torch.optim.Optimizer`` subclass, so accelerate's
wrappers (:mod:`.strategy`) and the checkpoints (state dicts, by parameter name when sharded) treat
them alike.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from mmrl.config.options import check_options
from mmrl.registry import OPTIMIZERS, register_optimizer

from .library_internals import stochastic_rounding_adamw

ADAM_EPSILON = 1e-8  # transformers' TrainingArguments.adam_epsilon default, for every optimizer here


def make_optimizer(params, train_cfg: Any, total_steps: int):
    """The optimizer of ``train.optim`` over ``params`` and the LR scheduler of
    ``train.lr_scheduler_type`` (transformers' ``get_scheduler`` with ``train.lr_scheduler_kwargs``,
    or :func:`linear_horizon`) over ``total_steps`` RL steps (stepped once per RL step by
    :func:`step_schedule`)."""
    from transformers import get_scheduler

    build = OPTIMIZERS.get(train_cfg.optim, "train.optim")
    optimizer = build(params, lr=train_cfg.learning_rate, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2),
                      weight_decay=train_cfg.weight_decay, eps=ADAM_EPSILON)
    kwargs = dict(train_cfg.lr_scheduler_kwargs or {})
    if train_cfg.lr_scheduler_type == "linear_horizon":
        check_options(linear_horizon, kwargs, "train.lr_scheduler_kwargs", "the linear_horizon schedule",
                      ("optimizer", "warmup_steps", "total_steps"))
        return optimizer, linear_horizon(optimizer, train_cfg.warmup_steps, max(total_steps, 1), **kwargs)
    scheduler = get_scheduler(train_cfg.lr_scheduler_type, optimizer, num_warmup_steps=train_cfg.warmup_steps,
                              num_training_steps=max(total_steps, 1), scheduler_specific_kwargs=kwargs or None)
    return optimizer, scheduler


def linear_horizon_factor(step: int, warmup_steps: int, decay_steps: int, min_lr_rate: float = 0.0) -> float:
    """The learning rate of (0-based) ``step`` as a fraction of its peak under :func:`linear_horizon`:
    ``min(1, (step + 1) / warmup_steps) * max(min_lr_rate, 1 - step / decay_steps)``."""
    return min(1.0, (step + 1) / max(warmup_steps, 1)) * max(min_lr_rate, 1.0 - step / decay_steps)


def linear_horizon(optimizer, warmup_steps: int, total_steps: int, decay_steps: int | None = None,
                   min_lr_rate: float = 0.0):
    """``train.lr_scheduler_type=linear_horizon`` (mmrl's; transformers has no such schedule): a
    linear warmup over ``warmup_steps`` times a linear decay that would reach ``min_lr_rate`` of the
    peak at ``decay_steps`` (``train.lr_scheduler_kwargs``; default and minimum: the run's steps).
    A horizon past the run's end stops the run with the rate part-way down: the tiny models' SFT
    warm starts stop at three quarters of theirs, which leaves RL room (docs/tiny-default.md).
    Unlike transformers' ``linear``, step 0 already runs at ``1 / warmup_steps`` of the peak."""
    decay = max(int(decay_steps or total_steps), total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: linear_horizon_factor(s, warmup_steps, decay, float(min_lr_rate)))


def step_schedule(scheduler, step: int) -> None:
    """Set the learning rate of RL step ``step``.

    The schedule counts RL steps, the unit of ``train.steps`` and ``train.warmup_steps`` (as verl
    steps its scheduler once per training step), whatever number of optimizer steps an RL step
    takes (mini-batches x ``num_iterations``, or a batch that dynamic sampling resized): stepped
    per optimizer step, a linear decay would reach 0 part-way through the run.

    The schedule is set before the step's optimizer steps, by design (and a resumed run sets it
    before its first): torch's warning that ``lr_scheduler.step()`` came before ``optimizer.step()``
    (which assumes one scheduler step per optimizer step) does not apply: :mod:`mmrl.library_noise`
    silences it for this caller, once at import (a ``warnings.catch_warnings()`` here, entered every
    step, made every warning of the run that Python shows once print again each step)."""
    while scheduler.last_epoch < step - 1:
        scheduler.step()


def _library(optim: str, module: str, package: str):
    """``module`` imported, or an ImportError of one line naming the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise ImportError(f"train.optim={optim} needs the {package} package, which is not installed: "
                          f"pip install {package}", name=module) from None


# -- the registered optimizers: fn(params, *, lr, betas, weight_decay, eps) -------------------------

@register_optimizer("adamw_torch", master_weights=True)
def adamw_torch(params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float):
    """``torch.optim.AdamW`` ("Decoupled Weight Decay Regularization", Loshchilov & Hutter) on
    float32 master weights; forwards autocast to ``model.dtype``. 16 bytes per trained parameter:
    float32 weight, gradient and both moments."""
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps)


@register_optimizer("adamw_bf16", master_weights=False)
def adamw_bf16(params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float):
    """``torch.optim.AdamW`` on bfloat16 weights, its moments bfloat16 too: what TRL trains with
    when the model is loaded in bf16. 8 bytes per trained parameter. Each step's update is rounded
    to the nearest bf16 value, so an update below half a weight's spacing is lost: Adam's first step
    at lr 1e-6 moves each weight by 1e-6, which survives only for |w| < 2^-11, i.e. for ~2% of
    weights drawn N(0, 0.02). Kept to reproduce such runs; prefer ``adamw_kahan`` or ``adamw_bf16_sr``."""
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps)


@register_optimizer("adamw_kahan", master_weights=False)
def adamw_kahan(params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float):
    """optimi's ``AdamW(kahan_sum=True)`` on bfloat16 weights: Kahan-compensated summation ("Further
    remarks on reducing truncation errors", Kahan 1965; applied to bf16 weight updates in "Revisiting
    BFloat16 Training", Zamirai et al. 2020). A bf16 buffer per weight keeps the part of each update
    the rounded weight could not hold and adds it to the next one, so the weight is the bf16
    rounding of the float32-master trajectory. 10 bytes per trained parameter: bf16 weight,
    gradient, both moments and the compensation."""
    optimi = _library("adamw_kahan", "optimi", "torch-optimi")
    return optimi.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, kahan_sum=True)


@register_optimizer("adamw_bf16_sr", master_weights=False)
def adamw_bf16_sr(params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float):
    """torchao's AdamW with ``bf16_stochastic_round=True`` on bfloat16 weights: the update is
    computed in float32 and the new weight rounded up or down at random, with the probabilities that
    make its expectation exact ("Revisiting BFloat16 Training", Zamirai et al. 2020), so no update is
    lost on average, at the cost of noise of up to one bf16 spacing per weight. Moments bfloat16
    (rounded to nearest): 8 bytes per trained parameter. torchao compiles its step
    (``torch.compile``, once per parameter shape; on a CPU inductor needs a C++ compiler)."""
    _library("adamw_bf16_sr", "torchao", "torchao")
    return stochastic_rounding_adamw()(params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps,
                                       bf16_stochastic_round=True)


def _bnb_adamw(optim: str, params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float,
               paged: bool):
    """bitsandbytes' AdamW with 8-bit state, built as transformers builds ``optim`` (``optim_bits=8``)."""
    bnb = _library(optim, "bitsandbytes", "bitsandbytes")
    return bnb.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, optim_bits=8,
                           is_paged=paged)


@register_optimizer("adamw_bnb_8bit", master_weights=True)
def adamw_bnb_8bit(params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float):
    """bitsandbytes' AdamW with both moments stored in 8 bits ("8-bit Optimizers via Block-wise
    Quantization", Dettmers et al. 2022: blocks of 256 values, each with its float32 scale, on a dynamic
    quantization map), on float32 master weights. 10 bytes per trained parameter: float32 weight and
    gradient, one byte per moment (+0.03 for the block scales); bitsandbytes keeps tensors under 4,096
    elements (biases, norms) in 32-bit state."""
    return _bnb_adamw("adamw_bnb_8bit", params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, paged=False)


@register_optimizer("adamw_8bit", master_weights=True)
def adamw_8bit(params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float):
    """transformers' alias of ``adamw_bnb_8bit`` (the same optimizer)."""
    return _bnb_adamw("adamw_8bit", params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, paged=False)


@register_optimizer("paged_adamw_8bit", master_weights=True)
def paged_adamw_8bit(params, *, lr: float, betas: tuple[float, float], weight_decay: float, eps: float):
    """``adamw_bnb_8bit`` with its state in CUDA unified memory, which the driver pages out to CPU RAM
    when the GPU runs short (bitsandbytes' paged optimizers): the same arithmetic, memory spikes
    survived rather than fatal. On a CPU there is nothing to page: bitsandbytes warns ("Paged optimizers
    are not supported on CPU") and steps exactly as ``adamw_bnb_8bit``."""
    return _bnb_adamw("paged_adamw_8bit", params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, paged=True)
