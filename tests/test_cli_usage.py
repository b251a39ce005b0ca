"""The command line explains itself: usage lines with overrides and examples, the shipped recipes,
every modality a user tries, and one-line errors (with the install line of a missing extra)."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mmrl.cli import app
from mmrl.extras import EXTRA_OF_MODULE, install_hint
from mmrl.config.recipes import recipe_names

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [["train"], ["eval"], ["report"], ["sft"], ["list"], ["build-tiny"], ["demo"],
            ["bench", "algos"], ["bench", "diffusion"], ["bench", "speed"], ["bench", "rollout"],
            ["bench", "optimizers"], ["bench", "async"]]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), prog_name="mmrl")


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_shows_three_examples_of_the_command(command):
    r = _invoke(*command, "--help")
    assert r.exit_code == 0, r.output
    examples = r.output[r.output.index("Examples:"):]
    runs = [line for line in examples.splitlines() if line.strip().startswith(f"mmrl {' '.join(command)}")]
    assert len(runs) >= 3, examples


@pytest.mark.parametrize("command", [["train"], ["bench", "algos"], ["bench", "speed"]], ids=" ".join)
def test_usage_line_shows_the_recipe_and_overrides(command):
    usage = _invoke(*command, "--help").output.splitlines()[0]
    assert usage.startswith(f"Usage: mmrl {' '.join(command)}") and "CONFIG.yaml KEY=VALUE" in usage, usage


def test_eval_help_describes_its_arguments():
    out = _invoke("eval", "--help").output
    assert "a run directory, one checkpoint directory of a run, or a recipe" in " ".join(out.split())
    assert "KEY=VALUE" in out and "eval.num_examples=500" in out


def test_list_shows_every_shipped_recipe_with_one_line():
    r = _invoke("list")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for name in recipe_names():
        line = next(line for line in lines if line.split()[:1] == [name])
        assert len(line.split(maxsplit=1)[1]) > 20, line  # a description, not only the name
    assert "vlm/counting_tiny" in r.output and "The tiny default" in r.output
    assert "tasks:" in r.output and "counting" in r.output  # the registries still follow


def test_train_gui_is_the_gui_default_on_the_vlm_policy():
    """`mmrl train gui` takes the GUI default (a typo in an override is then the only error)."""
    from mmrl.cli import _load
    from mmrl.config.recipes import family_modality

    cfg = _load("gui", ["train.steps=3"])
    assert cfg.task.name == "gui_env" and cfg.model.path == "tiny-gui" and cfg.train.steps == 3
    assert family_modality("gui") == "vlm"
    r = _invoke("train", "gui", "algo.epslion=1")
    assert r.exit_code == 2 and "algo.epsilon" in r.output and "not available" not in r.output


def test_train_without_a_modality_says_what_to_type():
    r = _invoke("train")
    assert r.exit_code == 2
    assert "mmrl train {vlm | video | gui | diffusion}" in r.output and "--resume" in r.output


@pytest.mark.slow
def test_eval_with_a_bad_model_path_is_one_line_like_train(tmp_path):
    for command in (["eval", "vlm/counting_tiny"], ["train", "vlm"]):
        r = _invoke(*command, "model.path=/nonexistent/model", f"log.output_dir={tmp_path}")
        assert r.exit_code == 2, r.output
        lines = [x for x in r.output.strip().splitlines() if not x.startswith("torch CPU threads:")]  # the run's first line
        assert len(lines) == 1 and "Traceback" not in r.output, r.output
        assert "/nonexistent/model" in r.output and "no config.json" in r.output


def test_every_optional_module_names_an_extra_that_exists():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, extra in EXTRA_OF_MODULE.items():
        assert extra in extras, (module, extra)
        hint = install_hint(ModuleNotFoundError(f"No module named '{module}'", name=module))
        assert f'pip install "mmrl[{extra}]"' in hint
    assert install_hint(ModuleNotFoundError("No module named 'torchvision.io'")).endswith('"mmrl[video]"')
    assert install_hint(ModuleNotFoundError("No module named 'numpy'", name="numpy")) is None


HIDE_MODULES = """
import sys
class Hide:  # the base install: the module is not there
    def __init__(self, inner): self.inner = inner
    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] == {module!r} else self.inner.find_spec(name, path, target)
    def __getattr__(self, attr): return getattr(self.inner, attr)
sys.meta_path[:] = [Hide(f) if getattr(f, "__name__", "") == "PathFinder" else f for f in sys.meta_path]
sys.argv = ["mmrl", *sys.argv[1:]]
from mmrl.cli import main
main()
"""


@pytest.mark.slow
def test_video_on_the_base_install_names_the_extra(tmp_path):
    """Without torchvision (the base install), `mmrl train video` says which extra to install."""
    r = subprocess.run([sys.executable, "-c", HIDE_MODULES.format(module="torchvision"), "train", "video",
                        f"log.output_dir={tmp_path}", "eval.num_examples=2"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: No module named 'torchvision'") and 'pip install "mmrl[video]"' in last


def test_the_tiny_image_model_on_clips_is_warned_about():
    from mmrl.vlm.tiny_tasks import untrained_task_warning

    warning = untrained_task_warning("tiny", ["video_qa"])
    assert "never warm-started on video_qa" in warning and "model.path=tiny-video" in warning
    assert untrained_task_warning("tiny", ["counting", "grounding"]) is None
    assert untrained_task_warning("tiny-video", ["video_qa"]) is None
    assert "model.path=tiny-gui" in untrained_task_warning("tiny", ["gui_env"])
    assert untrained_task_warning("/models/Qwen2.5-VL-3B-Instruct", ["video_qa"]) is None
    # a mixture's sources named otherwise are judged by their tasks: counting is known, video_qa not
    from mmrl import make_task
    from mmrl.vlm.tiny_tasks import registered_task_names

    mix = make_task("mixture", tasks={"color": {"task": "counting", "query": "color"}, "clips": {"task": "video_qa"}})
    assert registered_task_names(mix) == ["counting", "video_qa"]
    warning = untrained_task_warning("tiny", registered_task_names(mix))
    assert "never warm-started on video_qa" in warning and "color" not in warning


def test_a_generator_given_to_the_vlm_path_says_it_is_a_generator():
    from mmrl.assets import asset_path
    from mmrl.vlm.loading import resolve_model_path

    with pytest.raises(ValueError, match=r"is an image or video generator .*mmrl train diffusion"):
        resolve_model_path(str(asset_path("tiny-flow-shapes")))


def test_a_vlm_given_to_the_generator_path_says_it_is_a_vlm():
    from mmrl.assets import asset_path
    from mmrl.diffusion.adapters import load_pipeline

    with pytest.raises(ValueError, match=r"transformers checkpoint .*mmrl train vlm"):
        load_pipeline(str(asset_path("tiny-qwen2.5-vl")))


@pytest.mark.parametrize("text", ["[1if 2 else 3]", "click(x=1if, y=2)", "[0x1for]", '{"action": [1st, 2]}', r"['\d']"])
def test_the_action_parser_prints_no_syntax_warning(text):
    """Model text such as ``[1if 2 else 3]`` made ``ast`` print SyntaxWarnings to the terminal. Every
    warning is shown here except what mmrl silences at import (re-installed: pytest puts back the
    filters of before its collection)."""
    from mmrl import library_noise
    from mmrl.measures.gui import read_action

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library_noise.silence()
        read_action(text)  # the answer block's reader (parse_action needs <answer> tags around it)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def test_the_help_texts_hold_no_rich_markup_leftovers():
    """Plain click help: brackets are shown, not eaten as markup."""
    out = _invoke("train", "--help").output
    assert not re.search(r"\[/?(red|bold|yellow)\]", out)


def test_a_task_of_another_modality_names_the_family_that_trains_it():
    """`mmrl train vlm` given a generator task stops before building any model, naming the family."""
    r = _invoke("train", "vlm", "task.name=composition")
    assert r.exit_code == 2 and "is a diffusion task" in r.output and "mmrl train diffusion" in r.output
