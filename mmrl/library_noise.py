"""What mmrl's libraries print that a user of mmrl can do nothing about, silenced once, when mmrl is
imported (:func:`silence`), each by its own message (and logger or calling module), never a whole
category: every other warning still reaches the user as Python's filters decide. Each entry says which
library prints it, why neither the user nor mmrl can act on it, and the releases that printed it;
when a release stops printing it, delete the entry.

Never silence with a ``warnings.catch_warnings()`` that runs every step: entering one resets the
"already shown" record of the whole process, so each warning shown once per run came back every step
(a 2-step run printed transformers' FutureWarning once per step). ``tests/test_first_run.py`` runs
``mmrl train vlm`` for two steps under ``python -W default`` and fails on any warning line.
"""

from __future__ import annotations

import logging
import re
import warnings

from .parsing import MODEL_TEXT_FILE

# torch 2.14 logs "<enum 'KernelPreference'> is an Enum subclass ... Calling register_constant() on
# Enum subclasses is deprecated" (a "W1206 ..." line) for each Enum torchao 0.18 registers as it is
# imported, and transformers 5.25 imports torchao on every model load (its quantizer registry).
_PYTREE_ENUM = "register_constant() on Enum subclasses is deprecated"

# diffusers 0.42 logs "Unable to import `torchao` Tensor objects. This may affect loading checkpoints
# serialized with `torchao`" on every pipeline load: it imports torchao.dtypes.NF4Tensor, which
# torchao 0.18 no longer has there. It concerns only checkpoints saved by torchao's quantizer, which
# mmrl neither writes nor loads differently; the pair of releases, not the user, would have to change.
_DIFFUSERS_TORCHAO = "Unable to import `torchao` Tensor objects"

# transformers 5.25 warns "`is_gradient_checkpointing` is deprecated ... Use `is_activation_checkpointing`"
# when peft 0.21 wraps a model for LoRA (peft reads the old name; mmrl does not).
_PEFT_CHECKPOINTING = r"`is_gradient_checkpointing` is deprecated"

# torch warns "Detected call of `lr_scheduler.step()` before `optimizer.step()`" when a schedule is
# stepped before the first optimizer step: mmrl sets each RL step's rate before its optimizer steps,
# and a resumed run sets it before its first, by design (mmrl.core.optimizer.step_schedule), so the
# warning does not apply there; it is silenced for that caller only.
_SCHEDULE_ORDER = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
_SCHEDULE_CALLER = r"mmrl\.core\.optimizer\Z"


# bitsandbytes 0.50 logs "Failed to load CPU gemm_4bit_forward from kernels-community: ... Please make sure
# you already `pip install kernels`" when it is imported on a CPU with AVX512-BF16 (peft imports it for every
# LoRA run once it is installed): its optional CPU inference kernel is fetched from the Hugging Face hub,
# which refuses an unverified publisher (and mmrl runs no hub code). mmrl never calls that kernel (its
# layers keep the standard layout, mmrl.core.library_internals.keep_4bit_weights_unpacked), so the user
# has nothing to install or fix.
_BNB_CPU_KERNEL = "Failed to load CPU gemm_4bit_forward from kernels-community"


# DeepSpeed 0.18 logs "[WARNING] ... Setting accelerator to CPU. If you have GPU or other accelerator, we were
# unable to detect it." when it is imported on a machine where torch sees no CUDA device; with the fit extra
# installed, every run imports it at its first checkpoint (transformers' save_pretrained unwraps the model
# through accelerate, which imports DeepSpeed's engine class whenever DeepSpeed is installed). Where torch sees
# no GPU, the CPU is the only accelerator there is: nothing to act on. With a GPU torch sees, it is not printed.
_DEEPSPEED_CPU = "Setting accelerator to CPU"


def _not_deepspeed_cpu(record: logging.LogRecord) -> bool:
    """False (drop) for DeepSpeed's line about falling back to the CPU where torch sees no CUDA device."""
    if not str(record.msg).startswith(_DEEPSPEED_CPU):
        return True
    import torch

    return torch.cuda.is_available()


# vLLM 0.32 logs "Following weights were not loaded from checkpoint: {...}" after every in-place weight reload
# that leaves a weight out. mmrl's colocated engine pushes only the trained weights (mmrl.vlm.engines.weight_sync):
# a frozen vision tower ("visual." in vLLM's Qwen-VL names) is left out on purpose and keeps the checkpoint's
# values. Only a list made of the tower's names is dropped: any other weight left out is still reported.
_VLLM_NOT_RELOADED = "Following weights were not loaded from checkpoint"


def _not_vllm_frozen_tower(record: logging.LogRecord) -> bool:
    """False (drop) for vLLM's reload line when every weight it lists is the vision tower's."""
    if not str(record.msg).startswith(_VLLM_NOT_RELOADED) or not isinstance(record.args, tuple) or not record.args:
        return True
    names = record.args[0]
    return not (isinstance(names, (set, frozenset, list, tuple)) and names
                and all(str(n).startswith("visual.") for n in names))


def _not_bnb_cpu_kernel(record: logging.LogRecord) -> bool:
    """False (drop) for bitsandbytes' line about its hub-fetched CPU kernel, True otherwise."""
    return not str(record.msg).startswith(_BNB_CPU_KERNEL)


def _not_torchao_enum(record: logging.LogRecord) -> bool:
    """False (drop) for torch's register_constant line about an Enum of torchao's, True otherwise."""
    if _PYTREE_ENUM not in str(record.msg) or not isinstance(record.args, tuple):
        return True
    return not any(getattr(a, "__module__", "").startswith("torchao.") for a in record.args)


def _not_torchao_tensors(record: logging.LogRecord) -> bool:
    """False (drop) for diffusers' line about torchao's tensor classes, True otherwise."""
    return _DIFFUSERS_TORCHAO not in str(record.msg)


def silence() -> None:
    """Install the filters above (again, after a ``warnings.resetwarnings()`` or a test's
    ``catch_warnings``; installing twice adds nothing). Also every warning about model text that
    :mod:`mmrl.parsing` reads as Python (file name :data:`~mmrl.parsing.MODEL_TEXT_FILE`)."""
    logging.getLogger("torch.utils._pytree").addFilter(_not_torchao_enum)
    logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").addFilter(_not_torchao_tensors)
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_not_bnb_cpu_kernel)
    logging.getLogger("DeepSpeed").addFilter(_not_deepspeed_cpu)
    logging.getLogger("vllm.model_executor.model_loader.reload.inplace").addFilter(_not_vllm_frozen_tower)
    warnings.filterwarnings("ignore", message=_PEFT_CHECKPOINTING, category=FutureWarning)
    warnings.filterwarnings("ignore", message=_SCHEDULE_ORDER, category=UserWarning, module=_SCHEDULE_CALLER)
    warnings.filterwarnings("ignore", module=re.escape(MODEL_TEXT_FILE) + r"\Z")


silence()
