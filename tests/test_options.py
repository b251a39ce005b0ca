"""Every option means something: registered functions have explicit signatures, config keys they
do not take are errors at setup naming what they do take, and a registered name is never replaced
silently."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mmrl.config import ConfigError, load_config
from mmrl.config.options import check_options, takes_any_keyword
from mmrl.registry import (ADVANTAGES, KL_SCHEDULES, LOSSES, PERTURBATIONS, PROMPT_SAMPLERS, REWARDS, SDE_SAMPLERS,
                           SELECTIONS, Registry, register_reward)

EXPLICIT = {"advantage estimator": ADVANTAGES, "loss": LOSSES, "data sampler": PROMPT_SAMPLERS,
            "batch selection": SELECTIONS, "KL schedule": KL_SCHEDULES, "SDE sampler": SDE_SAMPLERS,
            "image perturbation": PERTURBATIONS}


@pytest.mark.parametrize("kind", EXPLICIT)
def test_no_registered_function_swallows_unknown_keywords(kind):
    registry = EXPLICIT[kind]
    loose = [name for name in registry.names() if takes_any_keyword(registry.get(name))]
    assert not loose, f"{kind}s with **kwargs (a typo would pass silently): {loose}"


def test_check_options_names_the_key_the_unknown_and_what_is_taken():
    def schedule(step, beta, total_steps, beta_end: float = 0.0):
        return beta

    check_options(schedule, ["beta_end"], "algo.kl_schedule_kwargs", "the s schedule", ("step", "beta", "total_steps"))
    with pytest.raises(ConfigError, match=r"^algo.kl_schedule_kwargs: the s schedule takes no beta_ned "
                                          r"\(it takes: beta_end\)$"):
        check_options(schedule, ["beta_ned"], "algo.kl_schedule_kwargs", "the s schedule",
                      ("step", "beta", "total_steps"))


def test_kl_schedule_and_sampler_options_are_checked():
    from mmrl.core.batch.prompts import make_sampler
    from mmrl.core.schedules import check_kl_schedule

    check_kl_schedule("grpo_d", {"beta_min": 0.0, "ramp_frac": 0.5})
    with pytest.raises(ConfigError, match="the linear_decay KL schedule takes no beta_min"):
        check_kl_schedule("linear_decay", {"beta_min": 0.0})
    with pytest.raises(ConfigError, match=r"data.sampler_kwargs: the dump sampler takes no windw \(it takes: window"):
        make_sampler("dump", {"a": 3, "b": 3}, 2, 0, windw=10)


def _check_batch_options(*overrides: str):
    from mmrl.core.batch.checks import check_stages

    policy = SimpleNamespace(capabilities={"image_inputs", "teacher_forcing"})
    check_stages(load_config(None, list(overrides)), policy)


def test_perturbation_options_are_checked_per_kind():
    _check_batch_options("data.perturbation=rotation", "data.perturbation_kwargs.max_angle=10")
    _check_batch_options("data.perturbation=random", "data.perturbation_kwargs.max_mix=0.2")
    with pytest.raises(ConfigError, match=r"the rotation perturbation takes no max_mix \(it takes: max_angle\)"):
        _check_batch_options("data.perturbation=rotation", "data.perturbation_kwargs.max_mix=0.2")
    with pytest.raises(ConfigError, match="the random perturbation takes no max_angel"):
        _check_batch_options("data.perturbation=random", "data.perturbation_kwargs.max_angel=10")
    with pytest.raises(ValueError, match="set without a data.perturbation"):
        _check_batch_options("data.perturbation_kwargs.max_angle=10")


def test_a_users_reward_under_a_builtin_name_is_refused():
    builtin = REWARDS.get("iou")
    with pytest.raises(ValueError, match=r"reward 'iou' is already registered by mmrl.rewards.iou.iou; register "
                                         r".*under another name, or pass override=True"):
        @register_reward("iou")
        def iou(completions, examples, **ctx):
            return [0.0] * len(completions)
    assert REWARDS.get("iou") is builtin


def test_the_same_definition_registered_twice_is_harmless_and_override_replaces():
    registry: Registry = Registry("thing")

    def make():
        def thing():
            return 1
        return thing

    first, again = make(), make()  # one definition (same module and qualname), two objects
    registry.register("t", first)
    registry.register("t", again)  # a plugin file imported twice
    assert registry._items["t"] is again

    def other():
        return 2

    with pytest.raises(ValueError, match="already registered"):
        registry.register("t", other)
    registry.register("t", other, override=True)
    assert registry._items["t"] is other


def test_the_image_scorers_use_the_one_registry():
    from mmrl.rewards import model_scorers

    assert isinstance(model_scorers._SCORERS, Registry) and "aesthetic_mlp" in model_scorers.scorer_names()
    with pytest.raises(ValueError, match="image scorer 'aesthetic_mlp' is already registered"):
        @model_scorers.register_scorer("aesthetic_mlp")
        def loader(path, device):
            return None
