"""The private parts of torch and accelerate that mmrl uses (:mod:`mmrl.core.library_internals`),
checked against the installed libraries: a release that renames or reshapes one fails here, by
name, instead of in the middle of a distributed run."""

from __future__ import annotations

import torch.distributed as dist

from mmrl.core.library_internals import default_store, set_process_distributed_type


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
