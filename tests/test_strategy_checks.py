"""What the launch strategies (mmrl/core/strategy.py) refuse at setup, naming the backend, and who
judges a step's gradients under DeepSpeed: its engine, whose partitions hold them (``p.grad`` is
None), so mmrl reads the verdict of its step (mmrl/core/zero.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from mmrl.core import zero
from mmrl.core.strategy import FSDP2, ZeRO3, DeepSpeed


def vlm_policy(four_bit=None, engine: str = "hf"):
    """A VLMPolicy with only what the strategies' checks read (no model loaded)."""
    from mmrl.vlm.policy import VLMPolicy

    policy = VLMPolicy.__new__(VLMPolicy)
    policy.four_bit = four_bit
    policy.trained_dtype = torch.float32
    policy.cfg = SimpleNamespace(rollout=SimpleNamespace(engine=engine),
                                 train=SimpleNamespace(optim="adamw_torch", max_grad_norm=1.0))
    return policy


def zero_accelerator(stage: int, config: dict | None = None):
    plugin = SimpleNamespace(zero_stage=stage, deepspeed_config=config or {})
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin), mixed_precision="no")


@pytest.mark.parametrize("strategy, backend", [(FSDP2(SimpleNamespace(mixed_precision="no")), "FSDP2"),
                                               (DeepSpeed(zero_accelerator(2)), "DeepSpeed ZeRO-2"),
                                               (ZeRO3(zero_accelerator(3)), "DeepSpeed ZeRO-3")])
def test_the_sharded_strategies_refuse_a_4bit_base_and_vllm_naming_their_backend(strategy, backend):
    with pytest.raises(NotImplementedError) as err:
        strategy.check(vlm_policy(four_bit=object()))
    assert str(err.value) == (f"{backend} with model.load_in_4bit=true is not supported (bitsandbytes' 4-bit "
                              "weights have not been sharded or partitioned): run it in one process")
    with pytest.raises(NotImplementedError) as err:
        strategy.check(vlm_policy(engine="vllm"))
    assert str(err.value) == (f"{backend} with rollout.engine=vllm is not supported yet (the engine's weight "
                              "sync reads whole weights): use rollout.engine=hf or DDP")
    strategy.check(vlm_policy())  # HF generate on whole trained weights: accepted


@pytest.mark.parametrize("config, keys", [
    ({"zero_optimization": {"stage": 2, "compute_grad_norm": False}}, "zero_optimization.compute_grad_norm"),
    ({"bf16": {"enabled": True, "check_grad_overflow": False}}, "bf16.check_grad_overflow"),
    ({"bfloat16": {"enabled": True, "check_grad_overflow": "false"}, "zero_optimization": {"compute_grad_norm": False}},
     "zero_optimization.compute_grad_norm and bf16.check_grad_overflow")])
def test_deepspeed_settings_under_which_its_step_judges_nothing_are_refused(config, keys):
    """DeepSpeed 0.19.8 (stage_1_and_2.py's step): without the norm (compute_grad_norm: false) a
    float32 step has no overflow check at all, and a bf16 one without check_grad_overflow takes a NaN
    norm for a finite one and applies it: mmrl's skip would never happen."""
    with pytest.raises(ValueError, match=f"sets {keys} to false: .* remove it$"):
        zero.configure(zero_accelerator(2, config), 1.0)
    settings = {"zero_optimization": {"stage": 2, "compute_grad_norm": True}, "bf16": {"enabled": True}}
    zero.configure(zero_accelerator(2, settings), 1.0)  # DeepSpeed's defaults judge
    assert settings["gradient_clipping"] == 1.0 and settings["managed_gradient_accumulation"] is False


@pytest.mark.slow  # DeepSpeed's import and four engines: ~10 s
def test_deepspeeds_step_skips_a_non_finite_update_and_mmrl_reads_its_verdict(tmp_path):
    """One process, one gloo group (DeepSpeed keeps the first it joins), the engine as
    :func:`mmrl.core.zero.configure` sets it (mmrl steps it, clipping at 1), ZeRO-2 and ZeRO-3, in
    float32 and bf16: a finite step is applied (the weights move, the engine's norm is the
    gradient's, nothing named); a NaN loss, and a finite loss whose gradient is inf, leave the
    weights as they were, and the verdict names the loss, or the norm; the next finite step applies."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the fit extra")
    # A fresh interpreter: DeepSpeed keeps the first process group it joins for the life of the
    # process, and an earlier test's (tests/test_library_internals.py) is gone by now.
    env = {**os.environ, "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}  # what DeepSpeed reads of a launcher
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import test_strategy_checks as t; t.deepspeed_step_cases({str(tmp_path)!r})")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]


def deepspeed_step_cases(folder: str) -> None:
    """The cases of the test above, in the process that runs them."""
    import deepspeed

    dist.init_process_group("gloo", init_method=f"file://{Path(folder) / 'store'}", rank=0, world_size=1)
    try:
        deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        for stage in (2, 3):
            for bf16 in (False, True):
                case = (stage, bf16)
                config = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
                          "zero_allow_untested_optimizer": True, "bf16": {"enabled": bf16}}
                zero.configure(SimpleNamespace(state=SimpleNamespace(
                    deepspeed_plugin=SimpleNamespace(deepspeed_config=config))), 1.0)
                torch.manual_seed(0)
                model = torch.nn.Linear(3, 1, bias=False)
                engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                                  config=config)
                dtype = torch.bfloat16 if bf16 else torch.float32
                x = torch.tensor([[1.0, 2.0, 2.0]], dtype=dtype)

                def weights():
                    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
                        return engine.module.weight.detach().float().clone()

                def step(scale: float = 1.0, poison: float | None = None):
                    out = engine(x).float().sum()
                    if poison is not None:  # a finite loss whose gradient is not
                        out.register_hook(lambda g: g * poison)
                    loss = out * scale
                    engine.backward(loss)
                    return zero.step(engine, float(loss))

                before = weights()
                norm, cause = step()  # d(w.x)/dw = x, whose norm is 3
                assert cause is None and abs(float(norm) - 3.0) < 1e-6, case
                moved = weights()
                assert not torch.equal(moved, before), case
                norm, cause = step(float("nan"))
                assert cause == "the loss is nan" and math.isnan(float(norm)), case
                assert torch.equal(weights(), moved), case
                norm, cause = step(poison=float("inf"))
                assert cause == "the gradient norm DeepSpeed computed is not finite (its step skipped the update)"
                assert torch.equal(weights(), moved), case
                norm, cause = step()
                assert cause is None and math.isfinite(float(norm)), case
                assert not torch.equal(weights(), moved), case
    finally:
        dist.destroy_process_group()
