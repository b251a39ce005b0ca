"""Where raw records come from: JSONL, JSON, parquet and ``datasets`` directories, one interface.

A source turns a path into a sequence of raw records (dicts, keys as the file has them) and
says where each one is (``file:line`` for JSON text, a row number for tables), so that
:class:`mmrl.data.records.FileExamples` can skip and count bad records the same way whatever
the format. A record that cannot even be read (a JSONL line that is not JSON) is reported by
:meth:`scan`; what the task makes of a readable record is the reader's business.

``open_records(path, split)`` picks the source:

- ``*.jsonl``: one JSON object a line, indexed by byte offset (lazy, any size);
- ``*.json``: an array of objects (ChartQA, MathVista, ScreenSpot, LLaVA/VLM-R1 conversation
  files), an object whose one list value holds the records (CLEVR), or an object of records keyed
  by id (GQA; :mod:`mmrl.data.json_files`); a ``.json`` file that is really JSONL is read as JSONL;
- ``*.parquet``: read with ``datasets.load_dataset("parquet", data_files=...)`` (local files only;
  ``datasets`` caches an Arrow copy under ``HF_DATASETS_CACHE``);
- ``*.tsv``: a tab-separated table with a header row (HR-Bench's ``hr_bench_4k.tsv``, images as
  base64 columns), read with ``datasets.load_dataset("csv", delimiter="\t")``; an empty cell is "";
- a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``:
  ``datasets.load_from_disk``; a ``DatasetDict`` gives the split named like the one asked for;
- any other directory, or a glob: its ``.parquet`` / ``.json`` / ``.jsonl`` files (recursively);
  when file names start with split names (``train-00000-of-00002.parquet``, ``test.jsonl``),
  those of the asked split;
- temporal grounding annotations as their datasets ship them: a Charades-STA ``*.txt`` file
  (``VIDEO start end##sentence`` lines) and an ActivityNet-Captions ``*.json`` (an object of
  ``{video: {"duration", "timestamps", "sentences"}}``), one record per sentence with ``video``,
  ``start``, ``end``, ``sentence`` (and ``duration``).

Table rows are read in Arrow form, so image columns arrive as their stored ``{"bytes", "path"}``
dicts and are decoded only when an example is used.
"""

from __future__ import annotations

import bisect
import glob
import json
import re
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from .json_files import ENCODING, HeldRecords, JsonRecords, Problem

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".tsv")
# Names a split goes by in file names and DatasetDict keys; "eval" reads the first one present.
SPLIT_NAMES = {"train": ("train",), "eval": ("validation", "val", "eval", "dev", "test")}
_GLOB_CHARS = re.compile(r"[*?\[]")


Scan = Iterator[tuple[Optional[int], Any]]  # (record index, record) or (None, Problem)


class JsonlRecords:
    """JSON objects, one a line; lines that are not JSON objects are problems, blank lines silent."""

    def __init__(self, path: Path):
        self.path, self.folder = path, path.parent
        self._offsets: list[int] = []
        self._lines: list[int] = []

    def scan(self) -> Scan:
        with self.path.open("rb") as f:
            offset = 0
            for line_no, raw in enumerate(f, start=1):
                record, reason = _json_object(raw)
                if record is not None:
                    self._offsets.append(offset)
                    self._lines.append(line_no)
                    yield len(self._offsets) - 1, record
                elif reason is not None:
                    yield None, Problem(line_no, f"{self.path}:{line_no}", f"line {line_no}", reason)
                offset += len(raw)

    def __len__(self) -> int:
        return len(self._offsets)

    def record(self, i: int) -> dict:
        with self.path.open("rb") as f:
            f.seek(self._offsets[i])
            return json.loads(f.readline().decode(ENCODING))

    def locate(self, i: int) -> tuple[int, str, str]:
        n = self._lines[i]
        return n, f"{self.path}:{n}", f"line {n}"


def _json_object(raw: bytes) -> tuple[Optional[dict], Optional[str]]:
    """A JSONL line as ``(record, None)``, ``(None, reason)``, or ``(None, None)`` when blank."""
    text = raw.decode(ENCODING, errors="replace").strip()  # a BOM starts the first line
    if not text:
        return None, None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}"
    return record, None


class TableRecords:
    """Rows of a ``datasets.Dataset`` in Arrow form (image features as ``{"bytes", "path"}``)."""

    def __init__(self, dataset, path: Path, folder: Path):
        self.path, self.folder = path, folder
        self._rows = dataset.with_format("arrow")

    def scan(self) -> Scan:
        i = 0
        for batch in self._rows.iter(batch_size=256):
            for row in batch.to_pylist():
                yield i, row
                i += 1

    def __len__(self) -> int:
        return len(self._rows)

    def record(self, i: int) -> dict:
        return self._rows[i].to_pylist()[0]

    def locate(self, i: int) -> tuple[int, str, str]:
        return i, f"{self.path} row {i}", f"row {i}"


class ConcatRecords:
    """Several sources (the files of a folder or glob) one after another."""

    def __init__(self, sources: Sequence, path: Path):
        self.sources, self.path = list(sources), path
        self.folder = path if path.is_dir() else sources[0].folder
        self._ends: list[int] = []

    def scan(self) -> Scan:
        base = 0
        for source in self.sources:
            for i, item in source.scan():
                if i is None:
                    name = source.path.name
                    yield None, item._replace(short=f"{name} {item.short}")
                else:
                    yield base + i, item
            base += len(source)
            self._ends.append(base)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _find(self, i: int) -> tuple[Any, int]:
        k = bisect.bisect_right(self._ends, i)
        return self.sources[k], i - (self._ends[k - 1] if k else 0)

    def record(self, i: int) -> dict:
        source, j = self._find(i)
        return source.record(j)

    def locate(self, i: int) -> tuple[int, str, str]:
        source, j = self._find(i)
        n, where, short = source.locate(j)
        return n, where, f"{source.path.name} {short}"


class CharadesRecords(HeldRecords):
    """Charades-STA annotations: ``VIDEO start end##sentence`` per line (seconds)."""

    def __init__(self, path: Path):
        self.path, self.folder = path, path.parent
        self._records: list[tuple[int, dict]] = []

    def scan(self) -> Scan:
        for n, line in enumerate(self.path.read_text(encoding=ENCODING, errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            head, sep, sentence = line.partition("##")
            parts = head.split()
            if not sep or len(parts) != 3:
                yield None, Problem(n, f"{self.path}:{n}", f"line {n}",
                                    "expected 'VIDEO start end##sentence' (Charades-STA)")
                continue
            try:
                start, end = float(parts[1]), float(parts[2])
            except ValueError:
                yield None, Problem(n, f"{self.path}:{n}", f"line {n}", f"start/end are not numbers: {head!r}")
                continue
            self._records.append((n, {"video": parts[0], "start": start, "end": end, "sentence": sentence.strip()}))
            yield len(self._records) - 1, self._records[-1][1]


class ActivityNetCaptionRecords(CharadesRecords):
    """ActivityNet-Captions annotations: ``{video: {"duration", "timestamps", "sentences"}}``; a
    record per (video, sentence). Records are numbered by video entry (``entry N``)."""

    def scan(self) -> Scan:
        data = json.loads(self.path.read_text(encoding=ENCODING))
        for n, (video, entry) in enumerate(data.items(), start=1):
            stamps = entry.get("timestamps") if isinstance(entry, dict) else None
            sentences = entry.get("sentences") if isinstance(entry, dict) else None
            if not isinstance(stamps, list) or not isinstance(sentences, list) or len(stamps) != len(sentences):
                yield None, Problem(n, f"{self.path}:{video}", f"entry {n} ({video})",
                                    "expected 'timestamps' and 'sentences' lists of equal length")
                continue
            for stamp, sentence in zip(stamps, sentences):
                if not (isinstance(stamp, (list, tuple)) and len(stamp) == 2):
                    yield None, Problem(n, f"{self.path}:{video}", f"entry {n} ({video})", f"bad timestamp {stamp!r}")
                    continue
                self._records.append((n, {"video": video, "start": stamp[0], "end": stamp[1],
                                          "sentence": str(sentence).strip(), "duration": entry.get("duration")}))
                yield len(self._records) - 1, self._records[-1][1]

    def locate(self, i: int) -> tuple[int, str, str]:
        n = self._records[i][0]
        video = self._records[i][1]["video"]
        return n, f"{self.path}:{video}", f"entry {n} ({video})"


def _is_activitynet_captions(path: Path) -> bool:
    """An object whose first value has ``timestamps`` and ``sentences`` (ActivityNet Captions)."""
    with path.open("rb") as f:
        head = f.read(1 << 12).decode(ENCODING, errors="replace")
    return head.lstrip().startswith("{") and '"timestamps"' in head and '"sentences"' in head


# -- choosing a source -------------------------------------------------------------------------

def open_records(path: str | Path, split: str = "train"):
    """The record source for ``path`` (see the module docstring); ``split`` ("train" / "eval")
    picks a DatasetDict split or split-named files. A missing path is FileNotFoundError, an
    unsupported one a ValueError saying what is read."""
    text = str(path)
    if "://" in text:
        raise ValueError(f"{text}: data is read from local files only (mmrl downloads nothing); "
                         "download the dataset and give its file or folder")
    p = Path(text).expanduser()
    if _GLOB_CHARS.search(text) and not p.exists():
        files = [Path(f) for f in sorted(glob.glob(str(p), recursive=True)) if Path(f).suffix in DATA_SUFFIXES]
        if not files:
            raise FileNotFoundError(f"no {'/'.join(DATA_SUFFIXES)} file matches {text}")
        return _from_files(_split_files(files, split, p), p)
    if p.is_dir():
        if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return _saved_dataset(p, split)
        files = sorted(f for f in p.rglob("*") if f.suffix in DATA_SUFFIXES and f.is_file()
                       and not any(part.startswith(".") for part in f.relative_to(p).parts))
        if not files:
            raise ValueError(f"{p} holds no dataset: no {', '.join(DATA_SUFFIXES)} files and no "
                             "datasets save_to_disk output (dataset_info.json / dataset_dict.json)")
        return _from_files(_split_files(files, split, p), p)
    if p.is_file():
        if p.suffix == ".txt":
            return CharadesRecords(p)
        if p.suffix == ".json" and _is_activitynet_captions(p):
            return ActivityNetCaptionRecords(p)
        if p.suffix not in DATA_SUFFIXES:
            raise ValueError(f"{p}: unsupported data file; read are {', '.join(DATA_SUFFIXES)} files, folders "
                             "of them and datasets save_to_disk folders")
        return _from_files([p], p)
    raise FileNotFoundError(f"dataset file not found: {p}")


def _from_files(files: list[Path], path: Path):
    parquet = [f for f in files if f.suffix == ".parquet"]
    sources = []
    if parquet:
        sources.append(TableRecords(_load_parquet(parquet), parquet[0] if len(parquet) == 1 else path,
                                    parquet[0].parent))
    for f in files:
        if f.suffix == ".tsv":
            sources.append(TableRecords(_load_tsv(f), f, f.parent))
        elif f.suffix == ".jsonl" or (f.suffix == ".json" and _is_jsonl(f)):
            sources.append(JsonlRecords(f))
        elif f.suffix == ".json":
            sources.append(JsonRecords(f))
    return sources[0] if len(sources) == 1 else ConcatRecords(sources, path)


def _is_jsonl(path: Path) -> bool:
    """A ``.json`` file holding one object per line (common for conversation datasets): its first
    line is a whole JSON object and more text follows."""
    with path.open("rb") as f:
        head = f.read(1 << 16).removeprefix(b"\xef\xbb\xbf").lstrip()  # the UTF-8 BOM (ENCODING)
    first, _, rest = head.partition(b"\n")
    if not first.strip().startswith(b"{") or not rest.strip():
        return False
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def _load_parquet(files: list[Path]):
    import datasets

    return datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")


def _load_tsv(file: Path):
    import datasets

    # keep_default_na=False: an option reading "None" or "NA" stays text; an empty cell is ""
    return datasets.load_dataset("csv", data_files=[str(file)], delimiter="\t", keep_default_na=False,
                                 encoding=ENCODING, split="train")


def _saved_dataset(path: Path, split: str):
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        name = _pick_split(list(data), split)
        if name is None:
            raise ValueError(f"{path}: no {split} split among the saved splits {sorted(data)} "
                             f"(looked for {', '.join(SPLIT_NAMES.get(split, (split,)))})")
        return TableRecords(data[name], path / name, path)
    return TableRecords(data, path, path)


def _pick_split(names: Sequence[str], split: str) -> Optional[str]:
    if len(names) == 1:
        return names[0]
    for wanted in SPLIT_NAMES.get(split, (split,)):
        if wanted in names:
            return wanted
    return None


def _split_name(path: Path) -> Optional[str]:
    """The split a data file's name starts with ("train-0000-of-0002.parquet" -> "train")."""
    stem = path.name.lower()
    for name in sorted({n for names in SPLIT_NAMES.values() for n in names}, key=len, reverse=True):
        if stem.startswith(name) and not stem[len(name):len(name) + 1].isalnum():
            return name
    return None


def _split_files(files: list[Path], split: str, where: Path) -> list[Path]:
    """The files of ``split`` when file names carry split names, else all of them."""
    named = {}
    for f in files:
        name = _split_name(f)
        if name is not None:
            named.setdefault(name, []).append(f)
    if len(named) < 2:
        return files
    name = _pick_split(list(named), split)
    if name is None:
        raise ValueError(f"{where}: no {split} files among the splits {sorted(named)} "
                         f"(looked for names starting with {', '.join(SPLIT_NAMES.get(split, (split,)))})")
    return named[name]
