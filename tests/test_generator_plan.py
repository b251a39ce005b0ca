"""``mmrl plan`` for every generator family (issue 56 item 4): each adapter's ``plan_inputs`` is the call its
``velocity`` makes, the meta-device measurement equals the same count on real tensors, and the plan of each
recipe on its checkpoint's published shape (tests/published_shapes/) is the family table's row.

``python tests/test_generator_plan.py`` prints the family table (what tests/published_shapes/README.md and
docs/generators.md hold)."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import torch

from diffusion_fixtures import build_tiny_flux, build_tiny_sd3, build_tiny_wan
from flux2_builders import build_tiny_flux2, build_tiny_flux_kontext
from qwen_image_builders import build_tiny_qwen_image, build_tiny_qwen_image_edit
from wan22_builders import build_tiny_wan22
from wan_i2v_builders import build_tiny_wan21_i2v
from z_image_builders import build_tiny_z_image

pytestmark = pytest.mark.slow  # every test here takes over half a second on the 2-core CPU

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ROOT / "tests" / "published_shapes"

# family -> (builder, height, width, frames, the velocity's extra arguments)
FAMILIES = {
    "sd3": (build_tiny_sd3, 32, 32, None, False),
    "flux": (build_tiny_flux, 16, 16, None, False),
    "flux_kontext": (build_tiny_flux_kontext, 16, 16, None, True),
    "flux2": (build_tiny_flux2, 32, 32, None, False),
    "qwen_image": (build_tiny_qwen_image, 32, 32, None, False),
    "qwen_image_edit": (build_tiny_qwen_image_edit, 32, 32, None, True),
    "z_image": (build_tiny_z_image, 32, 32, None, False),
    "wan": (build_tiny_wan, 16, 16, 9, False),
    "wan22": (build_tiny_wan22, 16, 16, 9, False),
    "wan_i2v": (build_tiny_wan21_i2v, 16, 16, 9, True),
}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """The tiny pipelines run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    from mmrl.diffusion.adapters import load_pipeline

    cache = {}

    def get(family):
        if family not in cache:
            pipe = load_pipeline(str(FAMILIES[family][0](tmp_path_factory.mktemp(family))))
            if family == "qwen_image_edit":  # the pipeline's 1 MP condition takes minutes on a CPU: 64 x 64 px
                pipe.condition_area = 64 * 64
            cache[family] = pipe
        return cache[family]

    return get


def _expert(pipe):
    """The diffusers transformer the adapter calls (Wan 2.2: the high-noise expert of the pair)."""
    return pipe.pipe.transformer


def _planner(pipe) -> type:
    """The adapter class, with the instance's ``condition_area`` (the plan reads the class's)."""
    return type(type(pipe).__name__, (type(pipe),), {"condition_area": pipe.condition_area}) \
        if hasattr(pipe, "condition_area") else type(pipe)


def _configs(pipe) -> dict:
    return {k: dict(v.config) for k, v in pipe.pipe.components.items()
            if isinstance(v, torch.nn.Module) and isinstance(getattr(v, "config", None), dict)}


def _layout(value):
    """What a call's argument is, shapes for values: tensors by shape and dtype class, lists item by item."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype.is_floating_point)
    if isinstance(value, (list, tuple)):
        return [_layout(v) for v in value]
    return value


def _velocity_call(pipe, family, batch, guidance):
    """The transformer's arguments in ``pipe.velocity`` (bound by name), and the latent shape it was given."""
    _, height, width, frames, conditioned = FAMILIES[family]
    shape = pipe.latent_shape(height, width, frames)
    calls = []
    transformer = _expert(pipe)
    signature = inspect.signature(transformer.forward)
    hook = transformer.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(signature.bind(*args, **kwargs).arguments), with_kwargs=True)
    extra = {"images": torch.rand(batch, 3, height, width)} if conditioned else {}
    try:
        with torch.no_grad():
            pipe.velocity(torch.randn(batch, *shape), torch.full((batch,), 0.95), ["a red cube"] * batch, guidance,
                          **extra)
    finally:
        hook.remove()
    return calls[0], shape


def _text_tokens(pipe, family, call) -> int:
    """The prompt embedding's length in the call (the plan assumes the longest prompt; the test a short one)."""
    if family == "z_image":
        return call["cap_feats"][0].shape[0]
    if family == "qwen_image_edit":
        edit = _planner(pipe)
        vision = (round(c / edit.VISION_PIXELS) for c in edit.plan_condition(*FAMILIES[family][1:3]))
        return call["encoder_hidden_states"].shape[1] - next(vision) * next(vision)
    return call["encoder_hidden_states"].shape[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_inputs_are_the_call_velocity_makes(pipelines, family):
    """At the tiny pipeline's size: the adapter's ``plan_latent_shape`` (from configs) is its ``latent_shape``,
    and ``plan_inputs`` gives the transformer the arguments ``velocity`` gives it (every tensor's shape, the
    lists, ``img_shapes``), with and without classifier-free guidance (the batch doubled, where the family
    batches it)."""
    pipe = pipelines(family)
    _, height, width, frames, _ = FAMILIES[family]
    for batch, guidance in ((2, 1.0), (1, 4.0)):
        call, shape = _velocity_call(pipe, family, batch, guidance)
        assert tuple(_planner(pipe).plan_latent_shape(_configs(pipe), height, width, frames)) == tuple(shape)
        n = len(call["timestep" if "timestep" in call else "t"])
        planned = _planner(pipe).plan_inputs(_configs(pipe), n, shape, _text_tokens(pipe, family, call),
                                         _expert(pipe).dtype, "cpu")
        seen = {k: _layout(v) for k, v in call.items() if k in planned}
        if seen.get("encoder_hidden_states_mask") is not None:  # Qwen: the empty prompt padded to the prompt's
            seen["encoder_hidden_states_mask"] = None  # length; the plan takes every prompt at the longest: no mask
        if family == "z_image":  # Z-Image's captions unpadded: the empty prompt's is shorter; the plan's the longest
            seen["cap_feats"] = [max(seen["cap_feats"], key=lambda layout: layout[1])] * n
        if family == "wan_i2v":  # the CLIP features' length is the image encoder's (257 for ViT-H/14 at 224 px)
            seen["encoder_hidden_states_image"] = seen["encoder_hidden_states_image"][:2] + (True,)
            planned["encoder_hidden_states_image"] = call["encoder_hidden_states_image"]
        assert {k: _layout(v) for k, v in planned.items() if k in call} == seen
        assert set(planned) <= set(call)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lora", [False, True])
def test_the_meta_measurement_is_the_count_on_real_tensors(pipelines, family, lora):
    """The saved bytes counted on the meta device (no storage, no compute) equal the same hook's count on
    the tiny pipeline's real CPU transformer, byte for byte: every block's, outside them, the blocks' inputs,
    and the widest tensor of a sampling forward."""
    from peft import LoraConfig

    from mmrl.diffusion.measured_activations import measure, widest_tensor

    pipe = pipelines(family)
    _, height, width, frames, _ = FAMILIES[family]
    shape = tuple(type(pipe).plan_latent_shape(_configs(pipe), height, width, frames))
    real = copy.deepcopy(_expert(pipe))
    with torch.device("meta"):
        meta = type(real).from_config(real.config)
    for model in (real, meta):
        model.requires_grad_(not lora)
        if lora:
            with torch.device(next(model.parameters()).device):
                model.add_adapter(LoraConfig(r=2, target_modules=list(pipe.lora_targets)))
    def inputs(model, device):
        configs = {**_configs(pipe), "transformer": dict(model.config)}
        return _planner(pipe).plan_inputs(configs, 2, shape, 7, torch.float32, device)

    counts = [measure(m, inputs(m, device)) for m, device in ((real, "cpu"), (meta, "meta"))]
    assert counts[0] == counts[1] and counts[0].stored(False) > 0 and counts[0].stored(True) > 0
    widest = [widest_tensor(m, inputs(m, device)) for m, device in ((real, "cpu"), (meta, "meta"))]
    assert widest[0] == widest[1] > 0


# -- the family table ------------------------------------------------------------------------------------------
RECIPES = {  # recipe -> (family, published shape)
    "sd3_5_medium": ("SD3.5", "sd3_5_medium"),
    "flux1_kontext_edit": ("FLUX.1-Kontext", "flux1_kontext_dev"),
    "z_image_turbo_lora": ("Z-Image", "z_image_turbo"),
    "qwen_image_lora": ("Qwen-Image", "qwen_image"),
    "qwen_image_edit_lora": ("Qwen-Image-Edit", "qwen_image_edit"),
    "flux2_dev_lora": ("FLUX.2", "flux2_dev"),
    "wan2_2_t2v_a14b_lora": ("Wan 2.2 T2V", "wan2_2_t2v_a14b"),
    "wan2_1_i2v_lora": ("Wan 2.1 I2V", "wan2_1_i2v_14b_480p"),
}
HEADER = ("| family | checkpoint | transformer | latents per sample | text tokens | steps | recipe's mode | peak GiB "
          "| activations GiB per sample | full fine-tuning peak GiB | fits one 80 GB GPU |")


def plan_row(recipe: str) -> str:
    """The family table's row of ``recipe`` on its published shape, planned for one 80 GB GPU."""
    import dataclasses

    from mmrl.cli.plan import configured_mode, plans
    from mmrl.config import builtin_config_path, load_config
    from mmrl.core.memory_plan import GIB, plan
    from mmrl.core.precision import compute_dtype

    family, folder = RECIPES[recipe]
    cfg = load_config(builtin_config_path(f"diffusion/{recipe}"), [f"model.path={SHAPES / folder}"])
    shape, rows = plans(cfg, 80 * GIB, modality="diffusion")
    mine = rows[0]
    full = plan(shape, dataclasses.replace(configured_mode(cfg), lora=False), compute_dtype(cfg.model.dtype),
                80 * GIB)
    mode = ("LoRA r=%d" % cfg.model.lora.r if mine.mode.lora else "full") + \
        (" + checkpointing" if mine.mode.checkpointing else "")
    per_sample = mine.rows["activations"] / shape.micro_batch / GIB
    tokens = shape.text_tokens
    return (f"| {family} | `{folder}` | {shape.trainable / 1e9:.2f} B | {' x '.join(map(str, shape.latent_shape))} "
            f"| {tokens} | {cfg.diffusion.num_steps} | {mode} | {mine.peak / GIB:.1f} | {per_sample:.2f} | "
            f"{full.peak / GIB:.1f} | {'yes' if mine.fits else 'no'} |")


def _tables() -> dict[str, dict[str, str]]:
    """The family table's rows by checkpoint folder, in every document that holds it."""
    found = {}
    for doc in (SHAPES / "README.md", ROOT / "docs" / "generators.md"):
        if doc.is_file() and HEADER in doc.read_text():
            lines = doc.read_text().split(HEADER, 1)[1].splitlines()[2:]
            rows = [line for line in lines[:next((i for i, x in enumerate(lines) if not x.startswith("|")),
                                                 len(lines))]]
            found[str(doc.relative_to(ROOT))] = {row.split("|")[2].strip(" `"): row for row in rows}
    return found


SIZES = {"qwen_image": "20.43", "qwen_image_edit": "20.43", "flux2_dev": "32.22", "z_image_turbo": "6.15", "wan2_1_i2v_14b_480p": "16.39",
         "flux1_kontext_dev": "11.90", "wan2_2_t2v_a14b": "28.58", "sd3_5_medium": "2.24"}  # billions, published


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_family_table_is_the_plan(recipe):
    """The recipe's plan on its checkpoint's published shape is the row the docs print (regenerate with
    ``python tests/test_generator_plan.py``), and the transformer (Wan 2.2: both experts) has its published size."""
    tables = _tables()
    assert "tests/published_shapes/README.md" in tables
    folder = RECIPES[recipe][1]
    row = plan_row(recipe)
    for doc, rows in tables.items():
        assert rows.get(folder) == row, f"{doc}'s row of {folder} is not the plan: {row}"
    assert row.split("|")[3].strip() == f"{SIZES[folder]} B"


if __name__ == "__main__":
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for name in RECIPES:
        print(plan_row(name))
