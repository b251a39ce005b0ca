"""``train.optim``: float32 master weights (adamw_torch, the default) or bfloat16 weights kept by
the optimizer (adamw_bf16: pure bf16, adamw_kahan: optimi's Kahan summation, adamw_bf16_sr: torchao's
stochastic rounding). What each keeps of small AdamW updates and what it costs in bytes
(``mmrl.bench.optimizers``), and that each trains through the policy's real path and checkpoints.

torchao compiles its optimizer step once per parameter shape (on a CPU, inductor builds C++ for
each: seconds per shape, 15 shapes in the tiny VLM). The fast tests run that same step eagerly
(``torch.compiler.set_stance("force_eager")``: the arithmetic of torchao's ``single_param_adam``,
uncompiled); the slow test runs ``mmrl bench optimizers`` compiled, as a user runs it.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from typer.testing import CliRunner

from conftest import make_config, tiny_run_config, tiny_trainer
from mmrl.bench.optimizers import measure
from mmrl.core.precision import trained_dtype
from mmrl.registry import OPTIMIZERS, UnknownNameError

OPTIMS = ("adamw_torch", "adamw_bf16", "adamw_kahan", "adamw_bf16_sr", "adamw_bnb_8bit", "paged_adamw_8bit")


@pytest.fixture
def eager_steps():
    """torchao's step run eagerly (module docstring)."""
    with torch.compiler.set_stance("force_eager"):
        yield


# -- the config key ---------------------------------------------------------------------------------

def test_the_default_is_float32_master_weights():
    cfg = make_config()
    assert cfg.train.optim == "adamw_torch"
    assert trained_dtype(cfg.train.optim, torch.bfloat16) == torch.float32
    assert set(OPTIMS) <= set(OPTIMIZERS.names())


def test_an_unknown_optimizer_lists_the_registered_ones():
    from mmrl.vlm.policy import VLMPolicy

    cfg = make_config("train.optim=adamw_bf61", "model.dtype=bfloat16")
    with pytest.raises(UnknownNameError) as err:
        VLMPolicy(cfg)  # refused before the model is loaded
    message = str(err.value)
    assert "train.optim" in message and "did you mean 'adamw_bf16'" in message
    assert all(name in message for name in OPTIMS), message


@pytest.mark.parametrize("optim", ["adamw_bf16", "adamw_kahan", "adamw_bf16_sr"])
def test_bf16_weights_need_a_bf16_compute_dtype(optim):
    for dtype in ("float32", "float16"):
        with pytest.raises(ValueError, match=rf"train.optim={optim} .*model.dtype=bfloat16, got model.dtype={dtype}"):
            trained_dtype(optim, {"float32": torch.float32, "float16": torch.float16}[dtype])
    assert trained_dtype(optim, torch.bfloat16) == torch.bfloat16
    assert trained_dtype("adamw_torch", torch.float32) == torch.float32  # master weights: any compute dtype


@pytest.mark.parametrize("optim, module, package", [("adamw_kahan", "optimi", "torch-optimi"),
                                                    ("adamw_bf16_sr", "torchao", "torchao"),
                                                    ("adamw_bnb_8bit", "bitsandbytes", "bitsandbytes")])
def test_a_missing_library_is_one_line_with_the_pip_command(optim, module, package, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails as if not installed
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(ImportError) as err:
        OPTIMIZERS.get(optim)([param], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, eps=1e-8)
    assert str(err.value) == f"train.optim={optim} needs the {package} package, which is not installed: " \
                             f"pip install {package}"


def test_fsdp2_with_mixed_precision_refuses_bf16_weights():
    """accelerate's FSDP2 upcasts trained weights to float32 when the accelerate config's
    mixed_precision is not "no" (shipped configs/accelerate/fsdp2.yaml: bf16): a bf16-weight
    optimizer would silently train float32 masters, so the strategy refuses it at setup."""
    from types import SimpleNamespace

    from mmrl.core.strategy import FSDP2

    def policy(optim):
        return SimpleNamespace(trained_dtype=trained_dtype(optim, torch.bfloat16), check_shardable=lambda backend: None,
                               cfg=SimpleNamespace(train=SimpleNamespace(optim=optim)))

    with pytest.raises(ValueError, match="train.optim=adamw_kahan .* mixed_precision: bf16 .* mixed_precision: 'no'"):
        FSDP2(SimpleNamespace(mixed_precision="bf16")).check(policy("adamw_kahan"))
    FSDP2(SimpleNamespace(mixed_precision="no")).check(policy("adamw_kahan"))
    FSDP2(SimpleNamespace(mixed_precision="bf16")).check(policy("adamw_torch"))


# -- the bench's facts, on a small stack ---------------------------------------------------------------

@pytest.fixture(scope="module")
def rows():
    """One layer of width 64 (65,536 weights), 20 steps at lr 1e-6 and 1e-5, every optimizer."""
    with torch.compiler.set_stance("force_eager"):
        return {row["optim"]: row for row in measure(OPTIMS, width=64, layers=1, steps=20, seed=0)}


@pytest.mark.slow
def test_bytes_per_trained_parameter(rows):
    """Weight + gradient + moments (+ compensation): float32 4 + 4 + 4 + 4 = 16; bf16 2 + 2 + 2 + 2 = 8
    (torch AdamW and torchao keep bf16 moments for bf16 weights); Kahan adds a bf16 buffer: 10. The
    step counters (one 4-byte scalar per tensor, 7 tensors over 65,536 weights) add 0.0004.
    bitsandbytes' 8-bit AdamW on float32 masters: 4 + 4 + 1 + 1 = 10, plus a float32 scale per block
    of 256 for each moment (8 / 256 = 0.03125) and each tensor's two quantization maps of 256 float32
    (2,048 bytes; 7 tensors over 65,536 weights: 0.21875): 10.25 (paged: the same bytes)."""
    expected = {"adamw_torch": 16, "adamw_bf16": 8, "adamw_kahan": 10, "adamw_bf16_sr": 8,
                "adamw_bnb_8bit": 10.25, "paged_adamw_8bit": 10.25}
    assert {k: round(rows[k]["bytes_per_param"], 2) for k in expected} == expected


@pytest.mark.slow
def test_one_small_step_changes_about_two_percent_of_bf16_weights(rows):
    """Adam's first step moves every weight by lr * m / sqrt(v) = lr: float32 masters keep it for
    every weight; a bf16 weight in [2^e, 2^(e+1)) is spaced 2^(e-7) and keeps 1e-6 by rounding to
    nearest only when |w| < 2^-11, P(|N(0, 0.02)| < 4.9e-4) = erf(4.9e-4 / (0.02 sqrt 2)) = 0.0195.
    Kahan rounds the first update alike (the rest waits in its compensation buffer); stochastic
    rounding moves a weight with probability lr / spacing, so more of them."""
    assert rows["adamw_torch"]["changed@1e-06"] == 1.0
    bf16 = rows["adamw_bf16"]["changed@1e-06"]
    assert 0.01 < bf16 < 0.03
    assert rows["adamw_kahan"]["changed@1e-06"] == pytest.approx(bf16, abs=0.002)
    assert rows["adamw_bf16_sr"]["changed@1e-06"] > 1.5 * bf16


def test_pure_bf16_loses_the_updates_that_kahan_and_stochastic_rounding_keep(rows):
    """After 20 steps with the float32-master trajectory r's gradients, from w0: the update kept,
    sum((w - w0)(r - w0)) / sum((r - w0)^2). Pure bf16 keeps almost nothing at lr 1e-6 (measured
    0.014) and a sixth at 1e-5 (0.160); stochastic rounding is unbiased: ~1 at both (65,536 weights:
    its noise moves the ratio by ~0.01); Kahan's weights are the bf16 rounding of r, as an autocast
    forward of float32 masters sees them, so it keeps what that rounding keeps (0.30 at 1e-6, where 20
    steps move a weight less than its bf16 spacing, 1.00 at 1e-5)."""
    yardstick = rows["bf16 of adamw_torch's masters"]
    for lr in ("1e-06", "1e-05"):
        assert rows["adamw_torch"][f"kept@{lr}"] == 1.0 and rows["adamw_torch"][f"deviation@{lr}"] == 0.0
        assert 0.9 < rows["adamw_bf16_sr"][f"kept@{lr}"] < 1.1
        assert rows["adamw_kahan"][f"kept@{lr}"] == pytest.approx(yardstick[f"kept@{lr}"], abs=0.01)
        # Kahan's weights are the bf16 rounding of r but where its bf16 moments tip a weight across a
        # rounding boundary (measured 0.2% and 1.2%); pure bf16's differ for 17% and 80%
        assert rows["adamw_kahan"][f"differs@{lr}"] < 0.02
        assert rows["adamw_bf16"][f"differs@{lr}"] > 0.1
    assert rows["adamw_bf16"]["kept@1e-06"] < 0.1 and rows["adamw_bf16"]["kept@1e-05"] < 0.3
    assert rows["adamw_kahan"]["kept@1e-05"] > 0.95
    # mean |w - r|: no bf16 weights are closer to r than its rounding; Kahan is that close, pure bf16
    # 4x further at lr 1e-5, stochastic rounding in between (unbiased, but up to a spacing of noise)
    floor = yardstick["deviation@1e-05"]
    assert rows["adamw_kahan"]["deviation@1e-05"] == pytest.approx(floor, rel=0.01)
    assert rows["adamw_bf16"]["deviation@1e-05"] > 3 * floor
    assert floor < rows["adamw_bf16_sr"]["deviation@1e-05"] < rows["adamw_bf16"]["deviation@1e-05"]


def test_the_bench_refuses_an_unknown_optimizer():
    from mmrl.cli import app

    result = CliRunner().invoke(app, ["bench", "optimizers", "--optims", "adamw_torch,adamw_kahn"])
    assert result.exit_code == 2
    assert "did you mean 'adamw_kahan'" in result.output and "adamw_bf16_sr" in result.output


@pytest.mark.slow
def test_the_bench_prints_the_table_with_torchaos_compiled_step():
    from mmrl.cli import app

    result = CliRunner().invoke(app, ["bench", "optimizers", "--width", "32", "--layers", "1", "--steps", "3"])
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if line.startswith("| adamw")]
    assert [line.split(" | ")[0] for line in table] == [f"| {name}" for name in OPTIMS[:5]]
    # bitsandbytes at width 32: the four 1,024-element projections keep 32-bit state (16 bytes each), the
    # three 4,096-element MLP weights 8-bit (10 + 1/32, and 2,048 bytes of maps each): 194,944 / 16,384
    assert [line.split(" | ")[1] for line in table] == ["16.00", "8.00", "10.00", "8.00", "11.90"]


# -- through the policy ------------------------------------------------------------------------------

def changed_fraction(before, after) -> float:
    return sum(int((a != b.detach()).sum()) for a, b in zip(before, after)) / sum(a.numel() for a in before)


def bf16_trainer(path, out, optim):
    return tiny_trainer(tiny_run_config(path, out, 1, "model.dtype=bfloat16", f"train.optim={optim}"))


@pytest.mark.slow
@pytest.mark.parametrize("optim, dtype, library", [("adamw_torch", torch.float32, "torch"),
                                                   ("adamw_bf16", torch.bfloat16, "torch"),
                                                   ("adamw_kahan", torch.bfloat16, "optimi"),
                                                   ("adamw_bf16_sr", torch.bfloat16, "torchao"),
                                                   ("adamw_bnb_8bit", torch.float32, "bitsandbytes"),
                                                   ("paged_adamw_8bit", torch.float32, "bitsandbytes")], ids=OPTIMS)
def test_each_optimizer_trains_the_tiny_vlm(optim, dtype, library, random_tiny_dir, tmp_path, eager_steps,
                                            one_thread):
    """model.dtype=bfloat16: the trained weights are kept in the dtype the option promises, one RL
    step (every sample's advantage 1, so every group has a gradient) has a finite loss and moves most
    weights (lr 1e-3: far above any bf16 spacing), and they keep their dtype."""
    trainer = bf16_trainer(random_tiny_dir, tmp_path, optim)
    policy = trainer.policy
    trained = policy.trainable_parameters()
    assert trained and {p.dtype for p in trained} == {dtype}
    assert type(policy.strategy.inner_optimizer).__module__.split(".")[0] == library
    before = [p.detach().clone() for p in trained]
    batch, _ = trainer.rollout_step(1)
    batch.advantages = torch.ones(len(batch))
    metrics = trainer.update(batch, 1)
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert metrics["skipped_update"] == 0.0
    assert changed_fraction(before, policy.trainable_parameters()) > 0.5
    assert {p.dtype for p in policy.trainable_parameters()} == {dtype}


@pytest.mark.slow
@pytest.mark.parametrize("optim, state_keys", [("adamw_kahan", {"exp_avg", "exp_avg_sq", "kahan_comp"}),
                                               ("adamw_bf16_sr", {"step", "exp_avg", "exp_avg_sq"})],
                         ids=["adamw_kahan", "adamw_bf16_sr"])
def test_a_checkpoint_restores_the_optimizer_state(optim, state_keys, random_tiny_dir, tmp_path, eager_steps,
                                                   one_thread):
    """After one step, save; a fresh policy loads it: the same weights and, for every trained
    parameter, the same optimizer state tensors (bf16 moments, Kahan's compensation, torchao's
    step), and the same learning rate."""
    trainer = bf16_trainer(random_tiny_dir, tmp_path / "a", optim)
    batch, _ = trainer.rollout_step(1)
    batch.advantages = torch.ones(len(batch))
    trainer.update(batch, 1)
    trainer.policy.save(tmp_path / "ckpt")
    saved = trainer.policy.optimizer.state_dict()

    restored = bf16_trainer(random_tiny_dir, tmp_path / "b", optim).policy
    restored.load(tmp_path / "ckpt")
    loaded = restored.optimizer.state_dict()
    assert saved["state"] and saved["state"].keys() == loaded["state"].keys()
    for index, state in saved["state"].items():
        assert set(state) >= state_keys and set(loaded["state"][index]) == set(state)
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                other = loaded["state"][index][key]
                assert other.dtype == value.dtype and torch.equal(other, value), (index, key)
    assert loaded["state"][0]["exp_avg"].dtype == torch.bfloat16
    assert float(loaded["param_groups"][0]["lr"]) == float(saved["param_groups"][0]["lr"])
    for (name, a), b in zip(trainer.policy.module.named_parameters(), restored.module.parameters()):
        assert a.dtype == b.dtype and torch.equal(a.detach(), b.detach()), name


# -- bitsandbytes' 8-bit AdamW ------------------------------------------------------------------------

BNB_CLASSES = {"adamw_bnb_8bit": "AdamW8bit", "adamw_8bit": "AdamW8bit", "paged_adamw_8bit": "PagedAdamW8bit"}


def bnb_weights(seed: int = 0) -> list[torch.nn.Parameter]:
    """A 128 x 64 weight (8,192 elements: 8-bit state) and a 64-element bias (under bitsandbytes'
    4,096-element minimum: 32-bit state)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(128, 64, generator=g) * 0.02), torch.nn.Parameter(torch.randn(64, generator=g))]


def bnb_steps(optimizer, params, steps: int, first: int = 0) -> None:
    """``steps`` steps with the gradients of steps ``first``, ``first + 1``, ...: seeded by the step."""
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()


def bnb_optimizer(name, params):
    return OPTIMIZERS.get(name)(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01, eps=1e-8)


@pytest.mark.parametrize("optim", BNB_CLASSES)
def test_an_8bit_optimizer_steps_as_bitsandbytes_own_class(optim):
    """train.optim's factory and bitsandbytes' own class with the same settings, five steps with the same
    gradients: the same weights and the same state to the bit (8-bit moments for the weight, 32-bit for
    the bias); the trained weights stay float32 masters. (On a CPU the paged one warns and runs unpaged.)"""
    import warnings

    import bitsandbytes as bnb

    ours, theirs = bnb_weights(), bnb_weights()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Paged optimizers are not supported on CPU")
        a = bnb_optimizer(optim, ours)
        b = getattr(bnb.optim, BNB_CLASSES[optim])(theirs, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01, eps=1e-8)
        bnb_steps(a, ours, 5)
        bnb_steps(b, theirs, 5)
    assert OPTIMIZERS.get(optim).master_weights and trained_dtype(optim, torch.bfloat16) == torch.float32
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
        assert a.state[p].keys() == b.state[q].keys()
        for key, value in a.state[p].items():
            assert torch.equal(value, b.state[q][key]) if isinstance(value, torch.Tensor) else value == b.state[q][key]
    assert a.state[ours[0]]["state1"].dtype == torch.uint8 and a.state[ours[1]]["state1"].dtype == torch.float32
    assert not torch.equal(ours[0], bnb_weights()[0])


def test_an_8bit_optimizer_resumes_exactly(tmp_path):
    """4 steps straight == 2 steps, the weights and the optimizer's state dict saved and loaded into a
    fresh optimizer, 2 more steps: identical weights (the 8-bit moments and their block scales
    survive the round trip)."""
    straight = bnb_weights()
    bnb_steps(bnb_optimizer("adamw_bnb_8bit", straight), straight, 4)

    first = bnb_weights()
    optimizer = bnb_optimizer("adamw_bnb_8bit", first)
    bnb_steps(optimizer, first, 2)
    torch.save({"weights": [p.detach() for p in first], "optimizer": optimizer.state_dict()}, tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    resumed = [torch.nn.Parameter(w.clone()) for w in saved["weights"]]
    optimizer = bnb_optimizer("adamw_bnb_8bit", resumed)
    optimizer.load_state_dict(saved["optimizer"])
    bnb_steps(optimizer, resumed, 2, first=2)
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)
