"""FileExamples on JSONL: lazy, skips and counts bad lines and images, names the file."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from mmrl.data.records import BadRecord, FileExamples


def parse(record):
    if "box" not in record:
        raise BadRecord("no 'box' key")
    return {"image": record["image"], "box": tuple(record["box"]), "question": record.get("q", "")}


def write(tmp_path, lines):
    Image.new("RGB", (20, 10), "red").save(tmp_path / "a.png")
    Image.new("RGB", (30, 10), "blue").save(tmp_path / "b.png")
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    p = tmp_path / "data.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_bad_lines_are_skipped_with_line_numbers(tmp_path, caplog):
    p = write(tmp_path, [
        json.dumps({"image": "a.png", "box": [1, 2, 3, 4]}),   # 1 ok
        "{not json",                                           # 2
        "",                                                    # 3 blank: silent
        json.dumps([1, 2]),                                    # 4 not an object
        json.dumps({"image": "b.png"}),                        # 5 rejected by the reader
        json.dumps({"image": "b.png", "box": [0, 0, 5, 5]}),   # 6 ok
    ])
    ds = FileExamples(p, parse)
    assert len(ds) == 2
    assert [n for n, _ in ds.skipped] == [2, 4, 5]
    assert "not valid JSON" in ds.skipped[0][1] and "no 'box' key" in ds.skipped[2][1]
    assert f"{p}:2 skipped" in caplog.text
    ex = ds[1]
    assert ex["box"] == (0, 0, 5, 5) and ex["image"].size == (30, 10) and ex["image_size"] == (30, 10)
    assert ex["image_path"].endswith("b.png")


def test_corrupt_or_missing_images_fall_through_to_the_next_example(tmp_path):
    p = write(tmp_path, [
        json.dumps({"image": "corrupt.png", "box": [1, 1, 2, 2]}),
        json.dumps({"image": "missing.png", "box": [1, 1, 2, 2]}),
        json.dumps({"image": "a.png", "box": [3, 3, 4, 4]}),
    ])
    ds = FileExamples(p, parse)
    assert len(ds) == 3
    assert ds[0]["box"] == (3, 3, 4, 4) and ds[1]["box"] == (3, 3, 4, 4)
    assert ds.stats() == {"examples": 3, "skipped_lines": 0, "bad_images": 2, "bad_targets": 0}


def test_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        FileExamples(tmp_path / "nope.jsonl", parse)
    p = write(tmp_path, [json.dumps({"image": "a.png"})])
    with pytest.raises(ValueError, match=r"data.jsonl has no usable example; first problem: line 1: no 'box' key"):
        FileExamples(p, parse)
