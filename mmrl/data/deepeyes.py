"""DeepEyes' training parquet files as mmrl examples.

DeepEyes ("DeepEyes: Incentivizing 'Thinking with Images' via Reinforcement Learning") ships verl
parquet files whose rows its data scripts write
(``verl/workers/agent/envs/mm_process_engine/create_*_dataset.py`` in Visual-Agent/DeepEyes)::

    {"data_source": "vstar" | "chart" | "thinklite_eureka" | ...,
     "prompt": [{"role": "system", "content": <tool-list system prompt>},
                {"role": "user", "content": "<image>\\n<question> <format instruction>"}],
     "images": [{"bytes": ..., "path": ...}],
     "ability": ..., "env_name": "visual_toolbox_v5",
     "reward_model": {"style": "model", "ground_truth": <answer>},
     "extra_info": {"split", "index", "answer", "question"}}

:func:`parse_deepeyes_record` is the ``parse`` of :class:`mmrl.data.records.FileExamples` for such
rows (``FileExamples(path, parse_deepeyes_record)``); a row without a user turn, an image or a
ground truth is skipped and counted with its row number, as every reader does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import BadRecord, require_image

__all__ = ["parse_deepeyes_record"]


def _messages(prompt: Any) -> list[dict]:
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise BadRecord("'prompt' must be a list of chat messages ({'role', 'content'})")
    out = []
    for m in prompt:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRecord(f"a 'prompt' message must have a 'role' and a text 'content', got {m!r}"[:200])
        out.append({"role": m["role"], "content": m["content"]})
    return out


def parse_deepeyes_record(record: dict) -> dict:
    """One DeepEyes row (see the module docstring) -> an example: ``image`` (the row's images; the
    first is opened), ``question`` (``extra_info.question``, else the user turn without its
    ``<image>`` markers), ``answer`` (``reward_model.ground_truth``), ``system`` (the system prompt
    with DeepEyes' tool list, or None), ``prompt_text`` (the user turn as written),
    ``data_source``, ``env_name``, ``extra_info``."""
    messages = _messages(record.get("prompt"))
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise BadRecord("'prompt' has no user message")
    image = require_image(record)
    n_images = len(image) if isinstance(image, (list, tuple)) else 1
    markers = users[-1].count("<image>")
    if markers not in (0, n_images):
        raise BadRecord(f"the user message has {markers} <image> markers for {n_images} images")
    reward_model = record.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    if truth is None or (isinstance(truth, str) and not truth.strip()):
        raise BadRecord("no 'reward_model.ground_truth'")
    extra = dict(record["extra_info"]) if isinstance(record.get("extra_info"), Mapping) else {}
    question = extra.get("question") if isinstance(extra.get("question"), str) else record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRecord("no question text (extra_info.question or the user message)")
    system = next((m["content"] for m in messages if m["role"] == "system"), None)
    return {"image": image, "question": question.strip(), "answer": str(truth).strip(), "system": system,
            "prompt_text": users[-1], "data_source": str(record.get("data_source") or ""),
            "env_name": record.get("env_name"), "extra_info": extra}
