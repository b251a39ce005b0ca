"""A run's report.html (mmrl.runs.report): the before/after table with its intervals, one plot per
logged quantity, the galleries, the config's differences from its recipe; a page also for a run
that is still running or was killed; and the page of a real tiny run opened in headless Chromium
(``MMRL_REPORT_SCREENSHOTS=docs/report`` saves the docs' screenshot)."""

from __future__ import annotations

import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from mmrl.cli import app
from mmrl.config import load_config, save_config
from mmrl.runs.report import report_after_run, write_report

DASH = "\u2013"


class _Page(HTMLParser):
    """What a reader sees of the page: headings, table rows (by table id), plots (their keys), images."""

    def __init__(self, text: str):
        super().__init__()
        self.headings, self.rows, self.plots, self.images = [], {}, [], []
        self._table, self._row, self._cell, self._heading = None, None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id")
            self.rows[self._table] = []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag in ("h1", "h2", "h3"):
            self._heading = ""
        elif tag == "figure" and a.get("class") == "plot":
            self.plots.append(a["data-keys"])
        elif tag == "img":
            self.images.append(a["src"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._row is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            self.rows[self._table].append(self._row)
            self._row = None
        elif tag in ("h1", "h2", "h3"):
            self.headings.append(self._heading)
            self._heading = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._heading is not None:
            self._heading += data

    def row(self, table: str, first: str) -> list[str]:
        return next(r for r in self.rows[table] if r[0] == first)


def _jsonl(path: Path, records: list[dict], torn: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn)


TRAIN = {"reward": 0.4, "reward/format": 0.8, "reward/accuracy": 0.2, "reward/accuracy/unparsable_frac": 0.1,
         "kl": 0.01, "entropy": 1.5, "clip_frac_high": 0.05, "completion_length": 12.0, "lr": 1e-4,
         "rollout_time": 0.3, "step_time": 0.5}
LOGGED = [  # the trainer's lines: the eval before training (step 0), two steps, the eval after
    {"step": 0, "time": 1.0e9, "eval/accuracy": 0.25, "eval/reward": 0.5, "eval/mae": None},
    {"step": 1, "time": 1.0e9 + 5, **TRAIN},
    {"step": 2, "time": 1.0e9 + 10, **TRAIN, "reward": 0.6},
    {"step": 2, "time": 1.0e9 + 12, "eval/accuracy": 0.5, "eval/reward": 0.75, "eval/mae": None},
]
SUMMARY = {"before": {"accuracy": 0.25, "reward": 0.5, "mae": None}, "after": {"accuracy": 0.5, "reward": 0.75,
                                                                              "mae": None},
           "steps": 2, "intervals": {"before": {"accuracy": [0.1, 0.4]}, "after": {"accuracy": [0.3, 0.7]},
                                     "confidence": 0.95, "method": "percentile bootstrap over examples"}}


@pytest.fixture
def run_dir(tmp_path):
    """A run directory made by hand: known metrics, a summary with intervals, the counting recipe
    with two overrides, a sample grid and one step of saved rollouts."""
    run = tmp_path / "exp"
    run.mkdir()
    _jsonl(run / "metrics.jsonl", LOGGED)
    (run / "summary.json").write_text(json.dumps(SUMMARY))
    save_config(load_config("vlm/counting_tiny", ["train.steps=7", "algo.epsilon_high=0.3"]), run / "config.yaml")
    Image.new("RGB", (40, 30), "red").save(run / "samples_before.png")
    step = run / "rollouts" / "step_000001"
    step.mkdir(parents=True)
    Image.new("RGB", (20, 20), "blue").save(step / "0_vis.png")
    _jsonl(step / "rollouts.jsonl", [{"index": 0, "visualization": "0_vis.png", "completion": "<answer>3</answer>",
                                      "reward": 1.5}])
    return run


def _page(run: Path, **kw) -> _Page:
    path = write_report(run, **kw)
    assert path == run / "report.html"
    return _Page(path.read_text())


@pytest.mark.slow
def test_the_table_holds_the_summary_numbers_and_intervals(run_dir):
    page = _page(run_dir)
    assert page.rows["before-after"][0] == ["metric", "before", "95% interval", "after", "95% interval", "change"]
    assert page.row("before-after", "accuracy") == ["accuracy", "0.2500", "[0.100, 0.400]", "0.5000",
                                                    "[0.300, 0.700]", "+0.2500"]
    # no interval in the summary for the reward, no value at all for mae (NaN, written as null)
    assert page.row("before-after", "reward") == ["reward", "0.5000", DASH, "0.7500", DASH, "+0.2500"]
    assert page.row("before-after", "mae") == ["mae", DASH, DASH, DASH, DASH, DASH]


@pytest.mark.slow
def test_without_intervals_the_interval_columns_are_dashes(run_dir):
    (run_dir / "summary.json").write_text(json.dumps({k: v for k, v in SUMMARY.items() if k != "intervals"}))
    page = _page(run_dir)
    assert page.row("before-after", "accuracy") == ["accuracy", "0.2500", DASH, "0.5000", DASH, "+0.2500"]


def test_one_plot_per_logged_quantity_and_none_for_the_absent(run_dir):
    page = _page(run_dir)
    # eval/mae is never a number, the unparsable fraction is not among the report's curves, and
    # policy_kl, loss and grad_norm were not logged: none of them is drawn; lr is (with the loss
    # curves, an SFT run's); the two times make one plot (the split)
    assert page.plots == ["reward", "reward/format", "reward/accuracy", "eval/accuracy", "eval/reward", "lr", "kl",
                          "entropy", "clip_frac_high", "completion_length", "rollout_time step_time"]
    assert all(src.startswith("data:image/svg+xml;base64,") for src in page.images[:len(page.plots)])


def test_the_config_diff_lists_the_keys_that_differ_from_the_recipe(run_dir):
    page = _page(run_dir)
    text = (run_dir / "report.html").read_text()
    assert "the shipped recipe closest to it, <code>vlm/counting_tiny</code>" in text
    # configs/vlm/counting_tiny.yaml: train.steps 100, algo.epsilon_high 0.28
    assert page.rows["config-diff"][1:] == [["algo.epsilon_high", "0.28", "0.3"], ["train.steps", "100", "7"]]
    assert "epsilon_high: 0.3" in text  # the whole config.yaml too


def test_a_recipe_given_is_the_one_compared_with(run_dir):
    page = _page(run_dir, recipe="vlm/grounding_tiny")
    keys = [row[0] for row in page.rows["config-diff"][1:]]
    assert "task.name" in keys and "train.steps" in keys
    assert page.row("config-diff", "task.name")[1:] == ["grounding", "counting"]


@pytest.mark.slow
def test_the_recipe_the_run_started_from_is_the_one_compared_with(run_dir, tmp_path):
    """A run records its recipe (the first line of config_history/000-start.yaml): the page compares
    with it, not with the closest shipped one; a recorded recipe that no longer loads falls back."""
    from mmrl.runs.config_history import record_start

    mine = tmp_path / "my_counting.yaml"
    mine.write_text("base: vlm/counting_tiny\ntrain:\n  steps: 7\n")
    record_start(run_dir, load_config(mine, ["algo.epsilon_high=0.3"]))
    assert (run_dir / "config_history" / "000-start.yaml").read_text().startswith(f"# recipe: {mine.resolve()}\n")
    page = _page(run_dir)
    assert f"the recipe it started from, <code>{mine.resolve()}</code>" in (run_dir / "report.html").read_text()
    assert page.rows["config-diff"][1:] == [["algo.epsilon_high", "0.28", "0.3"]]  # train.steps is the recipe's
    mine.unlink()
    page = _page(run_dir)
    text = (run_dir / "report.html").read_text()
    assert "does not load" in text and "the shipped recipe closest to it, <code>vlm/counting_tiny</code>" in text
    assert page.rows["config-diff"][1:] == [["algo.epsilon_high", "0.28", "0.3"], ["train.steps", "100", "7"]]


def test_a_report_is_cheap_no_matplotlib_and_each_recipe_loaded_once(run_dir, monkeypatch):
    """The trainer writes a page after every run: the curves are SVG written by hand (matplotlib,
    ~0.1 s a plot, would fail to import here) and a recipe is parsed once per process."""
    import sys

    import mmrl.config
    from mmrl.runs.config_history import record_start

    record_start(run_dir, load_config("vlm/counting_tiny", ["train.steps=7", "algo.epsilon_high=0.3"]))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    write_report(run_dir)
    loads = []
    monkeypatch.setattr(mmrl.config, "load_config", lambda *a, **k: loads.append(a))
    page = _page(run_dir)
    assert loads == [] and "could not be drawn" not in (run_dir / "report.html").read_text()
    assert len(page.plots) == 11 and page.rows["config-diff"][1:] == [["algo.epsilon_high", "0.28", "0.3"],
                                                                      ["train.steps", "100", "7"]]


def test_the_galleries_are_the_run_s_images_next_to_the_page(run_dir):
    page = _page(run_dir)
    files = [src for src in page.images if not src.startswith("data:")]
    assert files == ["samples_before.png", "rollouts/step_000001/0_vis.png"]
    assert "reward 1.5000: &lt;answer&gt;3&lt;/answer&gt;" in (run_dir / "report.html").read_text()


def test_a_torn_metrics_line_and_no_summary_still_give_a_page(run_dir):
    (run_dir / "summary.json").unlink()
    _jsonl(run_dir / "metrics.jsonl", LOGGED[:3], torn='{"step": 3, "time": 1000000015.0, "rew')
    page = _page(run_dir)
    text = (run_dir / "report.html").read_text()
    assert "No summary.json" in text and "2 steps logged" in text
    # the before column is the step-0 evaluation of metrics.jsonl; there is no after yet
    assert page.row("before-after", "accuracy") == ["accuracy", "0.2500", DASH, DASH, DASH, DASH]
    assert "reward" in page.plots and "eval/accuracy" in page.plots


@pytest.mark.slow
def test_a_part_that_cannot_be_drawn_is_a_note_and_the_rest_is_drawn(run_dir):
    (run_dir / "config.yaml").write_text("model: [unclosed\n")
    with pytest.warns(UserWarning, match="Config"):
        page = _page(run_dir)
    assert "could not be drawn" in (run_dir / "report.html").read_text()
    assert page.row("before-after", "accuracy")[1] == "0.2500" and "reward" in page.plots


def test_the_end_of_a_run_never_fails_on_its_report(tmp_path):
    with pytest.warns(UserWarning, match="could not write"):
        assert report_after_run(tmp_path / "nothing-here") is None


def test_mmrl_report_builds_the_page_and_prints_its_path(run_dir, tmp_path):
    r = CliRunner().invoke(app, ["report", str(run_dir)], prog_name="mmrl")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == str(run_dir / "report.html") and (run_dir / "report.html").exists()
    r = CliRunner().invoke(app, ["report", str(tmp_path / "no-run")], prog_name="mmrl")
    assert r.exit_code == 2 and "not a run directory" in r.output
    r = CliRunner().invoke(app, ["report", str(run_dir), "--recipe", "vlm/no_such_recipe"], prog_name="mmrl")
    assert r.exit_code == 2 and "no_such_recipe" in r.output


# -- the page of a real run, in a browser ---------------------------------------------------------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
QUICK = ["train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=2", "eval.num_examples=4",
         "eval.pass_k=0", "log.save_rollouts_every=1", "log.progress=false", "log.tensorboard=false"]


@pytest.mark.slow
def test_the_report_of_a_real_run_in_chromium(tmp_path):
    """A 2-step run of the tiny default writes report.html at its end; Chromium shows every part of
    it, loads every image, and the table shows summary.json's numbers."""
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (.ci/run installs Debian's chromium)")
    import mmrl

    result = mmrl.train("vlm/counting_tiny", [*QUICK, f"log.output_dir={tmp_path}", "log.run_name=counting-2"])
    page_path = result.run_dir / "report.html"
    assert page_path.exists()  # written by the run itself
    assert "the recipe it started from, <code>vlm/counting_tiny</code>" in page_path.read_text()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 1500})
        page.goto(page_path.resolve().as_uri())
        page.wait_for_load_state("load")
        headings = page.eval_on_selector_all("h2, h3", "els => els.map(e => e.innerText.trim())")
        assert headings[:4] == ["Before / after (held-out evaluation)", "Curves",
                                "Reward of the training batches (each reward function)",
                                "Held-out evaluation (step 0: before training)"]
        assert {"Galleries", "Held-out samples", "Config", "Differences from the recipe"} <= set(headings)
        images = page.eval_on_selector_all("img", "els => els.map(e => [e.getAttribute('src').slice(0, 40), "
                                                  "e.complete && e.naturalWidth > 0])")
        assert images and all(ok for _, ok in images), [src for src, ok in images if not ok]
        assert {"samples_before.png", "samples_after.png"} <= {src for src, _ in images}
        cells = page.eval_on_selector_all("#before-after tr",
                                          "rows => rows.map(r => [...r.cells].map(c => c.innerText))")
        for metric in ("accuracy", "reward"):
            row = next(r for r in cells if r[0] == metric)
            assert row[1] == f"{summary['before'][metric]:.4f}" and row[3] == f"{summary['after'][metric]:.4f}"
            low, high = summary["intervals"]["after"][metric]
            assert row[4] == f"[{low:.3f}, {high:.3f}]"
        assert page.locator("#config-diff").inner_text().count("train.steps") == 1
        shots = os.environ.get("MMRL_REPORT_SCREENSHOTS")
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(shots) / "report.png"))  # the top of the page, as a reader first sees it
        browser.close()
    assert "could not be drawn" not in page_path.read_text()  # every part of a real run's page was drawn
