"""``diffusion.pipeline_options``: a diffusers family's own options reach its adapter (Wan 2.2's
``guidance_scale_2``, every adapter's ``max_sequence_length``); an option the family does not take
is refused before anything loads, naming the ones it does; the tiny generators take none."""

from __future__ import annotations

import pytest

from conftest import make_config
from mmrl.config import ConfigError
from mmrl.diffusion.adapters import load_pipeline
from mmrl.diffusion.policy import DiffusionPolicy
from qwen_image_builders import build_tiny_qwen_image_edit
from wan22_builders import build_tiny_wan22


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny pipelines run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.mark.slow
def test_options_reach_the_adapter_and_unknown_ones_name_the_valid(sd3_dir, tmp_path):
    assert load_pipeline(str(sd3_dir), options={"max_sequence_length": 32}).max_sequence_length == 32
    with pytest.raises(ValueError, match=r"StableDiffusion3Pipeline \(SD3Adapter\) takes no \['guidance_scale_2'\]; "
                                         r"its options: \['max_sequence_length'\]"):
        load_pipeline(str(sd3_dir), options={"guidance_scale_2": 3.0})
    wan22 = load_pipeline(str(build_tiny_wan22(tmp_path / "wan22")), options={"guidance_scale_2": 3.0})
    assert wan22.guidance_scale_2 == 3.0
    # configs/diffusion/qwen_image_edit_lora.yaml: condition_area null conditions at the output size
    edit = load_pipeline(str(build_tiny_qwen_image_edit(tmp_path / "edit")), options={"condition_area": None})
    assert edit.condition_area is None and edit.condition_size(48, 32) == (48, 32)


def test_the_policy_passes_the_configs_options(sd3_dir, tiny_flow_dir):
    cfg = make_config(f"model.path={sd3_dir}", "train.device=cpu", "task.name=composition",
                      "diffusion.pipeline_options.max_sequence_length=16")
    assert DiffusionPolicy(cfg).pipe.max_sequence_length == 16
    cfg = make_config(f"model.path={tiny_flow_dir}", "train.device=cpu", "task.name=composition",
                      "diffusion.pipeline_options.max_sequence_length=16")
    with pytest.raises(ConfigError, match="tiny generators take no options"):
        DiffusionPolicy(cfg)
