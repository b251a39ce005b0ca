"""Mixed precision on CPU (autocast to bfloat16 works there): ``model.dtype=bfloat16`` keeps float32
master weights for what is trained and bf16 for what is frozen, and a step at lr 1e-6 moves most
trained weights, where bf16 weights would keep ~98% of them unchanged. The same checks run on CUDA in
tests/test_gpu.py (see tests/precision_checks.py)."""

from __future__ import annotations

import pytest

from precision_checks import check_generator_bf16_step, check_master_weights_contrast, check_vlm_bf16_step


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Tiny models: one thread (see ``diffusion_fixtures.one_thread``)."""


def test_vlm_bf16_step_keeps_float32_master_weights(random_tiny_dir):
    check_vlm_bf16_step(random_tiny_dir, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["tiny_flow_dir", "sd3_dir"])
def test_generator_bf16_step_keeps_float32_master_weights(generator, request):
    check_generator_bf16_step(request.getfixturevalue(generator), "cpu")


def test_bf16_weights_lose_most_small_adamw_updates():
    check_master_weights_contrast("cpu")
