"""A UTF-8 byte order mark (Windows tools write one) costs no record: every text data file is read
as utf-8-sig (mmrl.data.json_files.ENCODING). Read as plain utf-8, a JSONL file lost its first
record and a JSON array file did not parse."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from mmrl.data.gui_episodes import read_android_control
from mmrl.data.records import FileExamples
from mmrl.data.screenspot import read_screenspot
from mmrl.data.sources import open_records

BOM = b"\xef\xbb\xbf"
RECORDS = [{"image": "a.png", "question": "How many?", "answer": "3"},
           {"image": "a.png", "question": "And now?", "answer": "4"}]


def _write(path, text: str):
    path.write_bytes(BOM + text.encode("utf-8"))
    assert path.read_bytes()[:3] == BOM
    return path


def _records(path, split="train"):
    source = open_records(path, split)
    return [item for i, item in source.scan() if i is not None], source


def test_jsonl_with_a_bom_keeps_its_first_record(tmp_path):
    path = _write(tmp_path / "data.jsonl", "\n".join(json.dumps(r) for r in RECORDS) + "\n")
    read, source = _records(path)
    assert read == RECORDS and source.record(0) == RECORDS[0]
    assert source.locate(0)[1] == f"{path}:1"  # lines are numbered as before


def test_json_array_and_keyed_object_with_a_bom(tmp_path):
    assert _records(_write(tmp_path / "array.json", json.dumps(RECORDS, indent=1)))[0] == RECORDS
    keyed = _write(tmp_path / "gqa.json", json.dumps({"0123": RECORDS[0], "0456": RECORDS[1]}))
    assert [r["id"] for r in _records(keyed)[0]] == ["0123", "0456"]
    # a .json file that is really JSONL is still recognised as one
    lines = _write(tmp_path / "lines.json", "\n".join(json.dumps(r) for r in RECORDS) + "\n")
    assert _records(lines)[0] == RECORDS


def test_tsv_charades_and_activitynet_with_a_bom(tmp_path):
    tsv = _write(tmp_path / "hr_bench_4k.tsv", "index\tquestion\n0\tWhat colour?\n")
    assert _records(tsv)[0] == [{"index": 0, "question": "What colour?"}]  # not "\ufeffindex"
    charades = _write(tmp_path / "charades_sta_test.txt", "3MSZA 24.3 30.4##person opens a door.\n")
    assert _records(charades)[0][0]["video"] == "3MSZA"
    anet = _write(tmp_path / "val_1.json", json.dumps({"v_x": {"duration": 9.0, "timestamps": [[1, 2]],
                                                               "sentences": ["A man runs."]}}))
    assert _records(anet)[0][0]["video"] == "v_x"


def test_file_examples_and_benchmark_readers_with_a_bom(tmp_path):
    Image.new("RGB", (20, 10), "red").save(tmp_path / "a.png")
    path = _write(tmp_path / "data.jsonl", "\n".join(json.dumps(r) for r in RECORDS) + "\n")
    examples = FileExamples(path, lambda r: dict(r))
    assert len(examples) == 2 and examples.skipped == [] and examples[0]["answer"] == "3"
    shots = [{"img_filename": "a.png", "bbox": [1, 1, 4, 4], "instruction": "the red", "data_type": "text"}]
    assert len(read_screenspot(_write(tmp_path / "screenspot_web.json", json.dumps(shots)))) == 1
    episode = {"episode_id": 7, "goal": "Open it", "screenshots": ["a.png", "a.png"],
               "actions": [{"action_type": "click", "x": 5, "y": 5}]}
    assert read_android_control(_write(tmp_path / "episodes.json", json.dumps(episode))).num_steps() == 1


def test_prompt_files_with_a_bom(tmp_path):
    pytest.importorskip("mmrl.tasks.prompts")
    from mmrl.tasks.prompts import read_prompt_lines

    path = _write(tmp_path / "prompts.txt", "a red cube\n# a comment\na blue ball\n")
    assert read_prompt_lines(path) == [{"prompt": "a red cube"}, {"prompt": "a blue ball"}]
