"""Rewards are strict about their options, as the estimators are: a reward's options are the
parameters it names (or a set it declares), the per-call context (``group_ids``) is passed apart
from them, and a ``task.reward_kwargs`` key a reward does not take stops the run at setup with the
reward's name and its options."""

from __future__ import annotations

import pytest
import torch

import mmrl.core.reward_computer
import mmrl.registry
from mmrl import make_task, register_reward
from mmrl.config import ConfigError, load_config
from mmrl.core.reward_computer import RewardComputer, make_reward_computer
from mmrl.registry import REWARDS, Registry


SEEN: list[dict] = []


def partial_color(completions, examples, partial: float = 0.0):
    """A plugin reward written the public way: its one option is ``partial``; no ``**ctx``."""
    return [1.0 if ex["color"] in c else partial for c, ex in zip(completions, examples)]


def open_context(completions, examples, **kwargs):
    """A reward that reads its option through ``**kwargs`` (as one forwarding them to a library
    would) and declares it; its ``**kwargs`` also receives the per-call context."""
    SEEN.append(dict(kwargs))
    return [float(kwargs.get("scale", 1.0))] * len(completions)


def group_size(completions, examples, group_ids=None):
    """Names the context it needs, and nothing else: its group's size per sample."""
    ids = group_ids.tolist()
    return [float(ids.count(g)) for g in ids]


@pytest.fixture(autouse=True)
def rewards():
    """The test rewards, registered in a copy of the reward registry for this test only: other
    test files call every registered reward (the fuzz test) with arguments these do not take."""
    registry: Registry = Registry("reward")
    for name in REWARDS.names():
        registry.register(name, REWARDS.get(name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mmrl.registry, "REWARDS", registry)
        mp.setattr(mmrl.core.reward_computer, "REWARDS", registry)
        register_reward("test_opts_partial")(partial_color)
        register_reward("test_opts_open", options=("scale",))(open_context)
        register_reward("test_opts_group")(group_size)
        yield registry


def _setup(*overrides: str):
    """What the trainer does at setup: the task from the config, then its reward computer."""
    cfg = load_config(None, list(overrides))
    return make_reward_computer(make_task(cfg.task.name, **cfg.task.options), cfg.task)


def test_a_misspelt_reward_option_stops_setup_naming_the_reward_and_its_options():
    with pytest.raises(ConfigError, match=r"^task.reward_kwargs.format: the format reward takes no mdoe "
                                          r"\(it takes: mode\)$"):
        _setup("task.rewards.format=1.0", "task.reward_kwargs.format.mdoe=lenient")
    with pytest.raises(ConfigError, match=r"^task.reward_kwargs.iou: the iou reward takes no alpha \(it takes: "
                                          r"no options\)$"):
        _setup("task.name=grounding", "task.reward_kwargs.iou.alpha=0.5")
    # an image reward also takes per_frame's clip reduction, and a misspelling of it is caught alike
    assert RewardComputer({"brightness": 1.0}, {"brightness": {"frames": "min", "target": 0.5}}).kwargs
    with pytest.raises(ConfigError, match=r"the brightness reward takes no frame \(it takes: target, frames\)"):
        RewardComputer({"brightness": 1.0}, {"brightness": {"frame": "min"}})


def test_the_options_of_a_mixture_source_are_checked_under_its_key():
    with pytest.raises(ConfigError, match=r"^task.options.reward_kwargs.grounding.format: the format reward "
                                          r"takes no mdoe \(it takes: mode\)$"):
        _setup("task.name=mixture", "task.options.tasks.counting.train_size=2",
               "task.options.tasks.grounding.train_size=2",
               "task.options.reward_kwargs.grounding.format.mdoe=lenient")


def test_the_context_is_not_an_option():
    with pytest.raises(ConfigError, match=r"the ttrv_agreement reward takes no group_ids \(it takes: no options\)"):
        RewardComputer({"ttrv_agreement": 1.0}, {"ttrv_agreement": {"group_ids": [0]}})
    with pytest.raises(TypeError, match="reward context step is not declared"):
        RewardComputer({"format": 1.0})(["x"], [{}], step=3)


def test_a_plugin_reward_declared_the_public_way_scores_with_its_option():
    """Two completions, one naming the colour: 1.0 for it, ``partial`` 0.25 for the other. The
    trainer's ``group_ids`` is context the reward does not take, so it is not passed to it."""
    rewards = _setup("task.rewards.test_opts_partial=1.0", "task.reward_kwargs.test_opts_partial.partial=0.25")
    total, _, stats = rewards(["a red one", "blue"], [{"color": "red"}] * 2, group_ids=torch.tensor([0, 0]))
    assert total.tolist() == [1.0, 0.25] and "reward/test_opts_partial/errors" not in stats
    with pytest.raises(ConfigError, match=r"the test_opts_partial reward takes no partal \(it takes: partial\)"):
        _setup("task.rewards.test_opts_partial=1.0", "task.reward_kwargs.test_opts_partial.partal=0.25")


def test_a_reward_that_takes_open_context_gets_its_declared_options_and_the_context():
    SEEN.clear()
    ids = torch.tensor([3, 3])
    total, _, _ = RewardComputer({"test_opts_open": 1.0}, {"test_opts_open": {"scale": 0.5}})(["a", "b"], [{}, {}],
                                                                                               group_ids=ids)
    assert total.tolist() == [0.5, 0.5] and SEEN == [{"scale": 0.5, "group_ids": ids}]
    with pytest.raises(ConfigError, match=r"the test_opts_open reward takes no sacle \(it takes: scale\)"):
        RewardComputer({"test_opts_open": 1.0}, {"test_opts_open": {"sacle": 0.5}})


def test_a_reward_that_names_the_context_receives_it(rewards):
    """Groups 0, 0, 1: group sizes 2, 2, 1."""
    total, _, _ = RewardComputer({"test_opts_group": 1.0})(["a", "b", "c"], [{}] * 3, group_ids=torch.tensor([0, 0, 1]))
    assert total.tolist() == [2.0, 2.0, 1.0]
    assert rewards.get("test_opts_group").reward_options == ()


def test_a_declared_option_the_reward_cannot_read_is_refused_at_registration(rewards):
    def closed(completions, examples, scale: float = 1.0):
        return [scale] * len(completions)

    with pytest.raises(ValueError, match=r"register_reward\('test_opts_bad', options=...\): shift cannot be an option"):
        register_reward("test_opts_bad", options=("scale", "shift"))(closed)
    with pytest.raises(ValueError, match="group_ids cannot be an option"):
        register_reward("test_opts_bad", options=("group_ids",))(lambda completions, examples, **kw: [])
    assert "test_opts_bad" not in rewards


def test_every_built_in_reward_declares_its_options():
    """Each built-in reward's options are exactly the parameters it names after (completions,
    examples), with ``frames`` for the image rewards; spot-checked by hand for four of them."""
    expected = {"format": ("mode",), "accuracy": (), "brightness": ("target", "frames"),
                "gui_g1_box": ("alpha", "beta", "normalize"), "pixel_reasoner_curiosity": ("threshold",)}
    for name, options in expected.items():
        assert REWARDS.get(name).reward_options == options, name
    for name in REWARDS.names():
        assert "group_ids" not in REWARDS.get(name).reward_options, name


def test_every_built_in_reward_names_what_it_takes():
    """No built-in reward takes ``**kwargs``: its signature is its options and the context it uses.
    Only the three that compare a group's samples (Pixel Reasoner's curiosity bonus, TTRV's
    agreement and entropy) name ``group_ids``, so only they are handed the trainer's groups, and
    ``http``, which forwards them to the reward it serves."""
    import inspect

    built_in = [name for name in REWARDS.names()
                if inspect.unwrap(REWARDS.get(name)).__module__.startswith("mmrl.rewards.")]
    assert len(built_in) >= 44
    for name in built_in:
        params = inspect.signature(inspect.unwrap(REWARDS.get(name))).parameters.values()
        assert not any(p.kind is p.VAR_KEYWORD for p in params), name
    takes_groups = {name for name in built_in if REWARDS.get(name).reward_context}
    assert takes_groups == {"pixel_reasoner_curiosity", "ttrv_agreement", "ttrv_low_entropy", "http"}
    assert all(REWARDS.get(name).reward_context == ("group_ids",) for name in takes_groups)
