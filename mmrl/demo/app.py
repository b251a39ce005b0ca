"""The Gradio app of ``mmrl demo``: five tabs wired to :class:`~mmrl.demo.playground.Playground`
(try a policy, before / after, generators), :mod:`mmrl.demo.runs_index` (runs) and
:class:`~mmrl.demo.launcher.Launcher` (launch).

Every handler returns a message instead of raising: a bad input (a corrupt upload, a task the
model cannot run) is shown in the page's status line and the server goes on. Element ids
(``elem_id``) name what the browser tests click and read. What it serves is checked first
(:func:`~mmrl.demo.paths.served_roots`); how it ends, :mod:`mmrl.demo.shutdown`.
"""

from __future__ import annotations

import os
import sys
import traceback
from functools import wraps
from pathlib import Path
from typing import Sequence

from .exposure import decide
from .launcher import DEFAULT_MAX_RUNS, Launcher, builtin_recipes
from .paths import AllowedRoots, check_root, served_roots
from .playground import DemoError, Playground, Samples
from .run_dirs import list_runs, run_path
from .runs_index import curve_frames, eval_pictures, read_config_text, read_summary, rollout_gallery, rollout_steps
from .shutdown import serve_until_stopped
from .status import describe, rounded

CURVES = ("reward", "KL", "entropy", "clip fraction", "step time", "eval")
MAX_UPLOAD = "50mb"
CSS = "#launch-log textarea, #try-table td, #runs-config {font-family: ui-monospace, monospace}"
# Characters of a completion shown in the half-width before / after tables (a click shows all).
COMPARE_CELL_CHARS = 40


def _message(exc: BaseException) -> str:
    return f"**error:** {exc}"


def _guarded(n_outputs: int):
    """A handler whose exception becomes the status message (its last output); the other outputs
    are left as they are."""
    import gradio as gr

    def wrap(fn):
        @wraps(fn)
        def run(*args):
            try:
                return fn(*args)
            except (DemoError, ValueError, PermissionError, FileNotFoundError, KeyError, OSError) as exc:
                message = _message(exc)
            except Exception as exc:  # never a crash of the server: show it, keep serving
                traceback.print_exc()
                message = _message(f"{type(exc).__name__}: {exc}")
            return (*[gr.skip()] * (n_outputs - 1), message)
        return run
    return wrap


def _table(samples: Samples, numbers_first: bool = False):
    """The samples as a DataFrame; ``numbers_first`` moves the (long) completion and the parsed
    answer to the end, so in a half-width table the reward columns stay in sight."""
    import pandas as pd

    frame = pd.DataFrame(samples.rows, columns=samples.columns)
    if numbers_first:
        text = [c for c in ("parsed answer", "completion") if c in frame.columns]
        frame = frame[[c for c in frame.columns if c not in text] + text]
    return frame


def build_app(runs_dir: str | Path = "runs", upload_dir: str | Path | None = None,
              model_roots: Sequence[str | Path] = (), device: str = "cpu", launch: bool = True,
              max_runs: int = DEFAULT_MAX_RUNS):
    """The app (a ``gr.Blocks``), its playground and its launcher. ``launch=False`` leaves the
    Launch tab's handlers out (a demo served beyond loopback without a password); at most
    ``max_runs`` runs started from the page train at once."""
    import gradio as gr
    from mmrl.assets import ASSETS_DIR

    runs_dir, upload_dir, model_roots = served_roots(runs_dir, upload_dir, model_roots)
    assets = check_root(ASSETS_DIR, "the shipped assets directory")
    os.environ["GRADIO_TEMP_DIR"] = str(upload_dir)  # uploads land where the playground may read them
    play = Playground(runs_dir, upload_dir, model_roots, device)
    launcher = Launcher(runs_dir, AllowedRoots([runs_dir, assets, upload_dir, *model_roots]), max_runs=max_runs)

    with gr.Blocks(title="mmrl demo", analytics_enabled=False) as app:
        gr.Markdown("# mmrl demo\nTry a policy, compare it before and after RL, watch and launch runs.")
        with gr.Tab("Try a policy", elem_id="tab-try"):
            _try_tab(gr, play)
        with gr.Tab("Before / after", elem_id="tab-compare"):
            _compare_tab(gr, play)
        with gr.Tab("Generators", elem_id="tab-generators"):
            _generators_tab(gr, play)
        with gr.Tab("Runs", elem_id="tab-runs"):
            run, show_run, run_outputs = _runs_tab(gr, runs_dir, launcher)
        with gr.Tab("Launch", elem_id="tab-launch"):
            if launch:
                _launch_tab(gr, launcher)
            else:
                gr.Markdown("Launching is off: this demo is served beyond this machine without a password. "
                            "Restart it with `--auth user:password` to launch runs from here.",
                            elem_id="launch-off")
        app.load(show_run, [run], run_outputs)
    return app, play, launcher


def _input_row(gr, prefix: str):
    """Seed, sample count, temperature; an optional upload and its record."""
    with gr.Row():
        seed = gr.Number(value=0, precision=0, label="synthetic example (seed)", elem_id=f"{prefix}-seed")
        n = gr.Slider(1, 16, value=4, step=1, label="samples", elem_id=f"{prefix}-n")
        temperature = gr.Slider(0.0, 2.0, value=1.0, step=0.1, label="temperature (0: greedy)",
                                elem_id=f"{prefix}-temperature")
    with gr.Accordion("or upload an image or a clip", open=False):
        upload = gr.File(label="image or clip", file_types=["image", "video"], elem_id=f"{prefix}-upload")
        record = gr.Textbox(label="its record (JSON: the task's data format, e.g. question and answer)",
                            lines=2, elem_id=f"{prefix}-record")
        fill = gr.Button("fill the record from the synthetic example", size="sm", elem_id=f"{prefix}-fill")
    return seed, n, temperature, upload, record, fill


def _try_tab(gr, play: Playground):
    models = play.model_choices("vlm")
    with gr.Row():
        model = gr.Dropdown(models, value=models[0], label="model", elem_id="try-model")
        task = gr.Dropdown(play.task_choices("vlm"), value=play.default_task(models[0], "vlm"), label="task",
                           elem_id="try-task")
        refresh = gr.Button("refresh the lists", size="sm")
    seed, n, temperature, upload, record, fill = _input_row(gr, "try")
    go = gr.Button("Sample", variant="primary", elem_id="try-sample")
    status = gr.Markdown(elem_id="try-status")
    gallery = gr.Gallery(object_fit="contain", label="the task's picture of each sample", columns=4, height=360,
                         elem_id="try-gallery")
    table = gr.Dataframe(label="completions, parsed answers and rewards", wrap=True, elem_id="try-table")

    @_guarded(3)
    def sample(label, task_name, seed_, n_, temp, upload_, record_):
        out = play.sample(label, task_name, seed_, n_, temp, upload_, record_)
        source = f"the upload {Path(upload_).name}" if upload_ else f"synthetic example {int(seed_)}"
        done = out.message or f"{len(out.rows)} sample(s) of {task_name} by {label} on {source}: \"{out.input_text}\""
        return out.pictures, _table(out), done

    @_guarded(2)
    def fill_record(label, task_name, seed_):
        return play.record_template(label, task_name, seed_), "record filled from the synthetic example"

    @_guarded(2)
    def on_model(label):
        return gr.update(value=play.default_task(label, "vlm")), ""

    @_guarded(3)
    def refresh_lists():
        return gr.update(choices=play.model_choices("vlm")), gr.update(choices=play.task_choices("vlm")), ""

    go.click(sample, [model, task, seed, n, temperature, upload, record], [gallery, table, status])
    fill.click(fill_record, [model, task, seed], [record, status])
    model.change(on_model, [model], [task, status])
    refresh.click(refresh_lists, [], [model, task, status])


def _compare_tab(gr, play: Playground):
    runs = play.runs()
    with gr.Row():
        run = gr.Dropdown(runs, value=runs[0] if runs else None, label="run", elem_id="compare-run")
        refresh = gr.Button("refresh", size="sm")
    seed, n, temperature, upload, record, fill = _input_row(gr, "compare")
    go = gr.Button("Compare", variant="primary", elem_id="compare-go")
    status = gr.Markdown(elem_id="compare-status")
    summary = gr.Dataframe(label="held-out metrics of the run (summary.json)", elem_id="compare-summary")
    with gr.Row():
        with gr.Column():
            gr.Markdown("### before RL (the run's starting model)")
            before_gallery = gr.Gallery(object_fit="contain", columns=2, height=300, elem_id="compare-before")
            before_table = gr.Dataframe(max_chars=COMPARE_CELL_CHARS, elem_id="compare-before-table")
        with gr.Column():
            gr.Markdown("### after RL (the run's latest checkpoint)")
            after_gallery = gr.Gallery(object_fit="contain", columns=2, height=300, elem_id="compare-after")
            after_table = gr.Dataframe(max_chars=COMPARE_CELL_CHARS, elem_id="compare-after-table")

    @_guarded(6)
    def compare(name, seed_, n_, temp, upload_, record_):
        if not name:
            raise DemoError("no run chosen: train one first (the Launch tab, or `mmrl train`)")
        label = f"run: {name}"
        task_name = play.default_task(label, _modality_of_run(play, name))
        before = play.sample(label, task_name, seed_, n_, temp, upload_, record_, checkpoint=False)
        after = play.sample(label, task_name, seed_, n_, temp, upload_, record_, checkpoint=True)
        return (_summary_table(play.runs_dir, name), before.pictures, _table(before, True), after.pictures,
                _table(after, True),
                f"{task_name}: the same input (\"{after.input_text}\") and seed through the starting model "
                "and the checkpoint")

    @_guarded(2)
    def fill_record(name, seed_):
        label = f"run: {name}"
        return play.record_template(label, play.default_task(label, "vlm"), seed_), ""

    @_guarded(2)
    def refresh_runs():
        return gr.update(choices=play.runs()), ""

    go.click(compare, [run, seed, n, temperature, upload, record],
             [summary, before_gallery, before_table, after_gallery, after_table, status])
    fill.click(fill_record, [run, seed], [record, status])
    refresh.click(refresh_runs, [], [run, status])


def _modality_of_run(play: Playground, name: str) -> str:
    from ..registry import TASKS

    return getattr(TASKS.get(play.default_task(f"run: {name}", "vlm")), "modality", "vlm")


def _summary_table(runs_dir: Path, name: str):
    import pandas as pd

    summary = read_summary(run_path(runs_dir, name))
    before, after = summary.get("before", {}), summary.get("after", {})
    keys = [k for k in before if isinstance(before[k], (int, float))] or \
        [k for k in after if isinstance(after[k], (int, float))]
    return pd.DataFrame([[k, rounded(before.get(k)), rounded(after.get(k))] for k in keys],
                        columns=["held-out", "before", "after"])


def _generators_tab(gr, play: Playground):
    models = play.model_choices("diffusion")
    with gr.Row():
        model = gr.Dropdown(models, value=models[0], label="generator", elem_id="gen-model")
        task = gr.Dropdown(play.task_choices("diffusion"), value=play.default_task(models[0], "diffusion"),
                           label="task", elem_id="gen-task")
        after = gr.Dropdown([""] + [m for m in models if m.startswith("run: ")], value="",
                            label="after RL: a run of this task (optional)", elem_id="gen-after")
    with gr.Row():
        seed = gr.Number(value=0, precision=0, label="synthetic prompt (seed)", elem_id="gen-seed")
        n = gr.Slider(1, 16, value=4, step=1, label="images / clips", elem_id="gen-n")
        prompt = gr.Textbox(label="or your own prompt (not scored: the rewards check generated specs)",
                            elem_id="gen-prompt")
    go = gr.Button("Generate", variant="primary", elem_id="gen-go")
    status = gr.Markdown(elem_id="gen-status")
    with gr.Row():
        with gr.Column():
            before_gallery = gr.Gallery(object_fit="contain", label="the chosen generator", columns=4, height=300,
                                        elem_id="gen-before")
            before_table = gr.Dataframe(wrap=True, elem_id="gen-before-table")
        with gr.Column():
            after_gallery = gr.Gallery(object_fit="contain", label="after RL", columns=4, height=300,
                                       elem_id="gen-after-gallery", visible=False)
            after_table = gr.Dataframe(wrap=True, elem_id="gen-after-table", visible=False)

    @_guarded(5)
    def generate(label, task_name, after_label, seed_, n_, prompt_):
        before = play.sample(label, task_name, seed_, n_, 1.0, prompt=prompt_ or "")
        if after_label:
            later = play.sample(after_label, task_name, seed_, n_, 1.0, prompt=prompt_ or "")
            after_out = (gr.update(value=later.pictures, visible=True), gr.update(value=_table(later, True), visible=True))
        else:
            after_out = (gr.update(value=[], visible=False), gr.update(visible=False))
        note = before.message or f"{len(before.rows)} sample(s) of {task_name} by {label} for \"{before.input_text}\""
        return before.pictures, _table(before, bool(after_label)), *after_out, note

    @_guarded(2)
    def on_model(label):
        return gr.update(value=play.default_task(label, "diffusion")), ""

    go.click(generate, [model, task, after, seed, n, prompt],
             [before_gallery, before_table, after_gallery, after_table, status])
    model.change(on_model, [model], [task, status])


def _runs_tab(gr, runs_dir: Path, launcher: Launcher):
    runs = list_runs(runs_dir)
    with gr.Row():
        run = gr.Dropdown(runs, value=runs[0] if runs else None, label="run", elem_id="runs-run")
        live = gr.Checkbox(value=True, label="refresh every 3 s", elem_id="runs-live")
        refresh = gr.Button("refresh", size="sm", elem_id="runs-refresh")
    status = gr.Markdown(elem_id="runs-status")
    plots = {name: gr.LinePlot(x="step", y="value", color="metric", title=name, height=240,
                               elem_id=f"runs-plot-{name.replace(' ', '-').lower()}") for name in CURVES}
    with gr.Row():
        step = gr.Dropdown([], label="rollouts of step", elem_id="runs-step")
    rollouts = gr.Gallery(object_fit="contain", label="saved rollouts", columns=4, height=300, elem_id="runs-rollouts")
    evals = gr.Gallery(object_fit="contain", label="held-out samples and eval galleries", columns=3, height=300,
                       elem_id="runs-evals")
    with gr.Accordion("summary and resolved config", open=False):
        summary = gr.JSON(elem_id="runs-summary")
        config = gr.Code(language="yaml", elem_id="runs-config")

    @_guarded(len(CURVES) + 6)
    def show(name):
        if not name:
            return (*[None] * len(CURVES), gr.update(choices=[]), [], [], {}, "", "no runs yet")
        where = run_path(runs_dir, name)
        frames = curve_frames(where)
        steps = rollout_steps(where)
        line = describe(name, launcher.status(name))
        plotted = [gr.update(value=frames[c], visible=True) if c in frames else gr.update(visible=False)
                   for c in CURVES]
        return (*plotted, gr.update(choices=[str(s) for s in steps],
                value=str(steps[-1]) if steps else None), rollout_gallery(where), eval_pictures(where),
                read_summary(where), read_config_text(where), line)

    @_guarded(2)
    def show_step(name, step_):
        if not name or not step_:
            return [], ""
        return rollout_gallery(run_path(runs_dir, name), int(step_)), ""

    @_guarded(len(CURVES) + 7)
    def refresh_all(name):
        names = list_runs(runs_dir)
        name = name if name in names else (names[0] if names else None)
        return (gr.update(choices=names, value=name), *show(name))

    outputs = [*plots.values(), step, rollouts, evals, summary, config, status]
    run.change(show, [run], outputs)
    step.input(show_step, [run, step], [rollouts, status])
    refresh.click(refresh_all, [run], [run, *outputs])
    timer = gr.Timer(3.0)
    timer.tick(lambda name, on: show(name) if on else (*[gr.skip()] * len(outputs),), [run, live], outputs)
    return run, show, outputs


def _launch_tab(gr, launcher: Launcher):
    recipes = builtin_recipes()
    with gr.Row():
        first = "vlm/counting_tiny" if "vlm/counting_tiny" in recipes else (recipes[0] if recipes else None)
        recipe = gr.Dropdown(recipes, value=first, label="recipe", elem_id="launch-recipe")
        name = gr.Textbox(label="run name", value="demo-run", elem_id="launch-name")
    overrides = gr.Textbox(label="overrides (key=value ...: allow-listed keys, paths inside the served directories; "
                                 "see docs/demo.md)", value="train.steps=2", elem_id="launch-overrides")
    runs = "1 run" if launcher.max_runs == 1 else f"{launcher.max_runs} runs"
    gr.Markdown(f"At most {runs} started here train at once (`mmrl demo --max-runs N`); stop one to start "
                "another.", elem_id="launch-cap")
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="launch-start")
        stop = gr.Button("Stop", variant="stop", elem_id="launch-stop")
    status = gr.Markdown(elem_id="launch-status")
    log = gr.Textbox(label="log", lines=12, max_lines=12, elem_id="launch-log")

    def describe_run(run_name):
        s = launcher.status(run_name)
        return describe(run_name, s), s["log_tail"]

    @_guarded(2)
    def on_start(recipe_, overrides_, run_name):
        launcher.start(recipe_, overrides_, run_name)
        line, _ = describe_run(run_name)
        return "", line

    @_guarded(2)
    def on_stop(run_name):
        launcher.stop(run_name)
        line, tail = describe_run(run_name)
        return tail, line

    @_guarded(2)
    def poll(run_name):
        if not run_name:
            return gr.skip(), gr.skip()
        line, tail = describe_run(run_name)
        return tail, line

    start.click(on_start, [recipe, overrides, name], [log, status], api_name="launch_start")
    stop.click(on_stop, [name], [log, status], api_name="launch_stop")
    gr.Timer(2.0).tick(poll, [name], [log, status])


def launch_app(runs_dir: str | Path = "runs", host: str = "127.0.0.1", port: int = 7860, share: bool = False,
               model_roots: Sequence[str | Path] = (), upload_dir: str | Path | None = None, device: str = "cpu",
               block: bool = True, max_upload: str = MAX_UPLOAD, auth: tuple[str, str] | None = None,
               no_auth: bool = False, max_runs: int = DEFAULT_MAX_RUNS):
    """Build and serve the app; files are served only from the runs, assets, upload and model
    directories (a root that is a link or another user's is refused first: RootRefused). Beyond
    loopback (a non-loopback ``host``, or ``share``) it needs ``auth`` (Gradio's login), or
    ``no_auth`` and then has no Launch tab (:func:`~mmrl.demo.exposure.decide`, which raises
    ExposureRefused before anything starts). ``block=True`` serves until Ctrl-C, SIGTERM or SIGHUP,
    then stops the runs it launched; ``block=False`` returns ``(app, playground, launcher)`` with
    the server running (the tests)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    exposure = decide(host, share, auth, no_auth)
    if exposure.warning:
        print(f"mmrl demo: warning: {exposure.warning}", file=sys.stderr, flush=True)
    app, play, launcher = build_app(runs_dir, upload_dir, model_roots, device, launch=exposure.launch,
                                    max_runs=max_runs)
    app.launch(server_name=host, server_port=port, share=share, auth=exposure.auth,
               allowed_paths=[str(r) for r in launcher.roots.roots], max_file_size=max_upload, ssr_mode=False,
               prevent_thread_lock=True, quiet=True, show_error=True, css=CSS)
    if block:  # Gradio's own banner would suggest `share=True in launch()`; this is the command line's
        print(f"mmrl demo: {app.local_url}" + (f" and {app.share_url}" if app.share_url else
              " (for a public gradio.live link: mmrl demo --share --auth user:password)"), flush=True)
        serve_until_stopped(app, launcher)
    return app, play, launcher
