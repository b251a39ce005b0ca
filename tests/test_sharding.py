"""The single-process parts of :mod:`mmrl.core.sharding` (the sharded runs themselves are in
tests/test_distributed.py): optimizer state re-keyed by parameter name loads back exactly, tied
parameters are found, the backend is named for the refusal message, peft's adapter keys are
placed in the module."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mmrl.core import sharding


def _stepped(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)  # a frozen parameter: not in the optimizer, names must skip it
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=0.1)
    for _ in range(2):
        model(torch.randn(5, 3)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_optimizer_state_by_name_loads_back_into_a_fresh_optimizer_exactly():
    model, opt = _stepped(0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    by_name = sharding.optimizer_state_by_name(opt.state_dict(), names)
    assert sorted(by_name["state"]) == sorted(names) == ["0.weight", "2.bias", "2.weight"]

    fresh_model, _ = _stepped(1)
    fresh = torch.optim.AdamW([p for p in fresh_model.parameters() if p.requires_grad], lr=0.1)
    sharding.load_full_optimizer_state(fresh_model, fresh, by_name)
    want, got = opt.state_dict(), fresh.state_dict()
    assert want["state"].keys() == got["state"].keys()
    for i, state in want["state"].items():
        for key, value in state.items():
            assert torch.equal(value, got["state"][i][key]), (i, key)
    # what the checkpoint reader gets back from torch's own helper, keyed by name too
    assert sorted(sharding.full_optimizer_state(fresh_model, fresh)["state"]) == sorted(names)


def test_tied_duplicates_names_the_second_occurrence_only():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(5, 3)
            self.head = torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    assert sharding.tied_duplicates(Tied()) == {"head.weight"}
    assert sharding.tied_duplicates(torch.nn.Linear(2, 2)) == set()


def test_backend_names_fsdp_by_version():
    from accelerate.utils import DistributedType

    def accel(kind, version=None):
        return SimpleNamespace(distributed_type=kind,
                               state=SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=version)))

    assert sharding.backend(accel(DistributedType.FSDP, 2)) == "FSDP2"
    assert sharding.backend(accel(DistributedType.FSDP, 1)) == "FSDP1"
    assert sharding.backend(accel(DistributedType.MULTI_CPU)) == "MULTI_CPU"
    assert sharding.backend(accel(DistributedType.DEEPSPEED)) == "DEEPSPEED"


def test_adapter_keys_are_peft_saved_keys_mapped_to_the_module(random_tiny_dir):
    """What a sharded LoRA run loads its adapter file through: each key peft writes, placed at the
    module's own key (the adapter name put back)."""
    from peft import get_peft_model_state_dict

    from conftest import make_config
    from mmrl.vlm.policy import VLMPolicy

    module = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu",
                                   "model.lora.enabled=true")).module
    keys = sharding.adapter_keys(module)
    assert keys.keys() == get_peft_model_state_dict(module).keys() and keys
    own = module.state_dict()
    for saved, key in keys.items():
        assert key in own and key.replace(".default", "") == saved
