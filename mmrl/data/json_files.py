"""JSON files of records (not JSONL), read in the layouts datasets ship them in.

- an array of objects (ChartQA, MathVista, ScreenSpot, LLaVA / VLM-R1 conversation files);
- an object whose one list value holds the records (CLEVR's questions file, ``{"info": {...},
  "questions": [...]}``);
- an object of records keyed by id (GQA's question files, ``{"02930152": {"question": ...,
  "imageId": "2354786", "answer": ...}, ...}``; most of its first values objects): the key becomes
  the record's ``id`` (a record that has an ``id`` of its own keeps it); a value that is not an
  object is a bad record, skipped and counted.

Each record is located by the line it starts on and its entry, the index of the record in its
array or object counted from 0, with the key of a keyed record: ``file:1 (entry 3)``, ``file:1
(entry 3, 02930152)``. Files that hold every record on one line (CLEVR's, GQA's) thus still name
each record. A file that does not parse is an error naming its line; an object of another layout is
an error that quotes a few of its keys (:mod:`mmrl.data.messages`).
"""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path
from typing import Any, NamedTuple, Optional

from .messages import listing, shorten

# Every text data file (JSON, JSONL, TSV, annotation and prompt files) is read as "utf-8-sig": a
# UTF-8 byte order mark, which Windows tools write, is dropped. Read as plain "utf-8" it stays in
# the text, and the first JSONL record, or the whole JSON file, is then not valid JSON.
ENCODING = "utf-8-sig"


class Problem(NamedTuple):
    """A record that could not be read: its line / row ``number``, ``where`` in full
    (``file:line``), ``short`` (``line 12``) and the ``reason``."""

    number: int
    where: str
    short: str
    reason: str


class HeldRecords:
    """Records held in memory as ``(line, record)`` in ``_records``, filled by ``scan``."""

    path: Path
    _records: list[tuple[int, dict]]

    def __len__(self) -> int:
        return len(self._records)

    def record(self, i: int) -> dict:
        return self._records[i][1]

    def locate(self, i: int) -> tuple[int, str, str]:
        n = self._records[i][0]
        return n, f"{self.path}:{n}", f"line {n}"


class JsonRecords(HeldRecords):
    """The records of a JSON file in one of the module docstring's layouts, held in memory with
    the line each starts on and its entry. ``key`` is the name of the list holding them (None for
    an array or a keyed object), ``keyed`` whether they are an object's values."""

    def __init__(self, path: Path):
        self.path, self.folder = path, path.parent
        text = path.read_text(encoding=ENCODING)
        newlines = [m.start() for m in re.finditer("\n", text)]
        items, self.key, self.keyed = _json_records(text, path)
        # (line, entry index, key or None, value) of each element, in file order
        self._items = [(bisect.bisect_left(newlines, offset) + 1, k, name, value)
                       for k, (offset, name, value) in enumerate(items)]
        self._records: list[tuple[int, dict]] = []
        self._entries: list[str] = []

    def scan(self):
        for line, k, name, value in self._items:
            entry = f"entry {k}" if name is None else f"entry {k}, {shorten(name, 80)}"
            if isinstance(value, dict):
                if name is not None:
                    value.setdefault("id", name)
                self._records.append((line, value))
                self._entries.append(entry)
                yield len(self._records) - 1, value
            else:
                yield None, Problem(line, f"{self.path}:{line} ({entry})", f"line {line} ({entry})",
                                    f"expected a JSON object, got {type(value).__name__}")

    def locate(self, i: int) -> tuple[int, str, str]:
        n, entry = self._records[i][0], self._entries[i]
        return n, f"{self.path}:{n} ({entry})", f"line {n} ({entry})"


def _json_records(text: str, path: Path) -> tuple[list[tuple[int, Optional[str], Any]], Optional[str], bool]:
    """``(start offset, key or None, value)`` of each record of a JSON file, the name of the list
    holding them (None for a top-level array or a keyed object) and whether they are keyed. The
    object of a large file is read member by member, never decoded twice."""
    decoder = json.JSONDecoder()
    start = _skip_space(text, 0)
    try:
        if text[start:start + 1] == "[":
            return [(offset, None, value) for offset, value in _array_items(decoder, text, start)], None, False
        if text[start:start + 1] != "{":
            whole, _ = decoder.raw_decode(text, start)
            raise ValueError(f"{path}: expected a JSON array or object of records, got {type(whole).__name__}; "
                             "one record per line is JSONL (name the file .jsonl)")
        members = _object_members(decoder, text, start)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    lists = [(offset, key) for offset, key, v in members
             if isinstance(v, list) and v and all(isinstance(x, dict) for x in v[:10])]
    if len(lists) == 1:
        offset, key = lists[0]
        members.clear()  # the list is decoded again, element by element, for their lines
        return [(at, None, value) for at, value in _array_items(decoder, text, offset)], key, False
    if 2 * sum(isinstance(v, dict) for _, _, v in members[:10]) > len(members[:10]):  # mostly records
        return members, None, True
    raise ValueError(
        f"{path}: expected a JSON array of records, an object whose one list value holds them, or an object "
        f"of records keyed by id (got an object with keys {listing(k for _, k, _ in members)}); one record "
        "per line is JSONL (name the file .jsonl)")


def _array_items(decoder: json.JSONDecoder, text: str, at: int) -> list[tuple[int, Any]]:
    """The elements of the JSON array opening at ``text[at] == "["``, each with its offset."""
    items, i = [], _skip_space(text, at + 1)
    if text[i:i + 1] == "]":
        return items
    while True:
        value, end = decoder.raw_decode(text, i)
        items.append((i, value))
        i = _skip_space(text, end)
        if text[i:i + 1] == "]":
            return items
        if text[i:i + 1] != ",":
            raise json.JSONDecodeError("expected ',' or ']'", text, i)
        i = _skip_space(text, i + 1)


def _object_members(decoder: json.JSONDecoder, text: str, at: int) -> list[tuple[int, str, Any]]:
    """``(value offset, key, value)`` of each member of the JSON object opening at ``text[at]``."""
    members, i = [], _skip_space(text, at + 1)
    if text[i:i + 1] == "}":
        return members
    while True:
        if text[i:i + 1] != '"':
            raise json.JSONDecodeError("expected a key in double quotes", text, i)
        key, i = json.decoder.scanstring(text, i + 1)
        i = _skip_space(text, i)
        if text[i:i + 1] != ":":
            raise json.JSONDecodeError("expected ':'", text, i)
        i = _skip_space(text, i + 1)
        value, end = decoder.raw_decode(text, i)
        members.append((i, key, value))
        i = _skip_space(text, end)
        if text[i:i + 1] == "}":
            return members
        if text[i:i + 1] != ",":
            raise json.JSONDecodeError("expected ',' or '}'", text, i)
        i = _skip_space(text, i + 1)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
