"""An option that does not apply to the model being trained, or that names something not built,
stops the run at setup with the key in the message: it is never silently ignored."""

from __future__ import annotations

import pytest

from conftest import make_config
from mmrl.api import make_policy
from mmrl.core.trainer import Trainer, build_task


def _setup(*overrides, recipe="vlm/counting_tiny"):
    from mmrl.config import builtin_config_path

    cfg = make_config("train.device=cpu", *overrides, path=builtin_config_path(recipe))
    task = build_task(cfg)
    return Trainer(cfg, make_policy(cfg, task), task)


@pytest.mark.parametrize("override,key", [
    ("diffusion.num_steps=4", "diffusion.num_steps"),
    ("diffusion.sampler=cps", "diffusion.sampler"),
])
def test_generator_keys_on_a_vlm_run_are_refused(override, key):
    with pytest.raises(ValueError, match=rf"{key}=.*not used by a VLMPolicy"):
        _setup(override)


@pytest.mark.parametrize("override,key", [
    ("vlm.max_pixels=3136", "vlm.max_pixels"),
    ("rollout.temperature=0.7", "rollout.temperature"),
    ("data.perturbation=rotation", "data.perturbation"),
    ("model.load_in_4bit=true", "model.load_in_4bit"),  # the 4-bit base is the VLM's only
])
def test_vlm_keys_on_a_generator_run_are_refused(override, key):
    with pytest.raises(ValueError, match=rf"{key}=.*not used by a DiffusionPolicy"):
        _setup(override, recipe="diffusion/composition_tiny")


def test_an_engine_that_is_not_built_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match=r"unknown rollout engine 'nope' for rollout.engine.*known: hf"):
        _setup("rollout.engine=nope")


def test_a_generator_loss_on_a_vlm_is_refused():
    with pytest.raises(ValueError, match=r"algo.loss_type='awm' needs \['flow_matching_logps'\].*valid losses here"):
        _setup("algo.loss_type=awm")


def test_a_whole_sequence_loss_on_a_generator_is_refused():
    """GSPO's sequence ratio needs all of a sample's actions in one call; a generator's loss is
    computed one denoising step at a time."""
    with pytest.raises(ValueError, match=r"algo.loss_type='gspo' needs \['whole_sequences'\]"):
        _setup("algo.loss_type=gspo", recipe="diffusion/composition_tiny")
