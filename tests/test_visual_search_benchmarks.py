"""V* Bench and HR-Bench protocols (mmrl.eval_protocols.visual_search): each table worked out by hand,
a trajectory counted once however many turns it took, HR-Bench's TSV files read as they ship, and
`mmrl eval --benchmark hrbench` end to end."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from mmrl.eval_protocols import benchmark_table
from mmrl.registry import BENCHMARKS
from mmrl.tools.task import one_per_trajectory

OPTIONS = ["red", "blue", "green", "white"]


def answer(text: str) -> str:
    return f"<think>look</think><answer>{text}</answer>"


def table(name, pairs):
    completions, examples = one_per_trajectory([p[1] for p in pairs], [p[0] for p in pairs])
    return {r["cell"]: r for r in benchmark_table(BENCHMARKS.get(name), None, completions, examples)}


def vstar(category: str, right: bool, **extra):
    ex = {"category": category, "options": OPTIONS, "answer": "red", **extra}
    return ex, answer("A" if right else "B")


def test_vstar_accuracy_per_category_and_overall_over_the_examples():
    # Attr 2/3 (a letter and the option's text both count), Spatial 0/1: overall 2/4, not (2/3 + 0) / 2
    pairs = [vstar("direct_attributes", True), (vstar("direct_attributes", True)[0], answer("red")),
             vstar("direct_attributes", False), vstar("relative_position", False)]
    rows = table("vstar", pairs)
    assert list(rows) == ["Attr (direct_attributes)", "Spatial (relative_position)", "overall"]
    assert rows["Attr (direct_attributes)"]["accuracy"] == pytest.approx(2 / 3)
    assert rows["Spatial (relative_position)"]["accuracy"] == 0.0
    assert rows["overall"]["accuracy"] == 0.5 and rows["overall"]["n"] == 4


def test_a_trajectory_of_several_turns_counts_once_on_its_whole_text():
    """Two turn rows of one trajectory (a zoom, then the answer): one example, scored on the
    trajectory's text; the first turn alone (no answer) would have scored 0."""
    trajectory = "<think>zoom</think><tool_call>{}</tool_call>" + answer("A")
    ex = {"category": "direct_attributes", "options": OPTIONS, "answer": "red", "episode_id": 7,
          "trajectory": trajectory}
    pairs = [({**ex, "step_index": 0}, "<think>zoom</think><tool_call>{}</tool_call>"),
             ({**ex, "step_index": 1}, answer("A"))]
    rows = table("vstar", pairs)
    assert rows["overall"]["n"] == 1 and rows["overall"]["accuracy"] == 1.0


def hr(category: str, cycle: str, right: bool):
    ex = {"category": category, "cycle_category": cycle, "options": OPTIONS, "answer": "blue", "answer_letter": "B"}
    return ex, answer("B" if right else "C")


def test_hrbench_scores_are_means_over_cycles_as_lmms_eval_aggregates():
    # single: cycle 0 3/3, cycle 1 0/1 -> FSP (1 + 0) / 2 = 0.5 (over the examples it would be 3/4)
    # cross: cycle 0 0/1, cycle 1 1/1 -> FCP 0.5
    # all: cycle 0 3/4, cycle 1 1/2 -> average 0.625 (over the examples 4/6)
    pairs = [hr("single", "0", True), hr("single", "0", True), hr("single", "0", True), hr("single", "1", False),
             hr("cross", "0", False), hr("cross", "1", True)]
    rows = table("hrbench", pairs)
    assert list(rows)[:3] == ["FSP (single)", "FCP (cross)", "average"]
    assert rows["FSP (single)"]["accuracy"] == pytest.approx(0.5) and rows["FSP (single)"]["n"] == 4
    assert rows["FCP (cross)"]["accuracy"] == pytest.approx(0.5) and rows["FCP (cross)"]["n"] == 2
    assert rows["average"]["accuracy"] == pytest.approx(0.625) and rows["average"]["n"] == 6
    assert rows["single cycle 0"]["accuracy"] == 1.0 and rows["cycle 1"]["accuracy"] == 0.5
    low, high = rows["average"]["accuracy_ci"]
    assert low <= 0.625 <= high


def png_base64(color="white") -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def write_hrbench_tsv(path, rows):
    columns = ["index", "question", "answer", "category", "cycle_category", "A", "B", "C", "D", "image"]
    lines = ["\t".join(columns)] + ["\t".join(str(r.get(c, "")) for c in columns) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


HR_ROWS = [{"index": 0, "question": "What colour is the flag?", "answer": "B", "category": "single",
            "cycle_category": 0, "A": "red", "B": "blue", "C": "green", "D": "", "image": png_base64()},
           {"index": 1, "question": "Which sign is left of the car?", "answer": "A", "category": "cross",
            "cycle_category": 0, "A": "None", "B": "stop", "C": "yield", "D": "exit", "image": png_base64("gray")},
           {"index": 2, "question": "A row whose image is not base64", "answer": "A", "category": "single",
            "cycle_category": 1, "A": "x", "B": "y", "image": "not base64!"}]


def test_hrbench_tsv_files_are_read_as_they_ship(tmp_path):
    """HR-Bench's hr_bench_4k.tsv layout: an empty option cell is no option, an option reading
    "None" stays text, a row with a broken image is skipped and counted."""
    from mmrl.data.hrbench import parse_hrbench_record
    from mmrl.data.records import FileExamples

    path = tmp_path / "hr_bench_4k.tsv"
    write_hrbench_tsv(path, HR_ROWS)
    examples = FileExamples(path, parse_hrbench_record)
    assert len(examples) == 2 and examples.skipped == [(2, "'image' is not base64-encoded image data")]
    first, second = examples[0], examples[1]
    assert first["options"] == ["red", "blue", "green"] and first["answer"] == "blue"
    assert first["cycle_category"] == "0" and first["category"] == "single"
    assert second["options"][0] == "None" and second["answer"] == "None"
    assert first["image"].size == (64, 48)


@pytest.mark.slow
def test_mmrl_eval_benchmark_prints_the_hrbench_table_of_a_tsv_file(tmp_path):
    from conftest import mmrl_in_process

    path = tmp_path / "hr_bench_4k.tsv"
    write_hrbench_tsv(path, HR_ROWS)
    r = mmrl_in_process("eval", "vlm/counting_tiny", "--benchmark", "hrbench", "--data", str(path),
                        "--gallery", str(tmp_path / "g"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "HR-Bench" in r.stdout and "FSP (single)" in r.stdout and "average" in r.stdout
    report = json.loads((tmp_path / "g" / "benchmark_hrbench.json").read_text())
    rows = {row["cell"]: row for row in report["rows"]}
    assert rows["FSP (single)"]["n"] == 1 and rows["FCP (cross)"]["n"] == 1 and rows["average"]["n"] == 2
    assert report["skipped"] == 1
    assert rows["average"]["accuracy"] == pytest.approx((rows["single cycle 0"]["accuracy"] + rows["cross cycle 0"]["accuracy"]) / 2)
