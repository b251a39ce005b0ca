"""The batched episode runner of environment tasks (:meth:`mmrl.envs.task.EnvTask.run_episodes`).

:func:`run_episodes` runs ``n`` episodes of each task spec (the group = the episodes of one spec),
all of them batched: at every turn the policy writes one action for each episode still running (one
``policy.rollout`` call), each environment steps, and the episodes that ended drop out, until none
runs or the step limit is reached. Every step becomes one row of the returned batch, its example
carrying what the episode-aware estimators, rewards and metrics read (listed in
:mod:`mmrl.core.episodes`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from mmrl.core.rollouts import Rollouts

def run_episodes(policy, task, examples: Sequence[dict], n: int, mode: str,
                 need_old_logps: bool = False, need_ref_logps: bool = False) -> Rollouts:
    """The episodes of the module docstring for ``task`` (an :class:`~mmrl.envs.task.EnvTask`);
    rows ordered by turn, then episode."""
    group_of = [g for g in range(len(examples)) for _ in range(n)]
    envs = [task.make_env() for _ in group_of]
    observations = [env.reset(examples[g]["task"]) for env, g in zip(envs, group_of)]
    histories: list[list] = [[] for _ in group_of]
    returns = [0.0] * len(envs)
    outcome: dict[int, dict] = {}
    running = list(range(len(envs)))
    turns: list[Rollouts] = []
    for t in range(task.max_steps):
        if not running:
            break
        step_examples = policy.prepare_examples(
            [task.step_example(examples[group_of[e]], observations[e], histories[e]) for e in running])
        batch = policy.rollout(step_examples, [task.build_prompt(ex) for ex in step_examples], 1, mode,
                               need_old_logps=need_old_logps, need_ref_logps=need_ref_logps)
        still = []
        for row, e in enumerate(running):
            ex = batch.examples[row]
            action = task.read_action(batch.completions[row], ex)
            obs, reward, done, info = step_env(envs[e], action, task.step_timeout, observations[e])
            returns[e] += float(reward)
            batch.examples[row] = {**ex, "episode_id": e, "step_index": t, "anchor_key": observations[e].state_key,
                                   "step_reward": float(reward), "step_valid": bool(info.get("valid", action is not None)),
                                   "step_message": str(info.get("message", ""))}
            histories[e].append(action)
            observations[e] = obs
            if done or t == task.max_steps - 1:
                outcome[e] = {"episode_success": bool(info.get("success", False)), "episode_return": returns[e],
                              "episode_length": t + 1, "episode_timed_out": bool(info.get("timed_out", False))}
            else:
                still.append(e)
        batch.group_ids = torch.tensor([group_of[e] for e in running], dtype=torch.long)
        turns.append(batch)
        running = still
    rows = Rollouts.concat(turns, renumber_groups=False)
    rows.examples = [{**ex, **outcome[ex["episode_id"]]} for ex in rows.examples]
    return rows


def step_env(env, action, timeout: float, observation):
    """``env.step(action)``, or with ``timeout`` > 0 seconds, that step abandoned when it takes
    longer: the episode ends there (reward 0, ``timed_out`` in its info). Python cannot stop the
    thread of a hung step; it is left to finish on its own, and the environment is not used again."""
    if not timeout:
        return env.step(action)
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(env.step, action)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        return observation, 0.0, True, {"valid": False, "success": False, "timed_out": True,
                                        "message": f"the environment step took longer than {timeout:g} s"}
    finally:
        pool.shutdown(wait=False)

