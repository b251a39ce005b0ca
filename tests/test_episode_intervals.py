"""Held-out intervals of episodic tasks (GUI episodes, tool-use trajectories; issue 51 item 20): the
example (all its episodes' steps) is the unit resampled, every metric but pass@k computed again on
each resample, an example drawn twice counting twice (its episodes relabelled by the draw)."""

from __future__ import annotations

import math

from mmrl.core.evaluation import metric_intervals
from mmrl.measures.intervals import mean_interval, resampled_intervals
from mmrl.registry import TASKS, load_plugins


def episode_rows(successes, lengths):
    """One episode per example: example g's ``lengths[g]`` step rows (episode_id g, rewards 1 on a
    success's steps, 0 otherwise), every step valid but the first of example 1."""
    rows, group_of, rewards = [], [], []
    for g, (ok, n) in enumerate(zip(successes, lengths)):
        for t in range(n):
            rows.append({"episode_id": g, "step_index": t, "episode_success": ok, "episode_length": n,
                         "step_valid": not (g == 1 and t == 0)})
            group_of.append(g)
            rewards.append(1.0 if ok else 0.0)
    return rows, group_of, rewards


def test_gui_episode_intervals_resample_examples_with_their_steps():
    load_plugins()
    task = TASKS.get("gui_env")()
    successes, lengths = [True, False, True, True, False, True], [2, 3, 1, 4, 2, 2]
    rows, group_of, rewards = episode_rows(successes, lengths)
    completions = ["<answer>{}</answer>"] * len(rows)
    metrics = {**task.metrics(completions, rows), "pass@1": 4 / 6, "reward": sum(rewards) / len(rewards)}
    assert metrics["success"] == 4 / 6 and metrics["episode_length"] == 14 / 6 and metrics["reward"] == 9 / 14
    solved = [[ok] for ok in successes]  # pass@1 of one sample per example
    out = metric_intervals(task, completions, rows, group_of, metrics, {"reward": rewards}, solved, 1, episodic=True)
    assert set(out) == {"success", "episode_length", "invalid_actions", "reward", "pass@1"}
    # the same draws (seed 0) taken by hand: success is the mean of the drawn examples' outcomes
    # (an example drawn twice counts twice); the reward, the mean over the drawn examples' steps
    by_hand = resampled_intervals(
        lambda picked: {"success": sum(successes[g] for g in picked) / len(picked),
                        "episode_length": sum(lengths[g] for g in picked) / len(picked),
                        "reward": sum(lengths[g] * successes[g] for g in picked) / sum(lengths[g] for g in picked)},
        6, ["success", "episode_length", "reward"])
    for name, (low, high) in by_hand.items():
        assert out[name] == (low, high), name
        assert low <= metrics[name] <= high and low < high
    assert out["pass@1"] == mean_interval([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    assert all(math.isfinite(v) for pair in out.values() for v in pair)


def test_tool_use_trajectories_count_once_per_draw():
    """A tool-use task scores a trajectory once however many turn rows it has; an example drawn
    k times counts k times."""
    load_plugins()
    task = TASKS.get("zoom_qa")()
    examples = [task.examples("eval")[i] for i in range(5)]
    rows, group_of, completions = [], [], []
    for g, ex in enumerate(examples):
        answer = task.reference_answer(ex) if g % 2 == 0 else "<answer>nothing</answer>"
        for t in range(2):  # two turn rows each, the same whole trajectory
            rows.append({**ex, "episode_id": g, "step_index": t, "trajectory": answer, "turns": 2})
            group_of.append(g)
            completions.append(answer)
    metrics = task.metrics(completions, rows)
    assert metrics["accuracy"] == 3 / 5
    out = metric_intervals(task, completions, rows, group_of, {"accuracy": metrics["accuracy"]}, {}, [], 0,
                           episodic=True)
    right = [g % 2 == 0 for g in range(5)]
    assert out["accuracy"] == resampled_intervals(lambda picked: {"accuracy": sum(right[g] for g in picked) / 5},
                                                  5, ["accuracy"])["accuracy"]
