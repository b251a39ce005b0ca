"""What crosses ranks of a step's batch (mmrl.core.batch.whole.light): of each example its declared
keys (mmrl.core.example.Example) that hold plain data, so the episode estimators and the episode
and tool-use metrics read on the gathered batch what they read on one process's; media, a tool
conversation's observations and the task's own keys stay on the rank. The 2-process run of the
same episodes is tests/test_distributed.py::test_episode_advantages_and_metrics_on_two_processes_equal_one."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from mmrl.core.advantages import compute_advantages
from mmrl.core.batch.estimation import ESTIMATOR_INPUTS, RunFacts
from mmrl.core.batch.whole import gather_whole, light, plain
from mmrl.core.episodes import episode_metrics
from mmrl.core.example import SHARED_KEYS
from test_episodes import ScriptedPolicy, ToyTask, click, goal_of
from test_tool_rollouts import ScriptedPolicy as ToolPolicy
from test_tool_rollouts import _task as zoom_task
from test_tool_rollouts import zoom_then_answer


def gui_rows():
    """2 goals x 2 episodes of the toy buttons (invalid actions cost 0.5): episode 0 of a goal
    presses it (return 1), episode 1 first writes no action, then presses it (return 0.5); each
    row a step with its screenshot."""
    task = ToyTask(env_options={"penalty": 0.5}, max_steps=2)
    seen = {}

    def answer(prompt, call):
        if call:
            return click(goal_of(prompt))
        k = seen[prompt] = seen.get(prompt, -1) + 1
        return click(goal_of(prompt)) if k == 0 else "I am not sure"

    rows = task.run_episodes(ScriptedPolicy(answer), [task.examples("train")[g] for g in (0, 2)], 2, "train")
    rows.examples = [{**ex, "_index": ex["episode_id"] // 2} for ex in rows.examples]
    rows.rewards = torch.tensor([ex["step_reward"] for ex in rows.examples])
    return rows


def test_plain_data_crosses_and_objects_do_not():
    assert plain(None) and plain("a") and plain(3) and plain(2.5) and plain(True)
    assert plain(np.int64(4)) and plain(np.float32(0.5))  # a sampler's numpy index is a number
    assert plain([1, "a", {"b": [None, 2.0]}]) and plain((1, 2))
    assert not plain(Image.new("RGB", (2, 2))) and not plain(torch.zeros(2)) and not plain(object())
    assert not plain([1, Image.new("RGB", (2, 2))]) and not plain({"x": torch.zeros(1)}) and not plain({1: "a"})


def test_an_episodes_rows_keep_the_keys_the_episode_estimators_and_metrics_read():
    rows = gui_rows()
    assert all(isinstance(ex["image"], Image.Image) for ex in rows.examples)
    lit = light(rows)
    kept = set().union(*(ex.keys() for ex in lit.examples))
    assert kept == {"_index", "episode_id", "step_index", "anchor_key", "step_reward", "step_valid", "step_message",
                    "episode_success", "episode_return", "episode_length", "episode_timed_out", "task"}
    # left behind: the screenshot (media) and the step example's own keys (its instruction, its
    # prompt's history, the policy's answer space: undeclared); the task spec is data here, so it
    # crosses (an environment whose spec is an object keeps it on its rank)
    left = set().union(*(ex.keys() for ex in rows.examples)) - kept
    assert left & SHARED_KEYS == {"image"} and {"instruction", "history", "pred_space"} <= left
    for row, ex in zip(rows.examples, lit.examples):
        assert all(ex[k] == row[k] for k in ex)
    # the episode estimators' inputs and the metrics read on the light rows what they read on the rows
    facts = RunFacts({"env_reward": 1.0}, {"toy": 0})
    for name in ("episode_ids", "step_indices", "anchor_keys"):
        full, part = ESTIMATOR_INPUTS[name](rows, facts), ESTIMATOR_INPUTS[name](lit, facts)
        assert part is not None and (torch.equal(full, part) if torch.is_tensor(full) else full == part), name
    inputs = {n: ESTIMATOR_INPUTS[n](lit, facts) for n in ("episode_ids", "step_indices", "anchor_keys")}
    assert torch.equal(compute_advantages("gigpo", rows.rewards, lit.group_ids, **inputs),
                       compute_advantages("gigpo", rows.rewards, rows.group_ids,
                                          **{n: ESTIMATOR_INPUTS[n](rows, facts) for n in inputs}))
    assert episode_metrics(lit) == episode_metrics(rows)
    assert episode_metrics(rows)["episode/return"] == 0.75 and episode_metrics(rows)["episode/invalid_actions"] == 2 / 6


def test_a_tool_trajectorys_rows_keep_its_record_and_leave_its_images():
    task = zoom_task()
    rows = task.run_episodes(ToolPolicy(zoom_then_answer), [task.examples("train")[0]], 2, "train")
    lit = light(rows)
    kept = set().union(*(ex.keys() for ex in lit.examples))
    assert {"episode_id", "step_index", "anchor_key", "trajectory", "turns", "over_turn", "tool_calls",
            "tool_budget", "episode_timed_out"} <= kept <= SHARED_KEYS
    assert all(isinstance(ex["image"], Image.Image) for ex in rows.examples) and "image" not in kept
    # the tool-use metrics and the trajectory counts read the record (the task's own metrics, such
    # as zoom_qa's accuracy, read its undeclared keys: they are not in the gathered batch)
    generic = ("turns", "tool/over_turn", "tool/timeouts", "tool/rapr", "tool/calls", "tool/error_rate", "tool/images",
               "tool/turns")
    m, full = task.metrics(lit.completions, lit.examples), task.metrics(rows.completions, rows.examples)
    assert {k: m[k] for k in generic} == {k: full[k] for k in generic}
    assert full["tool/calls"] == 1.0 and full["tool/images"] == 1.0 and full["turns"] == 2.0


def test_one_process_gathers_nothing():
    rows = gui_rows()
    whole = gather_whole(rows, [(rows, [0, 1])], {"x": 1.0}, {}, 1)
    assert whole.trained is rows and (whole.start, whole.stop) == (0, len(rows))
