"""HR-Bench ("Divide, Conquer and Combine: A Training-Free Framework for High-Resolution Image
Perception in Multimodal Large Language Models", Wang et al., 2024) rows as mmrl examples.

HR-Bench 4K / 8K ship as tables (``DreamMr/HR-Bench``; lmms-eval reads them in
``lmms_eval/tasks/hrbench/utils.py``): one row per question with ``index``, ``question``, the
options in columns ``A``, ``B``, ``C``, ``D`` (a missing or NaN column is no option), ``answer``
(the right option's letter), ``category`` (``single`` / ``cross``), ``cycle_category`` and
``image`` (the image file base64-encoded; some copies hold its bytes). :func:`parse_hrbench_record`
is the ``parse`` of :class:`mmrl.data.records.FileExamples` for such rows (the ``.tsv`` files as
they ship, parquet, JSON or JSONL); a bad row is skipped and counted with its row number. The
``hrbench`` benchmark (:mod:`mmrl.eval_protocols.visual_search`) scores them as lmms-eval does.
"""

from __future__ import annotations

import base64
import binascii
import math
import string

from .records import BadRecord

__all__ = ["is_hrbench_record", "parse_hrbench_record"]


def is_hrbench_record(record: dict) -> bool:
    """Whether ``record`` has HR-Bench's layout (options in letter columns, a letter answer)."""
    return "A" in record and "B" in record and "answer" in record and "image" in record


def _option(value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def _image_bytes(value) -> bytes:
    if isinstance(value, (bytes, bytearray)) and value:
        return bytes(value)
    if isinstance(value, str) and value.strip():
        try:
            return base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise BadRecord("'image' is not base64-encoded image data") from None
    raise BadRecord("no 'image' (base64 text or bytes)")


def _text(value) -> str:
    """A label column as text; cycle 0 stays "0" (an int column: ``str(0 or "")`` would lose it)."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value).strip()


def parse_hrbench_record(record: dict) -> dict:
    """One HR-Bench row -> an example: ``image`` (the decoded bytes, opened on access),
    ``question``, ``options`` (in letter order), ``answer`` (the right option's text),
    ``answer_letter``, ``category``, ``cycle_category``, ``id`` (``index``)."""
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRecord("no 'question' text")
    letters = [c for c in string.ascii_uppercase if _option(record.get(c)) is not None]
    if len(letters) < 2 or letters != list(string.ascii_uppercase[:len(letters)]):
        raise BadRecord(f"the options must be columns A, B, ... without gaps, got {letters}")
    options = [_option(record[c]) for c in letters]
    letter = str(record.get("answer") or "").strip().upper()
    if letter not in letters:
        raise BadRecord(f"'answer' must be one of the option letters {', '.join(letters)}, got {record.get('answer')!r}")
    ex = {"image": _image_bytes(record.get("image")), "question": question.strip(), "options": options,
          "answer": options[letters.index(letter)], "answer_letter": letter,
          "category": _text(record.get("category")), "cycle_category": _text(record.get("cycle_category"))}
    if record.get("index") is not None:
        ex["id"] = record["index"]
    return ex
