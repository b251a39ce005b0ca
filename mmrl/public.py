"""The modules a plugin may import: mmrl's public API, declared once.

Built-in tasks (``tasks/``, installed as ``mmrl.tasks``) and rewards (``rewards/``, installed as
``mmrl.rewards``) are written exactly the way a user writes a plugin, so they import only what is
listed here, and nothing is listed that none of them needs; ``tests/test_plugin_boundary.py``
checks both. Everything else
(``mmrl.core``, ``mmrl.vlm``, ``mmrl.diffusion``, ``mmrl.config``, ``mmrl.registry``, ...) is
internal and may change shape without notice.
"""

from __future__ import annotations

PUBLIC_MODULES: tuple[str, ...] = (
    "mmrl",  # the names in mmrl.__all__: Task, register_task, register_reward, make_task, train, ...
    "mmrl.task",  # the Task base class, SyntheticExamples, prompt helpers
    "mmrl.parsing",  # reading answers (text, numbers, boxes) out of completions
    "mmrl.vlm.judge",  # a local Qwen-VL checkpoint as a yes/no judge
    # scoring primitives shared by rewards and task metrics
    "mmrl.measures.batch",  # the per-example loop of a batched reward, with its length check
    "mmrl.measures.answers",
    "mmrl.measures.boxes",
    "mmrl.measures.detection",
    "mmrl.measures.text",
    "mmrl.measures.relaxed",
    "mmrl.measures.math_equivalence",
    "mmrl.measures.jigsaw",
    "mmrl.measures.composition",
    "mmrl.measures.motion",
    "mmrl.measures.edits",  # a synthetic edit verified from pixels; masked preservation
    "mmrl.measures.temporal",
    "mmrl.measures.video_r1",
    "mmrl.measures.video_answers",
    "mmrl.measures.screen",
    "mmrl.measures.gui",
    "mmrl.measures.gui_match",
    "mmrl.measures.gui_r1",
    "mmrl.measures.ui_r1",
    "mmrl.measures.tool_use",  # trajectories that call tools: DeepEyes, crop grounding, curiosity
    "mmrl.measures.deepeyes_judge",  # DeepEyes' judge prompt and how its reply is read (the deepeyes reward)
    # coordinate spaces, drawing for galleries, video clips
    "mmrl.media.coords",
    "mmrl.media.draw",
    "mmrl.media.video",
    "mmrl.media.wire",  # completions and examples as JSON for reward services (the http reward)
    # dataset readers, image folders, synthetic scenes
    "mmrl.data.records",
    "mmrl.data.sequence",
    "mmrl.data.images",
    "mmrl.data.scenes",
    "mmrl.data.shapes_t2i",
    "mmrl.data.motion",
    "mmrl.data.motion_t2v",
    "mmrl.data.shape_edits",  # synthetic image edits
    "mmrl.data.screenspot",
    "mmrl.data.gui_episodes",
    "mmrl.data.gui_steps",
    "mmrl.data.vstar",  # V* Bench folders
    "mmrl.data.deepeyes",  # DeepEyes' parquet rows
    "mmrl.data.hrbench",  # HR-Bench rows
    # the environment API (Env, Observation, register_env, make_env) and the environment task
    "mmrl.envs",
    "mmrl.envs.task",
    # tools a VLM calls mid-completion (zoom_in, crop, rotate), the call parser and the budget
    "mmrl.tools",
)


def is_public(module: str) -> bool:
    """Whether a plugin may import ``module``: it is listed (a listed package's other submodules
    are not public)."""
    return module in PUBLIC_MODULES
