"""A user's plugin, written against the public API only, loads and trains one RL step: from a
``plugins=[my_task.py]`` file, and from an installed package's ``mmrl.plugins`` entry point."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

import mmrl
from conftest import tiny_run_config, tiny_run_overrides

pytestmark = pytest.mark.slow  # every test here takes over half a second on the 2-core CPU

# A task and its reward, as a user writes them (README, "Writing a task or a reward"); PREFIX
# keeps the registry names of the two tests apart.
PLUGIN = '''
"""A user's plugin: only mmrl's public API."""
import random

from mmrl import SyntheticExamples, Task, register_reward, register_task
from mmrl.data.scenes import random_scene
from mmrl.parsing import extract_answer


@register_reward("PREFIX_exact_color")
def exact_color(completions, examples, **ctx):
    out = []
    for c, ex in zip(completions, examples):
        answer = extract_answer(c)
        out.append(None if answer is None else float(answer.strip().lower() == ex["answer"]))
    return out


@register_task("PREFIX_color_naming")
class ColorNaming(Task):
    modality = "vlm"
    rewards = {"format": 0.5, "PREFIX_exact_color": 1.0}
    instructions = ("Answer with <think>...</think><answer>color</answer>.", "Answer with <answer>color</answer>.")

    def default_options(self):
        return {"train_size": 100, "eval_size": 4}

    def make(self, seed):
        scene = random_scene(random.Random(seed), 1)
        return {"image": scene.image, "question": "What color is the shape?",
                "answer": scene.objects[0].color, "image_size": scene.image.size}

    def examples(self, split):
        return SyntheticExamples(self.make, self.options[split + "_size"], {"train": 1, "eval": 2}[split])
'''


def _trained_one_step(run_dir: Path, reward: str) -> None:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [x for x in lines if f"reward/{reward}" in x]
    assert len(steps) == 1, lines
    assert 0.0 <= steps[0][f"reward/{reward}"] <= 1.0


def test_plugin_file_loads_and_trains(random_tiny_dir, tmp_path):
    path = tmp_path / "my_task.py"
    path.write_text(PLUGIN.replace("PREFIX", "file"))
    cfg = tiny_run_config(random_tiny_dir, tmp_path / "runs", 1, f"plugins=[{path}]", "task.name=file_color_naming")
    result = mmrl.train(cfg)
    assert result.steps == 1
    _trained_one_step(result.run_dir, "file_exact_color")
    assert mmrl.make_task("file_color_naming").rewards == {"format": 0.5, "file_exact_color": 1.0}


def write_installed_package(site: Path, name: str = "mmrl_demo_plugin") -> None:
    """What ``pip install`` leaves in site-packages: the package, and a ``.dist-info`` whose
    ``entry_points.txt`` names it in the ``mmrl.plugins`` group (importlib.metadata reads it)."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(PLUGIN.replace("PREFIX", "ep"))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[mmrl.plugins]\ndemo = {name}\n")


# Entry points are discovered the first time plugins load in a process; this test's process has
# long done that, so the installed package is tried in a fresh one, as a user's run would be.
SCRIPT = """
import json, sys
import mmrl
from mmrl.config import load_config

mmrl.load_plugins()
task = mmrl.make_task("ep_color_naming")
result = mmrl.train(load_config(None, json.loads(sys.argv[1])))
print("RESULT " + json.dumps({"steps": result.steps, "run_dir": str(result.run_dir), "rewards": task.rewards}))
"""


def test_entry_point_plugin_loads_and_trains(random_tiny_dir, tmp_path):
    site = tmp_path / "site"
    write_installed_package(site)
    overrides = tiny_run_overrides(random_tiny_dir, tmp_path / "runs", 1, "task.name=ep_color_naming")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(overrides)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert result["steps"] == 1 and result["rewards"] == {"format": 0.5, "ep_exact_color": 1.0}
    _trained_one_step(Path(result["run_dir"]), "ep_exact_color")
