"""The eval gallery marks right and wrong predictions (by the task's accuracy metric)."""

from __future__ import annotations

import json

from PIL import Image

from mmrl.runs.gallery import RIGHT, WRONG, write_gallery
from mmrl.registry import TASKS


def test_gallery_marks_right_and_wrong(tmp_path):
    task = TASKS.get("counting")()
    exs = [task.examples("eval")[i] for i in range(3)]
    completions = [task.target(exs[0]), "<answer>99</answer>", "no answer"]
    summary = write_gallery(tmp_path, task, completions, exs, [1.5, 0.5, 0.0], {"accuracy": [1.0, 0.0, 0.0]}, 1.5)
    assert summary == {"right": 1, "shown": 3}
    page = (tmp_path / "index.html").read_text()
    assert page.count('class="card right"') == 1 and page.count('class="card wrong"') == 2
    assert "1 of 3 right" in page and "&lt;answer&gt;99&lt;/answer&gt;" in page  # escaped
    sheet = Image.open(tmp_path / "gallery.png").convert("RGB")
    tile = Image.open(tmp_path / "000.png").size
    assert sheet.getpixel((1, 1)) == RIGHT  # first tile's border
    assert sheet.getpixel((sheet.width // 3 + 1, 1)) == WRONG  # second tile's border
    assert json.loads((tmp_path / "summary.json").read_text())["right"] == 1 and tile[0] > 0
