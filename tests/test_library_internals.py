"""The private parts of its model libraries that mmrl uses (:mod:`mmrl.core.library_internals`),
checked against the installed libraries: a release that renames or reshapes one fails here, by
name, instead of in the middle of a distributed run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from mmrl.core.library_internals import default_store, set_process_distributed_type, stochastic_rounding_adamw


def test_the_default_store_is_the_process_group_store(tmp_path):
    """A one-process gloo group: the adapter hands back its store, which keeps what the
    watchdog records (set / check / get)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        found = default_store()
        assert isinstance(found, dist.Store)
        found.set("mmrl/probe", "1")
        assert found.check(["mmrl/probe"]) and found.get("mmrl/probe") == b"1"
    finally:
        dist.destroy_process_group()


def test_a_recorded_distributed_type_survives_a_later_accelerator_state():
    """What :func:`mmrl.core.sharding.enable_on_cpu` relies on: after it turns an Accelerator's
    state to FSDP, an ``AcceleratorState()`` made later (accelerate makes them freely) reverts to
    the per-process type unless that was recorded too."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    seen = {}
    saved = dict(PartialState._shared_state), dict(AcceleratorState._shared_state)  # other tests' accelerators
    try:
        for record in (False, True):
            AcceleratorState._reset_state(reset_partial_state=True)
            accelerator = Accelerator(cpu=True)
            accelerator.state.distributed_type = DistributedType.FSDP
            accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()
            if record:
                set_process_distributed_type(DistributedType.FSDP)
            seen[record] = (AcceleratorState().distributed_type, PartialState().distributed_type)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        PartialState._shared_state.update(saved[0])
        AcceleratorState._shared_state.update(saved[1])
    assert seen[False] == (DistributedType.NO, DistributedType.NO)  # why the write is needed
    assert seen[True] == (DistributedType.FSDP, DistributedType.FSDP)


def test_transformers_marks_which_models_compile_with_a_static_cache():
    """The hf engine's static-cache check (``rollout.cache_implementation=static``) reads
    ``_can_compile_fullgraph``: declared on every transformers model (False by default), True for
    Qwen2.5-VL, False where transformers says the model cannot compile (IDEFICS)."""
    from transformers import IdeficsModel, PreTrainedModel, Qwen2_5_VLForConditionalGeneration

    from mmrl.core.library_internals import can_compile_fullgraph

    assert "_can_compile_fullgraph" in vars(PreTrainedModel) and PreTrainedModel._can_compile_fullgraph is False
    assert can_compile_fullgraph(Qwen2_5_VLForConditionalGeneration.__new__(Qwen2_5_VLForConditionalGeneration))
    assert not can_compile_fullgraph(IdeficsModel.__new__(IdeficsModel))


def test_torchaos_stochastic_rounding_adamw_takes_what_mmrl_passes():
    """``train.optim=adamw_bf16_sr``: torchao's ``_AdamW`` is a torch optimizer (accelerate wraps it,
    checkpoints read its state dict) taking ``bf16_stochastic_round``; its learning rate is a float32
    tensor that must be filled in place (its step refuses a float), which transformers' schedulers
    (torch's LambdaLR) do."""
    import inspect
    import warnings

    import pytest
    import torch
    from transformers import get_scheduler

    cls = stochastic_rounding_adamw()
    assert issubclass(cls, torch.optim.Optimizer)
    assert "bf16_stochastic_round" in inspect.signature(cls).parameters
    optimizer = cls([torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))], lr=1e-3, bf16_stochastic_round=True)
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dtype == torch.float32
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=4)
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": no step is needed here
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(7.5e-4)


def test_transformers_reports_the_attention_kernel_a_model_was_loaded_with():
    """The VLM policy's padding_free warning reads ``PretrainedConfig._attn_implementation`` (a
    property on every config): what ``attn_implementation=`` asked for at load, sdpa by default,
    "" on a bare config."""
    from transformers import AutoModelForCausalLM, PretrainedConfig, Qwen2Config

    from mmrl.core.library_internals import attention_implementation

    assert isinstance(vars(PretrainedConfig)["_attn_implementation"], property)
    assert attention_implementation(PretrainedConfig()) == ""
    small = Qwen2Config(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=16)
    for asked, expected in (("eager", "eager"), ("sdpa", "sdpa"), (None, "sdpa")):
        model = AutoModelForCausalLM.from_config(small, **({"attn_implementation": asked} if asked else {}))
        assert attention_implementation(model.config) == expected, asked


def test_diffusers_flux_latent_layout():
    """The FLUX adapter's packing, by hand: latents x[0, c, h, w] = 16c + 4h + w of shape (1, 2, 4, 4)
    pack into 4 tokens of 2 x 2 x 2 = 8 values, the 2x2 patches row by row, each patch channel-major:
    token 0 is the patch at rows 0-1, columns 0-1: c=0 -> 0, 1, 4, 5; c=1 -> 16, 17, 20, 21; token 1
    the patch at columns 2-3: 2, 3, 6, 7, 18, 19, 22, 23. Unpacking (a 32 x 32 image, VAE factor 8)
    gives x back exactly; the ids of a 2 x 2 patch grid are (0, row, column)."""
    import torch

    from mmrl.core.library_internals import flux_latent_ids, flux_pack_latents, flux_unpack_latents

    x = torch.arange(32, dtype=torch.float32).reshape(1, 2, 4, 4)
    packed = flux_pack_latents(x)
    assert packed.shape == (1, 4, 8)
    assert packed[0, 0].tolist() == [0, 1, 4, 5, 16, 17, 20, 21]
    assert packed[0, 1].tolist() == [2, 3, 6, 7, 18, 19, 22, 23]
    assert torch.equal(flux_unpack_latents(packed, 32, 32, 8), x)
    ids = flux_latent_ids(1, 2, 2, "cpu", torch.float32)
    assert ids.tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]] and ids.dtype == torch.float32


# -- that they are the only ones ---------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
# Modules allowed private names of other packages: this adapter, and the speed bench's adapters to the
# tools it compares against (each tested beside its code: tests/test_bench_speed.py, test_bench_stats.py).
ADAPTERS = {"mmrl/core/library_internals.py", "mmrl/bench/speed_trl.py", "mmrl/bench/rliable_import.py"}
# Python's own names that only look private: documented API (namedtuple's _replace, sys._getframe).
PYTHON_API = {"_replace", "_asdict", "_fields", "_make", "_getframe"}


def _private(name) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def _defined(trees) -> set[str]:
    """Every name mmrl binds itself: functions, classes, attributes and variables it assigns,
    arguments, keywords, import aliases (a private name among them is mmrl's own)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
    return names


def _foreign_private_uses(tree, own: set[str]) -> list[str]:
    """Private names ``tree`` takes from other packages: ``x._name`` and literal
    ``getattr(x, "_name")`` for a name mmrl does not define, and imports of ``_name``s or from
    ``_module``s of a package other than mmrl."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own | PYTHON_API:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and _private(node.args[1].value)
              and node.args[1].value not in own):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not node.module.startswith("mmrl"):
            if any(map(_private, node.module.split("."))) or any(_private(a.name) for a in node.names):
                found.append(f"line {node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if any(map(_private, a.name.split(".")))]
    return sorted(found, key=lambda f: int(f.split(":")[0].removeprefix("line ")))


def test_storage_key_names_a_storage_on_the_meta_device():
    """torch's private ``UntypedStorage._cdata`` (the plan's one use of a torch internal): the same for every
    view of a storage, different for another, where every meta ``data_ptr`` is 0."""
    from mmrl.core.library_internals import storage_key

    a, b = torch.empty(4, 8, device="meta"), torch.empty(4, 8, device="meta")
    assert a.data_ptr() == b.data_ptr() == 0
    assert storage_key(a) == storage_key(a.t()) == storage_key(a[1:]) == storage_key(a.view(32))
    assert storage_key(a) != storage_key(b)


def test_diffusers_says_which_modules_it_loads_in_float32(tmp_path):
    """``_keep_in_fp32_modules``: Wan's transformer names its time embedding and norms; what
    ``from_pretrained(torch_dtype=bfloat16)`` loads in float32 is what the plan counts in float32."""
    from diffusers import SD3Transformer2DModel, WanTransformer3DModel

    from mmrl.core.library_internals import keep_in_fp32_modules

    wan = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                out_channels=4, text_dim=8, freq_dim=8, ffn_dim=16, num_layers=1)
    kept = keep_in_fp32_modules(wan)
    assert "time_embedder" in kept and "norm3" in kept
    wan.save_pretrained(tmp_path)
    loaded = WanTransformer3DModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    dtypes = {n: p.dtype for n, p in loaded.named_parameters()}
    assert all((dt == torch.float32) == bool(kept & set(n.split("."))) for n, dt in dtypes.items()), dtypes
    assert keep_in_fp32_modules(SD3Transformer2DModel(num_layers=1, attention_head_dim=8, num_attention_heads=1,
                                                      caption_projection_dim=8, joint_attention_dim=8,
                                                      pooled_projection_dim=8, sample_size=8)) == set()


@pytest.mark.slow
def test_no_module_outside_the_adapters_uses_a_private_name_of_another_package():
    """What the module docstring promises: a new ``model.config._something`` elsewhere fails here,
    naming the file and line; move it into :mod:`mmrl.core.library_internals` with a test."""
    files = [*sorted((REPO / "mmrl").rglob("*.py")), *sorted((REPO / "tasks").glob("*.py")),
             *sorted((REPO / "rewards").glob("*.py"))]
    trees = {f.relative_to(REPO).as_posix(): ast.parse(f.read_text()) for f in files}
    own = _defined(trees.values())
    uses = {name: found for name, tree in trees.items() if name not in ADAPTERS
            if (found := _foreign_private_uses(tree, own))}
    assert not uses, f"private names of other packages outside mmrl/core/library_internals.py: {uses}"


def test_the_private_name_check_sees_what_it_looks_for():
    tree = ast.parse("a = cfg._attn_implementation\nb = getattr(m, '_no_split', None)\nc = self._mine\n"
                     "from diffusers.utils import _X\nimport pandas.util._decorators\nd = t._replace(x=1)\n")
    assert _foreign_private_uses(tree, own={"_mine"}) == [
        "line 1: ._attn_implementation", "line 2: getattr(..., '_no_split')",
        "line 4: from diffusers.utils import _X", "line 5: import pandas.util._decorators"]


def test_transformers_checkpointed_layers_keep_a_cache_only_when_told():
    """The shared prefix under ``train.gradient_checkpointing``: a ``GradientCheckpointingLayer`` in
    training drops the cache it is handed unless ``_can_checkpoint_with_cache`` (False on the class)
    says it may keep it; :func:`cache_kept_under_checkpointing` sets it on the instances and restores
    the class's answer after."""
    import functools

    import torch

    from transformers.modeling_layers import GradientCheckpointingLayer

    from mmrl.core.library_internals import cache_kept_under_checkpointing

    class Layer(GradientCheckpointingLayer):
        def forward(self, x, cache=None):
            self.seen = cache
            return x * 2

    layer = Layer()
    layer.gradient_checkpointing = True
    layer._gradient_checkpointing_func = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    x = torch.ones(2, requires_grad=True)
    assert GradientCheckpointingLayer._can_checkpoint_with_cache is False
    layer(x, cache="kv")
    assert layer.seen is None  # dropped
    with cache_kept_under_checkpointing(torch.nn.Sequential(layer)):
        layer(x, cache="kv")
        assert layer.seen == "kv"
    assert "_can_checkpoint_with_cache" not in vars(layer)


def test_bitsandbytes_4bit_layers_keep_their_layout_for_training():
    """What :func:`mmrl.core.library_internals.keep_4bit_weights_unpacked` switches off: bitsandbytes'
    CPU repacking of a 4-bit weight at an eval forward without gradients (``support_avx512bf16_for_cpu``).
    Switched off, the weight's bytes and quantization state are as quantized after such a forward, and a
    training forward after it computes what one before it did, gradient included."""
    import pytest
    import torch

    bnb = pytest.importorskip("bitsandbytes")
    from mmrl.core.library_internals import keep_4bit_weights_unpacked

    layer = bnb.nn.Linear4bit(128, 64, compute_dtype=torch.float32, quant_type="nf4")
    layer.load_state_dict(torch.nn.Linear(128, 64).state_dict())
    layer = layer.to("cpu").requires_grad_(False)
    assert hasattr(layer, "support_avx512bf16_for_cpu")  # the switch, as bitsandbytes 0.50 names it
    keep_4bit_weights_unpacked(torch.nn.Sequential(layer))
    assert layer.support_avx512bf16_for_cpu is False
    packed = layer.weight.data.clone()
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(0), requires_grad=True)
    before = layer.train()(x)
    (grad_before,) = torch.autograd.grad(before.sum(), x)
    with torch.no_grad():
        layer.eval()(x.detach())
    assert torch.equal(layer.weight.data, packed)
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)
    after = layer.train()(x)
    (grad_after,) = torch.autograd.grad(after.sum(), x)
    assert torch.equal(after, before) and torch.equal(grad_after, grad_before)


def test_the_memory_tracker_reports_the_peak_of_tensors_alive_at_once():
    """mmrl plan's validation measures CPU steps with torch's private MemTracker: the peak counts the
    tensors given from before (16 KiB) and the most alive at once inside (1 + 2 MiB), not the sum
    of all allocations (4 MiB); a module with a frozen parameter and one called twice are accepted."""
    import torch

    from mmrl.core.library_internals import tracked_peak_bytes

    held = torch.zeros(4096)
    layer = torch.nn.Linear(4, 4)
    layer.bias.requires_grad_(False)

    def fn():
        a = torch.zeros(2**18)
        b = torch.zeros(2**19)
        del a
        c = torch.zeros(2**18)
        layer(layer(torch.ones(1, 4))).sum().backward()
        del b, c

    peak = tracked_peak_bytes(fn, held, layer)["cpu"]
    assert 16 * 2**10 + 3 * 2**20 <= peak < 16 * 2**10 + 3 * 2**20 + 2**10


@pytest.mark.slow  # DeepSpeed's import and two engines: ~7 s
def test_deepspeeds_zero_partitions_take_an_optimizer_state_before_the_first_step(tmp_path, monkeypatch):
    """What :mod:`mmrl.core.zero` relies on to resume a ZeRO run, for ZeRO-2 and ZeRO-3 (one gloo
    group for both: DeepSpeed keeps the first it joins): the flat float32 partitions the torch
    optimizer steps (``zero_flat_partitions``), given an AdamW state by hand before any step and
    linked (``link_zero_optimizer_state``), take a parameter's moments through DeepSpeed's public
    ``safe_set_full_optimizer_state`` and give them back whole."""
    import torch

    deepspeed = pytest.importorskip("deepspeed", reason="DeepSpeed is in the fit extra")
    from deepspeed.utils import safe_get_full_optimizer_state, safe_set_full_optimizer_state

    from mmrl.core.library_internals import link_zero_optimizer_state, zero_flat_partitions

    for name, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)  # what DeepSpeed reads of a launcher
    # ZeRO-3's engine replaces torch.nn.functional.linear and torch.manual_seed for the rest of the process
    # (DeepSpeed's memory-efficient linear, its seeding): put them back after, or later tests run on them
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)
    monkeypatch.setattr(torch, "manual_seed", torch.manual_seed)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        for stage in (2, 3):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
            zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
            engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config={
                "train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "zero_allow_untested_optimizer": True})
            inner = engine.optimizer.optimizer
            flats = zero_flat_partitions(engine)
            assert flats and sum(f.numel() for f in flats) >= 3 * 4 + 4 + 4 * 2 + 2, stage
            assert not inner.state, stage  # torch's AdamW makes its state at the first step
            for flat in flats:
                inner.state[flat] = {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(flat),
                                     "exp_avg_sq": torch.zeros_like(flat)}
            link_zero_optimizer_state(engine)
            weight = engine.module[1].weight
            moment = torch.arange(8.0).reshape(2, 4)
            safe_set_full_optimizer_state(weight, moment, "exp_avg")
            assert torch.equal(safe_get_full_optimizer_state(weight, "exp_avg").reshape(2, 4), moment), stage
    finally:
        dist.destroy_process_group()
