"""`mmrl sft` writes report.html as an RL run does (issue 51 item 20): the held-out loss before and
after, and the curves of its loss (training loss, gradient norm, learning rate, held-out loss)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import mmrl_here
from mmrl.runs.report import write_report


@pytest.mark.slow
def test_an_sft_run_writes_its_report_with_the_loss_curves(random_tiny_dir, tmp_path):
    r = mmrl_here("sft", "vlm/counting_tiny", f"model.path={random_tiny_dir}", "train.device=cpu", "train.steps=2",
                  "train.prompts_per_step=2", "eval.num_examples=2", "log.output_dir=runs", "log.run_name=warm",
                  "log.progress=false", cwd=tmp_path)
    run = tmp_path / "runs" / "warm"
    page = (run / "report.html").read_text()
    assert f"report: {run.relative_to(tmp_path) / 'report.html'}" in r.stdout
    section = page[page.index("<h3>Training loss, gradient norm, learning rate</h3>"):]
    section = section[:section.index("</div>")]
    assert re.findall(r'data-keys="([^"]*)"', section) == ["loss", "grad_norm", "lr"]
    assert 'data-keys="eval/loss"' in page  # the held-out loss at steps 0 and 2
    summary = json.loads((run / "summary.json").read_text())
    table = page[page.index('id="before-after"'):page.index("</table>")]
    assert f"<td>loss</td><td>{summary['before']['loss']:.4f}</td>" in table
    assert f"<td>{summary['after']['loss']:.4f}</td>" in table
    again = write_report(run).read_text()  # what `mmrl report` builds: the same plots
    assert re.findall(r'data-keys="([^"]*)"', again) == re.findall(r'data-keys="([^"]*)"', page)
