"""From a file's record to the keys a task reads: the ``fields`` mapping and the common layouts.

Tasks read records by their own key names (``image``, ``question``, ``answer``, plus task keys
such as ``boxes``, ``label``, ``text``, ``choices``; each task's docstring lists them). Datasets
name things otherwise, so one mapping, ``task.options.fields``, says where each key is found::

    task:
      options:
        train_path: data/train.parquet
        fields: {question: problem, answer: solution, image: images}   # task key: file key

A file key may be dotted to reach inside a nested value (``answer: reward_model.ground_truth``);
a record where it is absent or null is skipped, naming the option.
The mapping is applied first; then these layouts fill the keys that are still missing:

- VLM-R1 / LLaVA ``conversations``: ``[{"from": "human", "value": "<image>Please ..."},
  {"from": "gpt", "value": "[x1, y1, x2, y2]"}]`` (or ``role`` / ``content``) gives ``question``
  (the first user turn) and ``answer`` (the assistant turn after it);
- verl / EasyR1: ``prompt`` as text or as a chat list gives ``question`` (its last user turn),
  ``reward_model.ground_truth`` gives ``answer``, ``images`` gives ``image`` (a list: single-image
  tasks use its first image);
- R1-V's counting test file as it ships (``superclevr_test200_counting_problems.jsonl``:
  ``{"image_path", "question", "ground_truth"}``): ``image_path`` gives ``image``, ``ground_truth``
  gives ``answer`` (when the record has neither ``answer`` nor ``solution``).

``<image>`` markers are removed from question texts (``question``, ``problem``, ``query``): mmrl
places the image itself, and a literal marker would reach the model as text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional

_IMAGE_MARKER = re.compile(r"\s*<image>\s*")
QUESTION_KEYS = ("question", "problem", "query")
_USER, _ASSISTANT = ("human", "user"), ("gpt", "assistant")
_MISSING = object()


class FieldError(ValueError):
    """A record lacks a key the ``fields`` mapping names."""


def check_fields(fields: Optional[Mapping]) -> dict[str, str]:
    """``fields`` as a plain ``{task key: file key}`` dict; a clear error for anything else."""
    if not fields:
        return {}
    if not isinstance(fields, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                  for k, v in fields.items()):
        raise ValueError("task.options.fields must map a task key to the file's key, e.g. "
                         f"{{question: problem, answer: solution, image: images}}; got {fields!r}")
    return dict(fields)


def lookup(record: Mapping, key: str) -> Any:
    """``record[key]``, following dots into nested mappings; ``_MISSING`` when absent."""
    if key in record:
        return record[key]
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def normalize_record(raw: Mapping, fields: Mapping[str, str]) -> dict:
    """The record with the ``fields`` mapping applied and the layouts' keys filled in (the file's
    own keys are kept). Raises :class:`FieldError` when a mapped key is missing."""
    record = dict(raw)
    for key, source in fields.items():
        value = lookup(raw, source)
        if value is _MISSING or value is None:  # tables fill a record's absent keys with nulls
            raise FieldError(f"no '{source}' (task.options.fields.{key}); keys: {', '.join(map(str, raw))}")
        record[key] = value
    if "question" not in record or "answer" not in record:
        question, answer = _conversation(record.get("conversations"))
        _fill(record, "question", question)
        _fill(record, "answer", answer)
    if "question" not in record and not any(k in record for k in QUESTION_KEYS):
        _fill(record, "question", _prompt_text(record.get("prompt")))
    if "answer" not in record and isinstance(record.get("reward_model"), Mapping):
        _fill(record, "answer", record["reward_model"].get("ground_truth"))
    if "image" not in record and record.get("images") is not None:
        record["image"] = record["images"]
    if "image" not in record and record.get("image_path") is not None:  # R1-V's SuperCLEVR file
        record["image"] = record["image_path"]
    if "answer" not in record and "solution" not in record:
        _fill(record, "answer", record.get("ground_truth"))
    for key in QUESTION_KEYS:
        if isinstance(record.get(key), str):
            record[key] = _IMAGE_MARKER.sub(" ", record[key]).strip()
    return record


def _fill(record: dict, key: str, value) -> None:
    if value is not None and key not in record:
        record[key] = value


def _turns(messages) -> list[tuple[str, str]]:
    """(speaker, text) of chat turns in either the ``from``/``value`` or ``role``/``content`` form;
    list contents keep their text parts."""
    out = []
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, Mapping):
            continue
        speaker = str(m.get("from", m.get("role", ""))).lower()
        content = m.get("value", m.get("content"))
        if isinstance(content, list):
            content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, Mapping) and c.get("text"))
        if isinstance(content, str):
            out.append((speaker, content))
    return out


def _conversation(messages) -> tuple[Optional[str], Optional[str]]:
    """The first user turn and the assistant turn that answers it."""
    turns = _turns(messages)
    for i, (speaker, text) in enumerate(turns):
        if speaker in _USER:
            answer = next((t for s, t in turns[i + 1:] if s in _ASSISTANT), None)
            return text, answer
    return None, None


def _prompt_text(prompt) -> Optional[str]:
    """verl's ``prompt``: a string, or a chat list whose last user turn is the question."""
    if isinstance(prompt, str):
        return prompt
    users = [t for s, t in _turns(prompt) if s in _USER]
    return users[-1] if users else None
