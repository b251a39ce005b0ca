"""The modules a plugin may import: mmrl's public API, declared once.

Built-in tasks (``tasks/``, installed as ``mmrl.tasks``) and rewards (``rewards/``, installed as
``mmrl.rewards``) are written exactly the way a user writes a plugin, so they import only what is
listed here; ``tests/test_plugin_boundary.py`` checks every import of theirs. Everything else
(``mmrl.core``, ``mmrl.vlm``, ``mmrl.diffusion``, ``mmrl.config``, ``mmrl.registry``, ...) is
internal and may change shape without notice.
"""

from __future__ import annotations

PUBLIC_MODULES: tuple[str, ...] = (
    "mmrl",  # the names in mmrl.__all__: Task, register_task, register_reward, make_task, train, ...
    "mmrl.task",  # the Task base class, SyntheticExamples, prompt helpers
    "mmrl.parsing",  # reading answers (text, numbers, boxes) out of completions
    "mmrl.measures",  # scoring primitives shared by rewards and task metrics (IoU, AP50, ANLS, ...)
    "mmrl.media",  # coordinate spaces, drawing for galleries, image perturbations
    "mmrl.data",  # dataset readers, image folders, synthetic scenes
    "mmrl.judge",  # a local Qwen-VL checkpoint as a yes/no judge
    "mmrl.envs",  # the environment API (Env, Observation, register_env, make_env) and built-in envs
)


def is_public(module: str) -> bool:
    """Whether a plugin may import ``module``: it is listed, or lies inside a listed package (the
    root ``mmrl`` excepted: its public API is its own names, not all of its submodules), and no
    part of its dotted name is private (starts with ``_``)."""
    parts = module.split(".")
    if any(p.startswith("_") for p in parts):
        return False
    if module in PUBLIC_MODULES:
        return True
    return any(module.startswith(p + ".") for p in PUBLIC_MODULES if p != "mmrl")
