"""The only places mmrl reaches into private parts of its model libraries (torch, accelerate,
transformers, diffusers, torchao), each because no public API does the job.
``tests/test_library_internals.py`` checks each against the installed library, so a release that
changes one fails there, by name, rather than somewhere in a distributed run.

The speed bench's adapters to other tools keep theirs beside the code that needs them, each with
its own test: TRL's private ``GRPOTrainer`` methods it times (``mmrl/bench/speed_trl.py``) and the
pandas shim that lets rliable import (``mmrl/bench/rliable_import.py``).
"""

from __future__ import annotations


def default_store():
    """The key-value store of torch.distributed's default process group (the launcher's c10d
    store, which outlives the ranks). torch exposes no public getter for it; the collective
    watchdog of :mod:`mmrl.core.distributed` records there which collective each rank entered."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def set_process_distributed_type(distributed_type) -> None:
    """Record ``distributed_type`` in accelerate's per-process state, as accelerate itself does at
    the end of ``AcceleratorState``'s set-up (``PartialState._shared_state``): an ``AcceleratorState``
    made later copies it from there. accelerate has no public setter; :func:`mmrl.core.sharding.enable_on_cpu`
    needs it to turn FSDP on over gloo, where accelerate falls back to DDP."""
    from accelerate import PartialState

    PartialState._shared_state["distributed_type"] = distributed_type


def no_split_modules(module) -> list[str] | None:
    """The layer classes a transformers model says must not be split across devices
    (``PreTrainedModel._no_split_modules``): accelerate's FSDP auto-wrap policy reads them from the
    prepared module to shard layer by layer, so :class:`mmrl.core.backend.TrainForward` forwards them."""
    return getattr(module, "_no_split_modules", None)


def keep_in_fp32_modules(model) -> set[str]:
    """The submodule names a diffusers / transformers class loads in float32 whatever ``torch_dtype``
    asks (``_keep_in_fp32_modules``, e.g. Wan's time embedding and norms): ``mmrl plan`` counts those
    weights as ``from_pretrained`` would load them (:mod:`mmrl.diffusion.memory_shape`)."""
    return set(type(model)._keep_in_fp32_modules or ())  # declared (None) on ModelMixin and PreTrainedModel


def storage_key(t) -> int:
    """One key per storage, the same for every view of it, on the meta device too (where every
    ``data_ptr`` is 0): the address of torch's ``StorageImpl`` (``UntypedStorage._cdata``: torch has no
    public identity of a storage). :mod:`mmrl.diffusion.measured_activations` counts each saved storage once."""
    return t.untyped_storage()._cdata


def attention_implementation(config) -> str:
    """The attention kernel a transformers model runs ("eager", "sdpa", "flash_attention_2", ...;
    "" when unset): ``PretrainedConfig._attn_implementation``, a property transformers fills from
    ``attn_implementation=`` at load, with no public getter. The VLM policy reads it to warn that
    ``train.padding_free`` without flash attention costs more than it saves."""
    return config._attn_implementation or ""


def can_compile_fullgraph(model) -> bool:
    """Whether transformers marks ``model``'s class as compilable with a static cache
    (``PreTrainedModel._can_compile_fullgraph``: "Models will auto-compile if this flag is set to
    True in inference, if a compilable cache is used"). transformers 5 has no other declared
    static-cache capability (``_supports_static_cache`` is gone); the hf rollout engine reads this
    before it asks ``generate`` for ``cache_implementation="static"``. ``PreTrainedModel`` declares it
    (False); a release without it raises AttributeError here rather than silently never compiling."""
    return bool(type(model)._can_compile_fullgraph)


def stochastic_rounding_adamw():
    """torchao's AdamW over bfloat16 weights (``train.optim=adamw_bf16_sr``): the class that takes
    ``bf16_stochastic_round=True``. torchao (0.18) exports it as ``torchao.optim._AdamW`` (listed in
    its ``__all__`` under that private-looking name, no public alias); the keyword and the float32
    ``lr`` tensor of its parameter groups are checked by ``tests/test_library_internals.py``."""
    from torchao.optim import _AdamW

    return _AdamW


# -- diffusers: FLUX's latent layout (the FLUX adapter, mmrl/diffusion/adapters/flux.py) ---------------
# FLUX's transformer reads latents as a sequence of 2x2 patches with a (0, row, column) id per patch;
# diffusers keeps the conversions as private static methods of FluxPipeline (no public helper), and
# the adapter must match them exactly to train the pipeline's own transformer.

def flux_pack_latents(latents):
    """(B, C, H, W) -> (B, H/2 * W/2, 4C): ``FluxPipeline._pack_latents``, patches row by row."""
    from diffusers import FluxPipeline

    b, c, h, w = latents.shape
    return FluxPipeline._pack_latents(latents, b, c, h, w)


def flux_unpack_latents(packed, height: int, width: int, vae_scale_factor: int):
    """(B, H/2 * W/2, 4C) -> (B, C, H, W) for an image of ``height`` x ``width`` pixels:
    ``FluxPipeline._unpack_latents``, the inverse of :func:`flux_pack_latents`."""
    from diffusers import FluxPipeline

    return FluxPipeline._unpack_latents(packed, height, width, vae_scale_factor)


def flux_latent_ids(batch: int, height: int, width: int, device, dtype):
    """The (height * width, 3) ids ``(0, row, column)`` of the packed patches of a ``height`` x
    ``width`` patch grid: ``FluxPipeline._prepare_latent_image_ids`` (``batch`` is unused there)."""
    from diffusers import FluxPipeline

    return FluxPipeline._prepare_latent_image_ids(batch, height, width, device, dtype)


def cache_kept_under_checkpointing(module):
    """A context in which ``module``'s checkpointed transformers layers keep a key/value cache they
    are handed. ``GradientCheckpointingLayer`` drops it unless the layer's class sets
    ``_can_checkpoint_with_cache`` (a layer that writes the cache would write it again when the
    backward pass recomputes it); :mod:`mmrl.vlm.shared_prefix` hands its layers caches whose
    updates answer that replay exactly as the first call, so it sets the flag on the instances for
    its two passes. Without checkpointing the flag is never read."""
    import contextlib

    from transformers.modeling_layers import GradientCheckpointingLayer

    @contextlib.contextmanager
    def kept():
        layers = [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer)
                  and "_can_checkpoint_with_cache" not in vars(m)]
        for layer in layers:
            layer._can_checkpoint_with_cache = True
        try:
            yield
        finally:
            for layer in layers:
                del layer._can_checkpoint_with_cache

    return kept()


# -- torch: the tensor memory of a step on any device (mmrl plan's validation) -------------------------

def tracked_peak_bytes(fn, *external) -> dict[str, int]:
    """Run ``fn()`` under torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``, a private
    module with no public equivalent that counts tensor memory on a CPU as on a GPU) and return the
    peak bytes of the tensors alive at once on each device (``{"cpu": n}``). ``external``: modules,
    optimizers and tensors made before ``fn`` (the weights, the optimizer state), counted from the
    start. Only the whole peak is kept: the tracker's per-module snapshots are switched off (its four
    module hooks), since they refuse a module called again from the top (every decoding step of
    ``generate``) and install gradient hooks a frozen parameter refuses (torch 2.14); without them
    gradients are counted under another kind, not left out. ``tests/test_memory_plan.py`` measures
    the plan's rows with it."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs):
            pass

        def _post_fw_hook(self, module, inputs, outputs):
            pass

        def _pre_bw_hook(self, module, args):
            pass

        def _post_bw_hook(self, module, args):
            pass

    tracker = PeakTracker()
    tracker.track_external(*external)
    with tracker:
        fn()
    return {str(device): snap["Total"] for device, snap in tracker.get_tracker_snapshot("peak").items()}


def keep_4bit_weights_unpacked(model) -> None:
    """Every bitsandbytes ``Linear4bit`` of ``model`` keeps its weight in bitsandbytes' standard layout on
    a CPU. bitsandbytes 0.50 repacks a weight, at its first forward in eval mode without gradients on a CPU
    with AVX512-BF16 (``Linear4bit.support_avx512bf16_for_cpu``), for an inference kernel that has no
    backward and computes in bfloat16; every later forward, training's too, then takes that kernel: after
    the first rollout a QLoRA step failed ("a view of a leaf Variable ... in-place operation") and the
    rollout forward no longer computed what training does (a layer of the tiny model: 5.6e-3 apart). Off, eval and
    training forwards are the same computation (dequantize, then matmul in the compute dtype)."""
    from bitsandbytes.nn import Linear4bit

    for module in model.modules():
        if isinstance(module, Linear4bit):
            module.support_avx512bf16_for_cpu = False


def link_zero_optimizer_state(engine) -> None:
    """Link each parameter's fragment of a ZeRO-1/2 optimizer's state (created by hand before the
    first step, to load a checkpoint into) to the flat partitions, as DeepSpeed itself does after
    its first step (``DeepSpeedZeroOptimizer._lazy_init_hp_params_optimizer_state``); DeepSpeed's
    public ``safe_set_full_optimizer_state`` then writes into it. :mod:`mmrl.core.zero` needs it to
    resume a ZeRO run; ZeRO-3 keeps no such links (its state is looked up at each access)."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if isinstance(engine.optimizer, DeepSpeedZeroOptimizer):
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()


def zero_flat_partitions(engine) -> list:
    """The flat float32 partitions a ZeRO optimizer hands to the torch optimizer it wraps (whose
    state is keyed by them): ZeRO-1/2's ``single_partition_of_fp32_groups``, ZeRO-3's
    ``fp32_partitioned_groups_flat``. DeepSpeed names them nowhere public; :mod:`mmrl.core.zero`
    creates their optimizer state to load a checkpoint before the first step."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    optimizer = engine.optimizer
    if isinstance(optimizer, DeepSpeedZeroOptimizer):
        return list(optimizer.single_partition_of_fp32_groups)
    if isinstance(optimizer, DeepSpeedZeroOptimizer_Stage3):
        return list(optimizer.fp32_partitioned_groups_flat)
    raise RuntimeError(f"{type(optimizer).__name__} is not one of DeepSpeed's ZeRO optimizers (a DeepSpeed release "
                       "renamed them; mmrl.core.library_internals.zero_flat_partitions must follow)")
