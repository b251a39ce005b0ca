"""`mmrl build-tiny NAME` is one registry (:data:`mmrl.registry.TINY_MODELS`): every row names a
builder that takes its recipe, a recipe that has the key ``--steps`` sets, and a shipped asset."""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from assets import asset_path
from mmrl.cli import app
from mmrl.config.tiny_models import _named, tiny_checkpoints
from mmrl.registry import TINY_MODELS


@pytest.mark.parametrize("name", TINY_MODELS.names())
def test_each_row_names_a_builder_that_takes_its_recipe(name):
    model = TINY_MODELS.get(name)
    builder, recipe = _named(model.builder), _named(model.recipe)
    parameters = inspect.signature(builder).parameters
    assert set(recipe) | {"seed"} <= set(parameters), f"{model.builder} does not take {set(recipe) - set(parameters)}"
    assert model.steps_key in recipe
    assert asset_path(model.asset).is_dir()


def test_steps_and_vision_steps_replace_the_recipe_values(monkeypatch, tmp_path):
    """What a row's builder is called with (the builder replaced by a recorder)."""
    import mmrl.vlm.tiny_builders as sft

    calls = []
    monkeypatch.setattr(sft, "build_tiny_gui", lambda out, **kw: calls.append((out, kw)) or out)
    TINY_MODELS.get("gui").build(tmp_path, seed=3, steps=5, vision_steps=7)
    TINY_MODELS.get("gui").build(None, seed=0)
    (out, kw), (default_out, default_kw) = calls
    assert out == tmp_path and kw == {**sft.TINY_GUI_RECIPE, "sft_steps": 5, "vision_steps": 7, "seed": 3}
    assert default_out == asset_path("tiny-qwen2.5-vl-gui") and default_kw == {**sft.TINY_GUI_RECIPE, "seed": 0}


def test_an_unknown_tiny_model_lists_the_table():
    r = CliRunner().invoke(app, ["build-tiny", "nope"], prog_name="mmrl")
    assert r.exit_code == 2 and all(name in r.output for name in TINY_MODELS.names())


@pytest.mark.parametrize("modality", ["vlm", "diffusion"])
def test_each_model_path_name_loads_its_shipped_asset(modality):
    """The ``model.path`` names of the shipped tiny models come from the same rows: each resolves, through
    its policy's loader, to its row's asset, and names the command that rebuilds it; no name is claimed
    twice within a modality."""
    from mmrl.diffusion.loading import generator_dir
    from mmrl.vlm.loading import resolve_model_path

    rows = [model for _, model in TINY_MODELS.items() if model.modality == modality]
    names = tiny_checkpoints(modality)
    assert len(names) == sum(len(model.paths) for model in rows) and "tiny" in names
    resolve = generator_dir if modality == "diffusion" else resolve_model_path
    for path, (asset, command) in names.items():
        assert str(resolve(path)) == str(asset_path(asset)), path
        assert command.split()[:2] == ["mmrl", "build-tiny"] and TINY_MODELS.get(command.split()[2]).asset == asset
