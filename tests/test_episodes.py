"""GUI episodes through the agent loop (mmrl.core.agent_loop) and the EnvTask base, on a
hand-checkable toy environment and a scripted policy: rows per step, groups, histories in the
prompts, outcomes, metrics."""

from __future__ import annotations

import re

import pytest
import torch
from PIL import Image

from mmrl.core.episodes import episode_metrics, is_episodic, rollout_task
from mmrl.core.rollouts import Rollouts
from mmrl.envs import Env, EnvTask, Observation, make_env, register_env
from mmrl.registry import ENVS


@register_env("toy_buttons")
class ToyButtons(Env):
    """Four 10-px buttons in a row of a 40x10 screen; the task: press button ``goal``. Pressing
    another button moves nothing; ``terminate`` gives up."""

    max_steps = 3

    def default_options(self):
        return {"penalty": 0.0}

    def tasks(self, split):
        return [{"instruction": f"Press button {g}", "goal": g} for g in range(4)]

    def reset(self, task):
        self.goal, self.presses = task["goal"], 0
        return self._obs()

    def _obs(self):
        return Observation(Image.new("RGB", (40, 10), (self.presses * 40, 0, 0)), f"Press button {self.goal}",
                           [{"name": f"button {i}", "box": (10 * i, 0, 10 * i + 9, 9)} for i in range(4)],
                           state_key=f"presses={self.presses}")

    def step(self, action):
        if action is None:
            return self._obs(), -self.options["penalty"], False, {"valid": False, "success": False, "message": "?"}
        if action["action"] == "terminate":
            return self._obs(), 0.0, True, {"valid": True, "success": False}
        self.presses += 1
        hit = action["action"] == "click" and int(action["point"][0] // 10) == self.goal
        return self._obs(), float(hit), hit, {"valid": True, "success": hit}

    def expert_action(self):
        return {"action": "click", "point": [10 * self.goal + 5, 5]}


class ToyTask(EnvTask):
    name = "toy_task"
    env_name = "toy_buttons"


class ScriptedPolicy:
    """Answers each prompt with ``answer(prompt_text, call)``; records the prompts it saw."""

    capabilities = frozenset({"multi_turn"})

    def __init__(self, answer):
        self.answer, self.calls, self.prompts = answer, 0, []

    def prepare_examples(self, examples):
        return [{**ex, "pred_space": "pixel"} for ex in examples]

    def take_rollout_stats(self):
        return {}

    def rollout(self, examples, prompts, n, mode, need_old_logps=False, need_ref_logps=False):
        texts = [p[-1]["content"][1]["text"] for p in prompts for _ in range(n)]
        self.prompts.append(texts)
        completions = [self.answer(t, self.calls) for t in texts]
        self.calls += 1
        return Rollouts(group_ids=torch.arange(len(prompts)).repeat_interleave(n),
                        action_mask=torch.ones(len(texts), 2), completions=completions,
                        examples=[ex for ex in examples for _ in range(n)],
                        payload={"prompt_ids": [torch.tensor([i]) for i in range(len(texts))]})


def click(button: int) -> str:
    return f'<answer>{{"action": "click", "point": [{10 * button + 5}, 5]}}</answer>'


def goal_of(prompt: str) -> int:
    return int(re.search(r"Press button (\d)", prompt).group(1))


def test_env_registry_and_option_check():
    assert "toy_buttons" in ENVS.names()
    assert make_env("toy_buttons", penalty=0.5).options["penalty"] == 0.5
    with pytest.raises(ValueError, match="valid options: \\['penalty'\\]"):
        make_env("toy_buttons", typo=1)
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        ToyTask(max_steps=0)


def test_episodes_become_one_row_per_step_grouped_by_task():
    """Episode k of a task presses button k first (k = 0, 1): the episode whose first press is
    the goal ends after one step; the other presses the goal on its second step."""
    task = ToyTask()
    specs = [task.examples("train")[g] for g in (0, 2)]  # goals 0 and 2
    order = {}

    def answer(prompt, call):
        if call == 0:  # the first turn: episode e of the batch presses button e % 2
            order[prompt] = order.get(prompt, 0) + 1
            return click((order[prompt] - 1) % 2)
        return click(goal_of(prompt))

    policy = ScriptedPolicy(answer)
    rows = task.run_episodes(policy, specs, 2, "train")
    # goal 0: episode 0 hits at once; episode 1 misses, then hits. goal 2: both miss, then hit.
    assert [ex["episode_id"] for ex in rows.examples] == [0, 1, 2, 3, 1, 2, 3]
    assert [ex["step_index"] for ex in rows.examples] == [0, 0, 0, 0, 1, 1, 1]
    assert rows.group_ids.tolist() == [0, 0, 1, 1, 0, 1, 1]
    assert [ex["step_reward"] for ex in rows.examples] == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert all(ex["episode_success"] for ex in rows.examples)
    lengths = {ex["episode_id"]: ex["episode_length"] for ex in rows.examples}
    assert lengths == {0: 1, 1: 2, 2: 2, 3: 2}
    assert [ex["anchor_key"] for ex in rows.examples] == ["presses=0"] * 4 + ["presses=1"] * 3
    # The second turn's prompts show the first action (in the policy's space), numbered.
    assert all('Previous actions: Step 1: {"action": "click"' in p for p in policy.prompts[1])
    assert all("Previous actions: none." in p for p in policy.prompts[0])
    assert len(policy.prompts) == 2 and len(policy.prompts[1]) == 3  # finished episodes drop out
    m = episode_metrics(rows)
    assert m == {"episode/success": 1.0, "episode/length": 1.75, "episode/return": 1.0,
                 "episode/invalid_actions": 0.0, "episode/timeouts": 0.0}


def test_step_limit_unreadable_actions_and_the_metrics():
    task = ToyTask(env_options={"penalty": 0.5}, max_steps=2, history_length=1)
    policy = ScriptedPolicy(lambda prompt, call: "I am not sure")
    rows = task.run_episodes(policy, [task.examples("eval")[1]], 1, "eval")
    assert len(rows) == 2  # the step limit ends it
    assert [ex["step_reward"] for ex in rows.examples] == [-0.5, -0.5]
    assert [ex["step_valid"] for ex in rows.examples] == [False, False]
    assert rows.examples[0]["episode_return"] == -1.0 and not rows.examples[0]["episode_success"]
    assert "Previous actions: Step 1: invalid." in policy.prompts[1][0]
    metrics = task.metrics(rows.completions, rows.examples)
    assert metrics == {"success": 0.0, "episode_length": 2.0, "invalid_actions": 1.0}


@register_env("toy_slow_buttons")
class ToySlowButtons(ToyButtons):
    """ToyButtons whose button 3 hangs for ``delay`` seconds when pressed."""

    def default_options(self):
        return {"penalty": 0.0, "delay": 2.0}

    def step(self, action):
        if action is not None and action.get("point", [0])[0] >= 30:
            import time

            time.sleep(self.options["delay"])
        return super().step(action)


class ToySlowTask(EnvTask):
    name = "toy_slow_task"
    env_name = "toy_slow_buttons"


def test_an_environment_step_past_its_timeout_ends_the_episode_and_is_counted():
    import time

    task = ToySlowTask(step_timeout=0.2, max_steps=3)
    policy = ScriptedPolicy(lambda prompt, call: click(3) if call == 0 and "button 0" in prompt else
                            click(goal_of(prompt)))
    t0 = time.perf_counter()
    rows = task.run_episodes(policy, [task.examples("train")[0], task.examples("train")[1]], 1, "train")
    assert time.perf_counter() - t0 < 1.5  # the hung step (2 s) was not waited for
    hung = [ex for ex in rows.examples if ex["episode_id"] == 0]
    assert len(hung) == 1 and hung[0]["episode_timed_out"] and not hung[0]["episode_success"]
    assert "longer than 0.2 s" in hung[0]["step_message"] and hung[0]["step_reward"] == 0.0
    other = [ex for ex in rows.examples if ex["episode_id"] == 1]
    assert other[0]["episode_success"] and not other[0]["episode_timed_out"]
    assert episode_metrics(rows)["episode/timeouts"] == 0.5
    with pytest.raises(ValueError, match="step_timeout"):
        ToySlowTask(step_timeout=-1)


def test_history_is_bounded_and_numbered_from_the_start():
    task = ToyTask(history_length=1, max_steps=3)
    policy = ScriptedPolicy(lambda prompt, call: click(3) if goal_of(prompt) != 3 else click(0))
    task.run_episodes(policy, [task.examples("train")[0]], 1, "train")
    third = policy.prompts[2][0]
    assert "Step 2:" in third and "Step 1:" not in third


def test_rollout_task_dispatches_and_the_env_reward_reads_the_rows():
    from mmrl.registry import REWARDS

    task = ToyTask()
    assert is_episodic(task)
    policy = ScriptedPolicy(lambda prompt, call: click(goal_of(prompt)))
    rows = rollout_task(policy, task, [task.examples("train")[1]], 3, "train")
    assert len(rows) == 3 and rows.group_ids.tolist() == [0, 0, 0]
    assert REWARDS.get("env_reward")(rows.completions, rows.examples) == [1.0, 1.0, 1.0]
    assert REWARDS.get("env_reward")(["x"], [{"image": None}]) == [None]  # not an episode's step


def test_expert_steps_and_targets_are_the_solvers_actions():
    task = ToyTask()
    steps = task.sft_examples("train")
    assert len(steps) == 4 * task.max_steps
    ex = steps[2 * task.max_steps]  # spec 2: the solver presses button 2 at once
    assert ex["expert_action"] == {"action": "click", "point": [25, 5]}
    assert task.target(ex) == '<answer>{"action": "click", "point": [25, 5]}</answer>'
    with pytest.raises(ValueError, match="expert_action"):
        task.target(task.examples("train")[0])
    # In a 0-1000 space the reference point is converted (40x10 screen: x 25 px -> 625).
    from mmrl.media.coords import Frame

    scaled = {**ex, "pred_space": "rel1000", "frame": Frame(40, 10)}
    assert task.target(scaled) == '<answer>{"action": "click", "point": [625, 500]}</answer>'
    assert task.read_action(task.target(scaled), scaled) == {"action": "click", "point": [25.0, 5.0]}


def test_visualize_draws_the_click():
    task = ToyTask()
    ex = {**task.sft_examples("train")[0], "step_index": 0, "step_reward": 1.0}
    picture = task.visualize(ex, click(0))
    assert picture.size[0] == 80 and picture.getpixel((10, 10)) != (0, 0, 0)


def test_episode_viewer_shows_each_episode_step_by_step(tmp_path):
    from mmrl.core.episodes import episode_rows
    from mmrl.runs.episode_viewer import write_episode_viewer

    task = ToyTask(max_steps=2)
    policy = ScriptedPolicy(lambda prompt, call: click(goal_of(prompt)) if goal_of(prompt) != 3 else "no idea")
    rows = task.run_episodes(policy, [task.examples("eval")[g] for g in (1, 3)], 1, "eval")
    index = write_episode_viewer(tmp_path / "episodes", task, rows.completions, rows.examples, episode_rows(rows.examples))
    page = index.read_text()
    assert page.count("class='ep") == 2 and "1 / 2" in page
    assert page.count("class='step'") == 3  # 1 step (solved) + 2 steps (the limit)
    assert "success" in page and "failure" in page and "Press button 3" in page
    assert sorted(p.name for p in (tmp_path / "episodes").glob("*.png")) == [
        "episode000_step00.png", "episode001_step00.png", "episode001_step01.png"]
    assert write_episode_viewer(tmp_path / "none", task, ["x"], [{"image": None}], episode_rows([{"image": None}])) is None


def test_episodes_of_several_processes_are_told_apart_by_their_task_index():
    """Each process numbers its episodes from 0: gathered rows are keyed by (task index, episode)."""
    task = ToyTask()
    rows = [{"_index": i, "episode_id": 0, "step_index": 0, "episode_success": i == 0, "episode_length": 1,
             "episode_return": float(i == 0), "step_valid": True} for i in (0, 1)]
    assert task.metrics(["x", "y"], rows)["success"] == 0.5
    batch = Rollouts(group_ids=torch.tensor([0, 1]), action_mask=torch.ones(2, 1), examples=rows)
    assert episode_metrics(batch)["episode/success"] == 0.5
