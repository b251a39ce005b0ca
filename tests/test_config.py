"""mmrl.config: YAML + overrides -> typed Config, and errors that say which key, where, and what was meant."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from mmrl.config import ConfigError, builtin_config_path, config_to_dict, load_config, save_config
from mmrl.config.schema import Config


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def test_defaults_without_file():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg == Config()


def test_yaml_and_overrides(tmp_path):
    p = write(
        tmp_path / "r.yaml",
        """
        train:
          steps: 10
          learning_rate: 1e-5   # YAML 1.1 would make this a string
        algo:
          epsilon_high: 0.28
        task:
          name: grounding
          rewards: {iou: 1, format: 0.5}
          options: {query: count}
        model:               # an empty section is fine
        """,
    )
    cfg = load_config(p, ["algo.beta=0.04", "task.options.query=color", "plugins=[a.py, b]", "train.steps=7"])
    assert cfg.train.steps == 7 and cfg.train.learning_rate == pytest.approx(1e-5)
    assert isinstance(cfg.train.learning_rate, float)
    assert cfg.algo.epsilon_high == 0.28 and cfg.algo.beta == 0.04
    assert cfg.task.rewards == {"iou": 1.0, "format": 0.5}
    assert cfg.task.options == {"query": "color"}
    assert cfg.plugins == ["a.py", "b"]
    assert cfg.model == Config().model


def test_null_and_dotted_yaml_keys_and_section_override(tmp_path):
    p = write(tmp_path / "r.yaml", "algo.epsilon_high: 0.3\nmodel.lora:\n  r: 4\n")
    cfg = load_config(p, ["algo.epsilon_high=null", "model.lora={alpha: 8}"])
    assert cfg.algo.epsilon_high is None
    assert cfg.model.lora.r == 4 and cfg.model.lora.alpha == 8


def test_whole_dict_override_replaces_and_dotted_entry_merges(tmp_path):
    """task.rewards={...} on the command line is exactly those rewards (it was merged into the
    recipe's, keeping rewards the user meant to drop); a dotted entry changes one; a child recipe's
    dict merges into its base's."""
    base = write(tmp_path / "base.yaml", "task:\n  name: vqa\n  rewards: {accuracy: 1, format: 0.5}\n"
                                         "  options: {a: 1}\n")
    child = write(tmp_path / "child.yaml", "base: base.yaml\ntask:\n  rewards: {length: 0.1}\n  options: {b: 2}\n")
    assert load_config(base, ["task.rewards={ttrv_agreement: 1.0}"]).task.rewards == {"ttrv_agreement": 1.0}
    assert load_config(base, ["task.rewards.format=0.2"]).task.rewards == {"accuracy": 1.0, "format": 0.2}
    assert load_config(base, ["task.options={}"]).task.options == {}
    cfg = load_config(child)
    assert cfg.task.rewards == {"accuracy": 1.0, "format": 0.5, "length": 0.1} and cfg.task.options == {"a": 1, "b": 2}
    with pytest.raises(ConfigError, match=r"'task\.rewards\.x'.*command line.*expected float"):
        load_config(base, ["task.rewards={x: abc}"])


def test_unknown_key_names_file_line_and_suggestion(tmp_path):
    p = write(tmp_path / "x.yaml", "# header\ntrain:\n  steps: 3\nalgo:\n  epslion: 0.3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "'algo.epslion'" in msg and f"{p}, line 5" in msg and "did you mean 'algo.epsilon'" in msg


def test_nesting_mistake_suggests_full_key(tmp_path):
    p = write(tmp_path / "x.yaml", "epsilon: 0.2\n")
    with pytest.raises(ConfigError, match=r"'epsilon'.*line 1.*did you mean 'algo\.epsilon'"):
        load_config(p)
    with pytest.raises(ConfigError, match=r"'train\.num_generations'.*did you mean .*'rollout\.num_generations'"):
        load_config(None, ["train.num_generations=4"])


def test_unknown_override_says_command_line():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.epslion=0.3"])
    assert "'algo.epslion'" in str(e.value) and "on the command line" in str(e.value)
    assert "did you mean 'algo.epsilon'" in str(e.value)


def test_free_form_dicts_accept_any_key(tmp_path):
    p = write(tmp_path / "x.yaml", "task:\n  options: {anything: 1, nested: {deep: [1, 2]}}\n  reward_kwargs: {k: v}\n")
    cfg = load_config(p, ["task.options.other=x", "task.rewards.custom=2"])
    assert cfg.task.options == {"anything": 1, "nested": {"deep": [1, 2]}, "other": "x"}
    assert cfg.task.reward_kwargs == {"k": "v"} and cfg.task.rewards == {"custom": 2.0}


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("train.steps=abc", r"'abc'.*'train\.steps'.*expected int"),
        ("algo.epsilon_high=x", r"'x'.*'algo\.epsilon_high'.*expected float or null"),
        ("plugins=a.py", r"'a\.py'.*'plugins'.*expected list of str.*plugins=\[a\.py\]"),
        ("algo=3", r"'algo'.*section"),
        ("task.rewards.iou=high", r"'high'.*'task\.rewards\.iou'.*expected float"),
    ],
)
def test_type_errors(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, [override])


def test_type_error_in_yaml_points_at_line(tmp_path):
    p = write(tmp_path / "x.yaml", "task:\n  rewards:\n    iou: 1\n    format: lots\n")
    with pytest.raises(ConfigError, match=rf"'task\.rewards\.format' \({p}, line 4\): expected float"):
        load_config(p)


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.steps"])
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(missing)


def test_base_inheritance_recursive(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "root.yaml", "train: {steps: 1, seed: 5}\ntask: {options: {a: 1}}\n")
    write(tmp_path / "sub" / "mid.yaml", "base: ../root.yaml\ntrain: {steps: 2}\ntask: {options: {b: 2}}\n")
    leaf = write(tmp_path / "leaf.yaml", "base: sub/mid.yaml\nalgo: {beta: 0.1}\n")
    cfg = load_config(leaf, ["train.seed=9"])
    assert cfg.train.steps == 2 and cfg.train.seed == 9 and cfg.algo.beta == 0.1
    assert cfg.task.options == {"a": 1, "b": 2}  # dicts merge across the chain


def test_base_cycle_detected(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_base_error_in_base_file_names_that_file(tmp_path):
    write(tmp_path / "a.yaml", "train:\n  stpes: 1\n")
    b = write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"a\.yaml, line 2.*did you mean 'train\.steps'"):
        load_config(b)


def test_type_error_names_the_file_that_set_the_bad_value(tmp_path):
    """A recipe on a shipped base: the base sets train.steps (valid) and the user's file overrides
    it with a bad value; the message names the user's file and line, not the base's line."""
    mine = write(tmp_path / "mine.yaml", "base: vlm/counting_tiny\ntrain:\n  steps: lots\n")
    with pytest.raises(ConfigError) as err:
        load_config(mine)
    assert f"'train.steps' ({mine}, line 3)" in str(err.value)
    assert "counting_tiny" not in str(err.value)
    # a bad value that the base itself holds is still blamed on the base
    write(tmp_path / "a.yaml", "algo:\n  beta: 0.1\ntrain:\n  steps: many\n")
    b = write(tmp_path / "b.yaml", "base: a.yaml\nalgo:\n  beta: 0.2\n")
    with pytest.raises(ConfigError, match=r"'train\.steps' \(.*a\.yaml, line 4\)"):
        load_config(b)
    # and a bad value deep in a section set by both files: the user's line
    write(tmp_path / "c.yaml", "model:\n  lora:\n    r: 8\n")
    d = write(tmp_path / "d.yaml", "base: c.yaml\nmodel:\n  lora:\n    r: eight\n")
    with pytest.raises(ConfigError, match=r"'model\.lora\.r' \(.*d\.yaml, line 4\)"):
        load_config(d)


def test_save_round_trip(tmp_path):
    cfg = load_config(None, ["algo.epsilon_high=0.28", "task.options.query=color", "train.learning_rate=3e-6"])
    out = save_config(cfg, tmp_path / "run" / "config.yaml")
    assert out.exists()
    assert load_config(out) == cfg
    d = config_to_dict(cfg)
    assert d["algo"]["epsilon_high"] == 0.28 and d["task"]["options"] == {"query": "color"}


def test_start_from_base_config():
    start = load_config(None, ["train.steps=3"])
    cfg = load_config(None, ["algo.beta=0.5"], base=start)
    assert cfg.train.steps == 3 and cfg.algo.beta == 0.5


def test_builtin_config_path(tmp_path, monkeypatch):
    import mmrl.configs

    root = tmp_path / "configs"
    (root / "vlm").mkdir(parents=True)
    recipe = write(root / "vlm" / "counting_tiny.yaml", "train: {steps: 4}\n")
    monkeypatch.setattr(mmrl.configs, "CONFIGS_DIR", root)
    assert builtin_config_path("vlm/counting_tiny") == recipe
    assert builtin_config_path("vlm/counting_tiny.yaml") == recipe
    assert builtin_config_path(str(recipe)) == recipe
    assert load_config("vlm/counting_tiny").train.steps == 4
    with pytest.raises(ConfigError, match="vlm/counting_tiny"):
        builtin_config_path("vlm/countin_tiny")


def test_switching_task_drops_the_base_recipes_task_options(tmp_path):
    """grounding_tiny is `base: counting_tiny` + `task.name: grounding`: counting's `query`
    option must not reach grounding; options set next to the switch (or later) stay."""
    from mmrl.config import builtin_config_path

    cfg = load_config(builtin_config_path("vlm/grounding_tiny"))
    assert cfg.task.name == "grounding" and cfg.task.options == {}
    cfg = load_config(builtin_config_path("vlm/counting_tiny"), ["task.name=grounding", "task.options.max_objects=3"])
    assert cfg.task.options == {"max_objects": 3}
    cfg = load_config(builtin_config_path("vlm/counting_tiny"), ["task.options.query=shape"])
    assert cfg.task.options == {"query": "shape"}  # same task: options merge as before


def _assert_reference_trajectory_scores_the_best(task, rewards, name):
    from mmrl.registry import REWARDS
    from mmrl.tools import ToolState, run_turn
    from mmrl.tools.interaction import observation_text

    ex = next(e for e in (task.examples("train")[i] for i in range(40)) if len(task.reference_turns(e)) > 1)
    turns = task.reference_turns(ex)
    state, budget, tools, text, records = ToolState([ex["image"]], ex), task.make_budget(), task.make_tools(), "", []
    for turn in turns[:-1]:
        observations, recs = run_turn(turn, tools, state, budget)
        text, records = text + turn + observation_text(observations), records + recs
    ex = {**ex, "trajectory": text + turns[-1], "tool_calls": records}
    total, _, _ = rewards([turns[-1]], [ex], group_ids=torch.arange(1))
    best = sum(w * REWARDS.get(n).reward_maximum for n, w in rewards.weights.items() if w > 0)
    assert total.item() == pytest.approx(best), name


@pytest.mark.slow
def test_every_builtin_recipe_builds_its_task():
    """Every shipped recipe builds its task and rewards, and they agree: the recipe sits in the folder
    of the policy that trains its task (``mmrl train vlm|diffusion`` refuses the other), and the
    best answer scores the best total reward under the recipe's rewards (every positive weight at 1):
    a VLM task's reference completions, a generator task's true rendered scenes. A reward that
    cannot read the task's answers (wrong reward, wrong format, wrong options) fails here."""
    import numpy as np

    from mmrl.config import builtin_config_names, builtin_config_path
    from mmrl.core.reward_computer import make_reward_computer
    from mmrl.core.trainer import build_task
    from mmrl.data.motion_t2v import render_clip
    from mmrl.data.shapes_t2i import render

    label_free = {"vlm/vqa_ttrv_tiny"}  # test-time RL: no reference answers to score
    for name in builtin_config_names():
        cfg = load_config(builtin_config_path(name))
        task = build_task(cfg)
        rewards = make_reward_computer(task, cfg.task)
        # `mmrl train video` trains a VLM; the GUI recipes are `mmrl train vlm configs/gui/...`
        policy = {"video": "vlm", "gui": "vlm"}.get(name.split("/")[0], name.split("/")[0])
        assert task.name == cfg.task.name and task.modality == policy, name
        user_file = cfg.task.options.get("train_path")
        if user_file and not Path(user_file).exists():  # the data file is the user's (a real model's recipe)
            with pytest.raises(FileNotFoundError, match=str(user_file)):
                task.examples("train")
            continue
        if hasattr(task, "make_env"):  # an environment task: its rewards come from episodes; the
            steps = [task.sft_examples("train")[i] for i in range(4)]  # solver's actions must read back
            assert all(task.read_action(task.target(ex), ex) is not None for ex in steps), name
            continue
        examples = [task.examples("train")[i] for i in range(4)]
        if hasattr(task, "make_tools"):  # a tool task: a reference trajectory, its tools run, scores the best
            _assert_reference_trajectory_scores_the_best(task, rewards, name)
            continue
        if name in label_free:
            with pytest.raises(ValueError, match="no reference completion"):
                task.target(examples[0])
            continue
        if task.modality == "diffusion":  # the true scene (or clip) of each prompt
            draw = render_clip if cfg.task.name in ("motion_t2v", "motion_i2v") else (lambda spec, rng: render(spec, rng, 16))
            answers = [ex["target"] if "target" in ex else draw(ex["spec"], np.random.default_rng(i))  # an edit's target
                       for i, ex in enumerate(examples)]
        else:
            answers = [task.target(ex) for ex in examples]
        total, _, _ = rewards(answers, examples, group_ids=torch.arange(4))
        computers = getattr(rewards, "computers", None)  # a mixture: each source's own rewards
        best = [sum(w for w in (computers[ex["source"]] if computers else rewards).weights.values() if w > 0)
                for ex in examples]
        assert total.tolist() == pytest.approx(best), name
