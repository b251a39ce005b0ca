"""The policy interface is complete and the launch stays inside the strategy objects.

- mmrl/core calls nothing on a policy that :class:`mmrl.core.protocol.Policy` does not declare
  (read from the source: ``policy.X`` and ``self.policy.X``), and the built-in policies have every
  member it declares (an optional one where they declare its capability);
- both built-in policies are registered with ``register_policy``, and ``make_policy`` picks by the
  task's modality through that registry;
- no code outside :mod:`mmrl.core.strategy` branches on whether the weights are sharded.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import mmrl
from mmrl.core.protocol import OPTIONAL_MEMBERS, Policy

ROOT = Path(mmrl.__file__).resolve().parent
# PolicyBase's own parts: they implement the protocol on a PolicyBase, they do not call a policy.
POLICY_BASE_MODULES = {"policy.py", "policy_checkpoint.py", "strategy.py", "reference.py"}


def protocol_members() -> set[str]:
    names = set(Policy.__annotations__)
    names |= {n for n, v in vars(Policy).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def attributes_called_on_a_policy(source: str) -> set[str]:
    """``X`` of every ``policy.X`` / ``self.policy.X`` in ``source``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "policy") or \
                (isinstance(owner, ast.Attribute) and owner.attr == "policy"):
            found.add(node.attr)
    return found


def test_the_reader_finds_calls_on_a_policy():
    source = "def f(policy):\n    policy.rollout(x)\n    self.policy.score(b)\n    other.save()\n"
    assert attributes_called_on_a_policy(source) == {"rollout", "score"}


def test_core_calls_nothing_the_protocol_does_not_declare():
    declared = protocol_members()
    undeclared = {}
    for path in sorted((ROOT / "core").rglob("*.py")):
        if path.parent.name == "core" and path.name in POLICY_BASE_MODULES:
            continue
        extra = attributes_called_on_a_policy(path.read_text(encoding="utf-8")) - declared
        if extra:
            undeclared[str(path.relative_to(ROOT))] = sorted(extra)
    assert not undeclared, f"core calls policy attributes the Policy protocol does not declare: {undeclared}"


@pytest.mark.parametrize("modality", ["vlm", "diffusion"])
def test_the_builtin_policies_are_registered_and_implement_the_protocol(modality):
    from mmrl.registry import POLICIES

    cls = POLICIES.get(modality)
    assert cls.modality == modality
    required = {n for n in protocol_members() if n not in OPTIONAL_MEMBERS or OPTIONAL_MEMBERS[n] in cls.capabilities}
    missing = sorted(n for n in required if not hasattr(cls, n))
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_make_policy_picks_by_the_task_modality_through_the_registry(monkeypatch):
    from mmrl.api import make_policy
    from mmrl.registry import POLICIES, UnknownNameError, register_policy

    made = []

    @register_policy("test_modality")
    class Recorder:
        @classmethod
        def for_task(cls, cfg, task):
            made.append((cfg, task.name))
            return cls()

    class Task:
        name, modality = "a_task", "test_modality"

    try:
        assert isinstance(make_policy("cfg", Task()), Recorder) and made == [("cfg", "a_task")]
        Task.modality = "no_such_modality"
        with pytest.raises(UnknownNameError, match="a_task"):
            make_policy("cfg", Task())
    finally:
        POLICIES._items.pop("test_modality")


@pytest.mark.slow
def test_no_code_outside_the_strategies_branches_on_sharding():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "core" / "strategy.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in ("sharded", "FSDP2", "DDP", "DeepSpeed", "ZeRO3"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"launch-specific branches outside mmrl/core/strategy.py: {offenders}"


def test_the_policy_base_reads_no_launch_specific_state():
    from mmrl.core.policy import PolicyBase

    source = inspect.getsource(PolicyBase)
    assert "sharding." not in source and "accelerator" not in source


@pytest.mark.slow
def test_the_policies_are_imported_only_when_their_registry_is_consulted():
    """Other lookups (a task, a reward: what a CLI error or `mmrl list --help` needs) stay cheap: the
    policy modules import transformers' and diffusers' models only when a policy is looked up."""
    import subprocess
    import sys

    code = ("import sys, mmrl\nfrom mmrl.registry import POLICIES, TASKS\nTASKS.names()\n"
            "before = 'mmrl.vlm.policy' in sys.modules or 'mmrl.diffusion.policy' in sys.modules\n"
            "POLICIES.names()\nprint(before, 'mmrl.vlm.policy' in sys.modules and 'mmrl.diffusion.policy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]
