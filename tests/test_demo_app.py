"""`mmrl demo` driven in headless Chromium (Playwright for Python pointed at Debian's
``/usr/bin/chromium``, which `.ci/run` installs): every tab opened and used as a person would,
screenshots saved (``MMRL_DEMO_SCREENSHOTS=docs/demo`` writes the README's), and the server's file
boundary checked over HTTP."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import mmrl_here

# Looked up, not imported: the server imports gradio (5 s), and collecting the suite should not.
pytestmark = [pytest.mark.slow,  # a browser and three tiny trainings: ~50 s
              pytest.mark.skipif(importlib.util.find_spec("gradio") is None,
                                 reason="the demo needs gradio: pip install -e '.[demo]'"),
              pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                                 reason="pip install playwright (the dev extra)")]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Chromium is not installed (.ci/run installs Debian's chromium)", allow_module_level=True)

RUN, GEN_RUN = "counting-2", "composition-2"
QUICK = ["train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=2", "eval.num_examples=4",
         "eval.pass_k=0", "log.save_rollouts_every=1"]
TIMEOUT_MS = 90_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """The demo on a free port over a runs directory holding two real 2-step tiny runs: the VLM's
    and the generator's."""
    from mmrl.demo.app import launch_app

    root = tmp_path_factory.mktemp("demo")
    runs = root / "runs"
    for modality, name in (("vlm", RUN), ("diffusion", GEN_RUN)):  # by the command line's code, here
        mmrl_here("train", modality, *QUICK, f"log.output_dir={runs}", f"log.run_name={name}", "log.progress=false")
    (root / "secret.txt").write_text("not for the page")
    port = _free_port()
    app, play, launcher = launch_app(runs, port=port, upload_dir=root / "uploads", block=False, max_upload="1mb")
    yield {"url": f"http://127.0.0.1:{port}", "root": root, "runs": runs, "play": play}
    launcher.close()
    app.close()


@pytest.fixture(scope="module")
def page(demo_server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(demo_server["url"])
        yield page
        browser.close()


def _shot(page, name: str, tmp_path: Path) -> None:
    where = Path(os.environ.get("MMRL_DEMO_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(1000)  # let the outputs' fade-in finish
    page.screenshot(path=str(where / f"{name}.png"), full_page=True)
    assert (where / f"{name}.png").stat().st_size > 0


# Whether a table's column header reads `name` and lies inside the table's box (not scrolled or cut off).
HEADER_IN_SIGHT_JS = """([id, name]) => {
    const table = document.querySelector('#' + id), box = table.getBoundingClientRect();
    const cells = [...table.querySelectorAll('th')].filter(c => c.innerText.trim() === name);
    return cells.length > 0 && cells.every(c => {
        const r = c.getBoundingClientRect(); return r.width > 0 && r.left >= box.left && r.right <= box.right + 1; });
}"""


def _open(page, tab: str) -> None:
    page.get_by_role("tab", name=tab).click()


STATUS_JS = "id => (document.querySelector('#' + id + ' .prose') || {innerText: ''}).innerText"


def _status(page, elem_id: str) -> str:
    """The message of a status line (not Gradio's "processing" tracker beside it)."""
    return page.evaluate(STATUS_JS, elem_id)


def _click(page, button_id: str, status_id: str) -> None:
    """Click, then wait until the status line changes (each step of these tests expects a new
    message)."""
    before = _status(page, status_id)
    page.locator(f"#{button_id}").click()
    page.wait_for_function(f"([id, old]) => ({STATUS_JS})(id) !== old",
                           arg=[status_id, before], timeout=TIMEOUT_MS)


def _wait_status(page, elem_id: str, *words: str) -> str:
    page.wait_for_function(
        f"([id, words]) => {{ const t = ({STATUS_JS})(id); return words.some(w => t.includes(w)); }}",
        arg=[elem_id, list(words)], timeout=TIMEOUT_MS)
    return _status(page, elem_id)


def _scene_png(path: Path) -> Path:
    from mmrl.data.scenes import scene_with_targets
    import random

    scene = scene_with_targets(random.Random(3), ("red", "circle"), num_targets=2, num_distractors=1, size=112)
    scene.image.save(path)
    return path


def test_try_a_policy_samples_and_draws_with_the_reward_table(page, tmp_path):
    _open(page, "Try a policy")
    _click(page, "try-sample", "try-status")
    text = _wait_status(page, "try-status", "sample(s) of counting", "error")
    assert "error" not in text
    assert page.locator("#try-gallery img").count() >= 1
    table = page.locator("#try-table").inner_text()
    assert "parsed answer" in table and "accuracy" in table and "format" in table
    _shot(page, "try", tmp_path)


def test_an_uploaded_image_is_read_by_the_task_and_a_corrupt_one_is_a_message(page, demo_server, tmp_path):
    _open(page, "Try a policy")
    page.locator("#tab-try").get_by_text("or upload an image or a clip").click()  # open the accordion
    page.locator("#try-upload input[type=file]").set_input_files(str(_scene_png(tmp_path / "scene.png")))
    page.locator("#try-record textarea").fill(json.dumps({"question": "How many red circles are there?",
                                                          "answer": "2"}))
    _click(page, "try-sample", "try-status")
    text = _wait_status(page, "try-status", "sample(s) of counting", "error")
    assert "error" not in text and "scene.png" in text, text
    assert page.locator("#try-gallery img").count() >= 1
    bad = tmp_path / "broken.png"
    bad.write_text("this is text, not a PNG")
    page.locator("#try-upload button[aria-label='Clear']").click()
    page.locator("#try-upload input[type=file]").set_input_files(str(bad))
    _click(page, "try-sample", "try-status")
    text = _wait_status(page, "try-status", "error")
    assert "could not be read" in text or "no usable example" in text
    page.locator("#try-upload button[aria-label='Clear']").click()  # the server still answers: greedy synthetic
    _click(page, "try-sample", "try-status")
    assert "error" not in _wait_status(page, "try-status", "sample(s) of counting", "error")


def test_before_after_shows_both_models_and_the_summary(page, tmp_path):
    _open(page, "Before / after")
    page.locator("#compare-run input").click()
    page.get_by_role("option", name=RUN, exact=True).click()
    _click(page, "compare-go", "compare-status")
    text = _wait_status(page, "compare-status", "same input", "error")
    assert "error" not in text, text
    assert page.locator("#compare-before img").count() >= 1 and page.locator("#compare-after img").count() >= 1
    assert "counting" in text and "accuracy" in page.locator("#compare-summary").inner_text()
    for table in ("compare-before-table", "compare-after-table"):  # the reward columns are not cut off
        assert page.evaluate(HEADER_IN_SIGHT_JS, [table, "reward"]), table
    _shot(page, "before_after", tmp_path)


def test_generators_tab_makes_images_with_rewards(page, tmp_path):
    _open(page, "Generators")
    page.locator("#gen-after input").click()
    page.get_by_role("option", name=f"run: {GEN_RUN}").click()
    _click(page, "gen-go", "gen-status")
    text = _wait_status(page, "gen-status", "sample(s) of composition", "error")
    assert "error" not in text, text
    assert page.locator("#gen-before img").count() == 4 and page.locator("#gen-after-gallery img").count() == 4
    assert "composition" in page.locator("#gen-before-table").inner_text()
    assert "composition" in page.locator("#gen-after-table").inner_text()
    _shot(page, "generators", tmp_path)


def test_runs_tab_shows_curves_rollouts_and_config_and_follows_a_run(page, demo_server, tmp_path):
    _open(page, "Runs")
    page.locator("#runs-refresh").click()
    page.locator("#runs-run input").click()
    page.get_by_role("option", name=RUN, exact=True).click()
    _wait_status(page, "runs-status", f"{RUN}")
    assert "finished, step 2 of 2" in _status(page, "runs-status")
    page.wait_for_function("() => document.querySelectorAll('#runs-rollouts img').length > 0", timeout=TIMEOUT_MS)
    page.wait_for_function("() => document.querySelector('#runs-plot-reward canvas, #runs-plot-reward svg')",
                           timeout=TIMEOUT_MS)
    assert page.locator("#runs-evals img").count() >= 1
    _shot(page, "runs", tmp_path)
    # live: a step appended to metrics.jsonl (as a training run writes it) shows up without a click
    metrics = demo_server["runs"] / RUN / "metrics.jsonl"
    last = json.loads(metrics.read_text().splitlines()[-2])
    with metrics.open("a") as f:
        f.write(json.dumps({**last, "step": 3, "reward": 0.123}) + "\n")
    _wait_status(page, "runs-status", "step 3")
    assert "0.123" in _status(page, "runs-status")


def test_launch_a_two_step_run_and_see_it_finish(page, demo_server, tmp_path):
    _open(page, "Launch")
    page.locator("#launch-recipe input").click()
    page.get_by_role("option", name="vlm/grounding_tiny", exact=True).click()
    page.locator("#launch-name textarea, #launch-name input").first.fill("launched")
    page.wait_for_timeout(2500)  # a poll of the status: a name never started shows nothing
    assert _status(page, "launch-status") == ""
    page.locator("#launch-overrides textarea, #launch-overrides input").first.fill(" ".join(QUICK))
    page.locator("#launch-start").click()
    text = _wait_status(page, "launch-status", "finished", "failed", "error")
    assert "finished" in text, text + page.locator("#launch-log textarea").input_value()
    assert "step 2" in text
    assert (demo_server["runs"] / "launched" / "metrics.jsonl").exists()
    assert "name: grounding" in (demo_server["runs"] / "launched" / "config.yaml").read_text()
    _shot(page, "launch", tmp_path)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_files_outside_the_allowed_directories_are_refused(demo_server):
    url, root, runs = demo_server["url"], demo_server["root"], demo_server["runs"]
    for path in ("/etc/passwd", str(root / "secret.txt"), f"{runs}/../secret.txt"):
        status, body = _get(f"{url}/gradio_api/file={path}")
        assert status in (403, 404) and b"not for the page" not in body and b"root:" not in body, (path, status)
    status, body = _get(f"{url}/gradio_api/file={runs / RUN / 'config.yaml'}")
    assert status == 200 and b"task" in body  # the runs directory is served


def test_uploads_over_the_size_limit_are_refused(demo_server):
    boundary = "mmrlboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.png\"\r\n"
            "Content-Type: image/png\r\n\r\n").encode() + b"x" * (2 << 20) + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(f"{demo_server['url']}/gradio_api/upload", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    assert status == 413
    assert not list((demo_server["root"] / "uploads").rglob("big.png"))


def test_the_playground_refuses_uploads_outside_its_directory(demo_server):
    from mmrl.demo.paths import PathRefused

    play = demo_server["play"]
    with pytest.raises(PathRefused):
        play.uploaded_example(play.task("tiny", "counting"), str(demo_server["root"] / "secret.txt"), "{}")
