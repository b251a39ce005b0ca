"""``mmrl bench optimizers``: what each ``train.optim`` costs in memory and keeps of small updates.

Every optimizer steps the same weights with the same gradients, on a model-shaped stack of Linear
weights (per layer: the four attention projections, width x width, and a gated MLP of 4 x width),
drawn N(0, 0.02) and rounded to bfloat16 (as a bf16 checkpoint holds them), so every run starts
from identical values. The weights are kept in the dtype :func:`mmrl.core.precision.trained_dtype`
gives the optimizer (float32 masters for ``adamw_torch``, bfloat16 otherwise) and the optimizer is
built by its registered factory, as a policy builds it. The gradient of step t is a fixed direction
plus noise of the same size, both N(0, 1) and seeded, float32 for float32 masters and rounded to
bfloat16 for bf16 weights (as a backward pass gives them).

Per optimizer:

- bytes per trained parameter: the bytes of the weights, their gradients and every tensor of the
  optimizer state (moments, Kahan compensation, step counters) after one step, over the number of
  weights;
- changed by one step: the fraction of the stored weights (float32 masters, or the bf16 weights)
  whose value one step at that learning rate changed;
- after ``steps`` steps, against the float32-master trajectory ``r`` (``adamw_torch``, the same
  gradients) from the start ``w0``: the **update kept**, sum((w - w0) * (r - w0)) / sum((r - w0)^2)
  (1: the weights moved as float32 masters do; 0: every update lost), the **mean absolute
  deviation** mean|w - r|, and the share of weights whose bf16 value **differs from the bf16
  rounding of r** (what an autocast forward of ``adamw_torch`` computes with).

The last row is the yardstick of the bf16 options: the bf16 rounding of the float32 masters, the
weights an autocast forward of ``adamw_torch`` computes with. No bf16 weights can be closer to ``r``
than they are on average.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mmrl.core.optimizer import ADAM_EPSILON
from mmrl.core.precision import trained_dtype
from mmrl.registry import OPTIMIZERS

# paged_adamw_8bit is adamw_bnb_8bit on a CPU (bitsandbytes warns and does not page): one row for both
OPTIMS = ("adamw_torch", "adamw_bf16", "adamw_kahan", "adamw_bf16_sr", "adamw_bnb_8bit")
REFERENCE = "adamw_torch"
YARDSTICK = "bf16 of adamw_torch's masters"
LEARNING_RATES = (1e-6, 1e-5)


def layer_shapes(width: int) -> list[tuple[int, int]]:
    """One transformer layer's Linear weights: q, k, v, o (width x width), gate and up
    (4 width x width), down (width x 4 width)."""
    return [(width, width)] * 4 + [(4 * width, width)] * 2 + [(width, 4 * width)]


def starting_weights(shapes: Sequence[tuple[int, int]], seed: int) -> list[torch.Tensor]:
    """N(0, 0.02) weights, rounded to bfloat16 and held in float32."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g) * 0.02).bfloat16().float() for shape in shapes]


def gradient_stream(shapes: Sequence[tuple[int, int]], seed: int) -> Callable[[], list[torch.Tensor]]:
    """A function returning step t's gradients on its t-th call: a fixed N(0, 1) direction plus
    N(0, 1) noise, the same sequence for every stream of the same seed."""
    g = torch.Generator().manual_seed(seed + 1)
    direction = [torch.randn(shape, generator=g) for shape in shapes]
    return lambda: [d + torch.randn(d.shape, generator=g) for d in direction]


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor of the optimizer's per-parameter state."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))


@dataclass
class Trajectory:
    """One optimizer's run over the stack: the stored weights after the first and the last step
    (as float32) and its bytes per trained parameter after the first step."""

    first: list[torch.Tensor]
    last: list[torch.Tensor]
    bytes_per_param: float


def run(optim: str, start: Sequence[torch.Tensor], lr: float, steps: int, seed: int) -> Trajectory:
    """``steps`` steps of ``train.optim=optim`` at ``lr`` from ``start`` with the seeded gradients."""
    dtype = trained_dtype(optim, torch.bfloat16)
    params = [torch.nn.Parameter(w.to(dtype, copy=True)) for w in start]
    optimizer = OPTIMIZERS.get(optim, "train.optim")(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0,
                                                       eps=ADAM_EPSILON)
    grads = gradient_stream([tuple(w.shape) for w in start], seed)
    first: list[torch.Tensor] = []
    size = 0.0
    for step in range(steps):
        for p, g in zip(params, grads()):
            p.grad = g.to(dtype)
        optimizer.step()
        if step == 0:
            first = [p.detach().float().clone() for p in params]
            stored = sum(p.numel() * p.element_size() + p.grad.numel() * p.grad.element_size() for p in params)
            size = (stored + state_bytes(optimizer)) / sum(p.numel() for p in params)
    return Trajectory(first, [p.detach().float().clone() for p in params], size)


def changed_fraction(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> float:
    return sum(int((a != b).sum()) for a, b in zip(before, after)) / sum(a.numel() for a in before)


def update_kept(start, weights, reference) -> float:
    """sum((w - w0) * (r - w0)) / sum((r - w0)^2): the share of the reference's movement made."""
    num = sum(float(((w - s) * (r - s)).double().sum()) for s, w, r in zip(start, weights, reference))
    den = sum(float(((r - s) ** 2).double().sum()) for s, r in zip(start, reference))
    return num / den


def mean_abs_deviation(weights, reference) -> float:
    total = sum(float((w - r).abs().double().sum()) for w, r in zip(weights, reference))
    return total / sum(w.numel() for w in weights)


def measure(optims: Sequence[str] = OPTIMS, width: int = 256, layers: int = 2, steps: int = 20,
            learning_rates: Sequence[float] = LEARNING_RATES, seed: int = 0) -> list[dict]:
    """One row per optimizer (and the yardstick row): ``bytes_per_param`` and, per learning rate
    ``lr``, ``changed@lr``, ``kept@lr``, ``deviation@lr`` and ``differs@lr`` (module docstring)."""
    torch.manual_seed(seed)  # torchao's stochastic rounding draws from torch's default generator
    start = starting_weights(layer_shapes(width) * layers, seed)
    rows = {name: {"optim": name} for name in (*optims, YARDSTICK)}
    for lr in learning_rates:
        reference = run(REFERENCE, start, lr, steps, seed)
        runs = {name: reference if name == REFERENCE else run(name, start, lr, steps, seed) for name in optims}
        rounded = Trajectory([w.bfloat16().float() for w in reference.first],
                             [w.bfloat16().float() for w in reference.last], float("nan"))
        for name, traj in (*runs.items(), (YARDSTICK, rounded)):
            rows[name].update({"bytes_per_param": traj.bytes_per_param,
                               f"changed@{lr:g}": changed_fraction(start, traj.first),
                               f"kept@{lr:g}": update_kept(start, traj.last, reference.last),
                               f"deviation@{lr:g}": mean_abs_deviation(traj.last, reference.last),
                               f"differs@{lr:g}": changed_fraction([w.bfloat16().float() for w in traj.last],
                                                                   rounded.last)})
    return list(rows.values())


def format_table(rows: Sequence[dict], steps: int, learning_rates: Sequence[float] = LEARNING_RATES) -> str:
    """The rows as a markdown table."""
    lrs = [f"{lr:g}" for lr in learning_rates]
    head = (["train.optim", "bytes / trained param"] + [f"changed by 1 step, lr {lr}" for lr in lrs]
            + [f"update kept after {steps} steps, lr {lr}" for lr in lrs]
            + [f"mean abs deviation after {steps} steps, lr {lr}" for lr in lrs]
            + [f"differs from bf16 of the masters after {steps} steps, lr {lr}" for lr in lrs])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        size = row["bytes_per_param"]
        cells = ([row["optim"], "" if size != size else f"{size:.2f}"]
                 + [f"{row[f'changed@{lr}']:.1%}" for lr in lrs] + [f"{row[f'kept@{lr}']:.3f}" for lr in lrs]
                 + [f"{row[f'deviation@{lr}']:.2e}" for lr in lrs] + [f"{row[f'differs@{lr}']:.1%}" for lr in lrs])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_optimizer_bench(optims: Sequence[str] = OPTIMS, width: int = 256, layers: int = 2, steps: int = 20,
                        seed: int = 0, echo: Callable[[str], None] = print) -> list[dict]:
    """Measure every optimizer side by side and print the table."""
    for name in optims:
        OPTIMIZERS.get(name, "--optims")  # an unknown name stops before any work, listing the known ones
    rows = measure(optims, width, layers, steps, LEARNING_RATES, seed)
    params = sum(a * b for a, b in layer_shapes(width)) * layers
    echo(f"{layers} layers of width {width} ({params:,} weights, N(0, 0.02)), {steps} AdamW steps, seed {seed}; "
         f"float32 masters for adamw_torch, bfloat16 weights otherwise:")
    echo(format_table(rows, steps))
    return rows
