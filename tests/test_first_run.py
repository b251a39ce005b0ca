"""A first run reads clean: a 2-step `mmrl train vlm` / `mmrl train diffusion` prints no warning a user
cannot act on, and what mmrl silences (mmrl/library_noise.py) is silenced by its message only, once.

pyproject's pytest ``filterwarnings`` hides Deprecation/FutureWarnings from the suite, and pytest puts
back the warning filters of before its collection after each test; so the runs here are real
processes under ``python -W default`` (what a user with Python's default filters sees, plus the
DeprecationWarnings Python hides outside ``__main__``), and the in-process tests install
:func:`mmrl.library_noise.silence` themselves, as ``import mmrl`` does."""

from __future__ import annotations

import enum
import logging
import re
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import CLI_RUN
from mmrl import library_noise
from mmrl.core.optimizer import step_schedule

# A Python warning as Python prints it ("path:line: FutureWarning: ..."), a torch/glog log line
# ("W1206 07:14:27.727000 6309 site-packages/..."), a library logger's "[WARNING]" line (DeepSpeed's format),
# or a library's line about something deprecated.
_NOISE = re.compile(r"\b\w*Warning\b|\[WARNING\]|^[IWE]\d{4} \d\d:\d\d:\d\d|deprecated", re.MULTILINE)


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if _NOISE.search(line)]


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    ("train", "vlm", *CLI_RUN),
    ("train", "diffusion", "train.device=cpu", "eval.num_examples=2", "log.progress=false"),
], ids=["vlm", "diffusion"])
def test_a_two_step_run_prints_no_warning(command, tmp_path):
    """The tiny defaults (shipped models: the transformers and diffusers loaders, torchao's import
    through transformers' quantizers, the shared prompt pass, the schedule, the report)."""
    r = subprocess.run([sys.executable, "-W", "default", "-m", "mmrl.cli", *command, "train.steps=2"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _noise(r.stdout + r.stderr) == [], r.stderr[-3000:]
    assert "held-out" in r.stderr  # the run did run and evaluate


def _schedule():
    """A LambdaLR over one parameter's SGD, never stepped (as a resumed run's, before its first step)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))


def _say_once():
    warnings.warn("a library's warning, shown once per run", UserWarning)


def test_setting_the_schedule_keeps_a_warning_shown_once_shown_once():
    """step_schedule ran every RL step inside a ``warnings.catch_warnings()``, which resets what
    Python has shown: a warning shown once per run (the "default" action) printed again every step."""
    sched = _schedule()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        library_noise.silence()
        for step in range(1, 4):
            _say_once()
            step_schedule(sched, step)  # steps 1, 2, 3 set lr factors 1/1, 1/2, 1/3
    assert [str(w.message) for w in seen] == ["a library's warning, shown once per run"]
    assert sched.get_last_lr() == [pytest.approx(1 / 3)]  # last_epoch 2: 1 / (2 + 1)


def test_torch_schedule_order_warning_is_silenced_for_step_schedule_only():
    """mmrl sets the rate before the step's optimizer steps by design; torch's warning about it
    still reaches a user whose own code steps a schedule first."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        library_noise.silence()
        step_schedule(_schedule(), 3)  # 2 scheduler steps before any optimizer step
        _schedule().step()  # the user's own call
    order = [w for w in seen if "lr_scheduler.step()" in str(w.message)]
    assert [w.filename for w in order] == [__file__]


def _pytree_lines(*enums) -> list[str]:
    """What torch's pytree logger lets through while each of ``enums`` is registered as a constant."""
    got: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(record.getMessage())
    logger = logging.getLogger("torch.utils._pytree")
    logger.addHandler(handler)
    try:
        for cls in enums:
            torch.utils._pytree.register_constant(cls)
    finally:
        logger.removeHandler(handler)
    return got


def test_torch_register_constant_line_is_dropped_for_torchao_enums_only():
    """torchao 0.18 registers its Enums at import and torch 2.14 logs a "W1206 ... register_constant"
    line for each; an Enum of anyone else's still gets its line."""
    library_noise.silence()
    theirs = enum.Enum("KernelPreference", "AUTO", module="torchao.quantization.test_kernel_preference", type=str)
    yours = enum.Enum("YourMode", "A", module="your_package.modes", type=str)
    lines = _pytree_lines(theirs, yours)
    assert len(lines) == 1 and "YourMode" in lines[0] and "register_constant()" in lines[0]


def test_vllms_reload_line_is_dropped_when_it_lists_the_frozen_vision_tower_only(caplog):
    """The colocated engine leaves a frozen tower out of its pushes on purpose; any other weight
    vLLM says it did not reload is still reported."""
    import logging

    library_noise.silence()
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.inplace")
    message = "Following weights were not loaded from checkpoint: %s"
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning(message, {"visual.blocks.0.attn.qkv.weight", "visual.merger.mlp.0.bias"})
        logger.warning(message, {"visual.blocks.0.attn.qkv.weight", "model.layers.0.mlp.up_proj.weight"})
    assert [r.getMessage().count("model.layers.0") for r in caplog.records] == [1]


def test_peft_gradient_checkpointing_warning_is_silenced(random_tiny_dir):
    """peft 0.21 reads transformers 5.25's deprecated ``is_gradient_checkpointing`` when it wraps a model
    for LoRA: a FutureWarning nobody using mmrl can act on (shown here without mmrl's filters first)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    def wrap() -> list[str]:
        model = AutoModelForImageTextToText.from_pretrained(random_tiny_dir)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if silenced:
                library_noise.silence()
            get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
        return [str(w.message) for w in seen if "is_gradient_checkpointing" in str(w.message)]

    silenced = False
    if not wrap():
        pytest.skip("this peft/transformers pair does not warn: delete _PEFT_CHECKPOINTING in mmrl/library_noise.py")
    silenced = True
    assert wrap() == []
