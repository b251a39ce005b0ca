"""``report.html``: one offline page per run directory that a person opens to see how the run went.

The page holds the held-out before/after table (with the confidence intervals of ``summary.json``
where it has them), the curves of ``metrics.jsonl`` (each reward function, the held-out task
metrics, KL, entropy, clip fractions, completion length, the step time split into rollout and
update), the galleries the run saved (``samples_before.png``, ``samples_after.png``, sampled
rollouts, ``mmrl eval`` galleries), and the config with its differences from the recipe. It is
self-contained: the curves are SVG images inside the page (written by :mod:`.report_curves`), the
galleries are the run's own PNGs next to it, there is no script and nothing is fetched.

The trainer and ``mmrl sft`` write it at the end of every run (:func:`report_after_run`, which only
warns when it cannot); ``mmrl report RUN_DIR`` (re)builds it for any run directory, also one still running or
killed: a torn last line of metrics.jsonl is skipped, a missing summary.json leaves the table to
the step-0 evaluation. The config is compared with the recipe the run started from (the first
line of ``config_history/000-start.yaml``, ``# recipe: NAME``, when it was loaded from one), or
with the one given (``--recipe``); a run directory without that line (written before runs
recorded it, or from a ``Config`` built in a script) is compared with the shipped recipe of its
task closest to it, which the page says. A recipe is loaded once per process and the curves need
no matplotlib: a small run's page costs a few tens of milliseconds (tests/test_report.py checks
both), which matters since every run, the test suite's ~100 tiny ones too, writes one.
"""

from __future__ import annotations

import html
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Union
from urllib.parse import quote

from .config_history import HISTORY_DIR, config_changes, flatten
from .logging import read_jsonl
from .report_curves import curves_html, number

__all__ = ["write_report", "report_after_run", "REPORT_NAME"]

REPORT_NAME = "report.html"
MAX_ROLLOUT_STEPS = 3  # rollout galleries shown: the first, the middle and the last saved step
_DASH = "\u2013"


# -- the before/after table -----------------------------------------------------------------------

def _fmt(value: Any) -> str:
    v = number(value)
    return _DASH if v is None else f"{v:.4f}"


def _fmt_interval(low_high: Any) -> str:
    if not isinstance(low_high, (list, tuple)) or len(low_high) != 2 or any(number(v) is None for v in low_high):
        return _DASH
    return f"[{low_high[0]:.3f}, {low_high[1]:.3f}]"


def _row_order(name: str) -> int:
    """Task metrics, then pass@k, then the reward and each component, then bookkeeping."""
    if name in ("parsed", "skipped"):
        return 3
    if name.startswith("pass@"):
        return 1
    return 2 if name == "reward" or name.startswith("reward/") else 0


def _table(summary: dict, records: list[dict]) -> str:
    before, after = summary.get("before") or {}, summary.get("after") or {}
    intervals = summary.get("intervals") or {}
    note = ""
    if not summary:
        before = {k[len("eval/"):]: v for r in records if r.get("step") == 0 for k, v in r.items()
                  if k.startswith("eval/")}
        note = ("<p class=\"note\">No summary.json: the run is still running or was stopped before its final "
                "evaluation. The <em>before</em> column is the step-0 evaluation of metrics.jsonl.</p>")
    names = list(before) + [k for k in after if k not in before]
    if not names:
        return note + "<p>No held-out evaluation recorded.</p>"
    names.sort(key=_row_order)  # stable: the summary's order within each group
    conf = number(intervals.get("confidence"))
    head = f"{conf:.0%} interval" if conf is not None else "interval"
    rows = []
    for name in names:
        b, a = number(before.get(name)), number(after.get(name))
        change = _DASH if a is None or b is None else f"{a - b:+.4f}"
        cells = [name, _fmt(b), _fmt_interval((intervals.get("before") or {}).get(name)), _fmt(a),
                 _fmt_interval((intervals.get("after") or {}).get(name)), change]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    method = intervals.get("method")
    caption = f"<p class=\"note\">Intervals: {html.escape(str(method))}.</p>" if method else ""
    return (note + f'<table id="before-after"><thead><tr><th>metric</th><th>before</th><th>{head}</th>'
            f"<th>after</th><th>{head}</th><th>change</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            + caption)


# -- galleries ------------------------------------------------------------------------------------

def _img(run_dir: Path, path: Path, caption: str) -> str:
    rel = html.escape(quote(path.relative_to(run_dir).as_posix()))
    return (f'<figure class="shot"><a href="{rel}"><img src="{rel}" alt="{html.escape(caption)}"></a>'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _rollout_gallery(run_dir: Path, folder: Path) -> str:
    figs = []
    rows = read_jsonl(folder / "rollouts.jsonl") if (folder / "rollouts.jsonl").exists() else []
    for row in rows:
        media = {k: v for k, v in row.items() if isinstance(v, str) and v.endswith((".png", ".gif"))
                 and (folder / v).is_file()}
        shown = media.get("visualization") or next(iter(media.values()), None)  # boxes drawn, when there are
        text = row.get("prompt", "") if "completion" in media else row.get("completion", "")  # a generator's is media
        caption = f"#{row.get('index', '?')} reward {_fmt(row.get('reward'))}: {str(text)[:160]}"
        figs += [_img(run_dir, folder / shown, caption)] if shown else []
    if not rows:
        figs = [_img(run_dir, p, p.name) for p in sorted(folder.glob("*.png"))]
    return f"<h4>{html.escape(folder.name)}</h4><div class=\"shots\">{''.join(figs)}</div>"


def _galleries(run_dir: Path) -> str:
    parts = []
    samples = [_img(run_dir, run_dir / n, t) for n, t in (("samples_before.png", "held-out samples before training"),
                                                          ("samples_after.png", "held-out samples after training"))
               if (run_dir / n).is_file()]
    if samples:
        parts.append(f"<h3>Held-out samples</h3><div class=\"shots wide\">{''.join(samples)}</div>")
    for index in sorted(run_dir.glob("*/index.html")):  # galleries of `mmrl eval`
        folder = index.parent
        pngs = [_img(run_dir, p, f"{folder.name}/{p.name}") for p in sorted(folder.glob("gallery.png"))]
        parts.append(f"<h3>{html.escape(folder.name)}</h3><p><a href=\"{html.escape(quote(folder.name))}/index.html\">"
                     f"the whole gallery</a></p><div class=\"shots wide\">{''.join(pngs)}</div>")
    steps = sorted(p for p in (run_dir / "rollouts").glob("step_*") if p.is_dir())
    if steps:
        shown = sorted({steps[0], steps[len(steps) // 2], steps[-1]})[:MAX_ROLLOUT_STEPS]
        parts.append(f"<h3>Sampled rollouts ({len(steps)} steps saved, {len(shown)} shown)</h3>"
                     + "".join(_rollout_gallery(run_dir, p) for p in shown))
    return "\n".join(parts) or "<p>No galleries saved yet.</p>"


# -- the config and its diff to the recipe --------------------------------------------------------

def _run_config(run_dir: Path) -> dict[str, Any]:
    import yaml

    return flatten(yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {})


_RECIPES: dict[tuple[str, int], dict[str, Any]] = {}  # (file, mtime_ns) -> its flattened config
_TASKS: dict[str, Optional[str]] = {}  # a shipped recipe -> its task (None: it does not load)


def _recipe_config(name: str) -> dict[str, Any]:
    """The recipe (a file or a built-in name) as config.yaml holds it, flattened; loaded once per
    process (and again when the file changed). Do not change the dict returned."""
    from ..config import builtin_config_path, config_to_dict, load_config

    path = builtin_config_path(name)
    key = (str(path.resolve()), path.stat().st_mtime_ns)
    if key not in _RECIPES:
        _RECIPES[key] = flatten(config_to_dict(load_config(path)))
    return _RECIPES[key]


def _recipe_task(name: str) -> Optional[str]:
    """A shipped recipe's ``task.name`` from its keys alone (cheap, no config built), once per process."""
    if name not in _TASKS:
        from mmrl.config.schema import Config
        from mmrl.config.sources import builtin_config_path, yaml_items

        try:
            items: list = []
            yaml_items(builtin_config_path(name), items, {})
            _TASKS[name] = next((it.value for it in reversed(items) if it.key == "task.name"), Config().task.name)
        except Exception:  # noqa: BLE001 - an unreadable recipe is no candidate
            _TASKS[name] = None
    return _TASKS[name]


def _closest_recipe(run: dict[str, Any]) -> tuple[Optional[str], dict[str, Any]]:
    """The shipped recipe of the run's task whose config differs from the run's in fewest keys (for
    a run directory that does not record its recipe: one written before it did, or by a script)."""
    from mmrl.config.sources import builtin_config_names

    best: tuple[int, Optional[str], dict] = (1 << 30, None, {})
    for name in builtin_config_names():
        if _recipe_task(name) != run.get("task.name"):
            continue
        try:
            recipe = _recipe_config(name)
        except Exception:  # noqa: BLE001 - a recipe needing a plugin that is not installed
            continue
        n = sum(recipe.get(k) != v for k, v in run.items())
        if n < best[0]:
            best = (n, name, recipe)
    return best[1], best[2]


def _started_from(run_dir: Path) -> Optional[str]:
    """The recipe the run's first start was loaded from: the ``# recipe: NAME`` line that
    :func:`~mmrl.runs.config_history.record_start` writes atop ``config_history/000-...yaml``."""
    first = sorted((run_dir / HISTORY_DIR).glob("*.yaml"))[:1]
    try:
        with open(first[0], encoding="utf-8") as f:
            line = f.readline().strip()
    except (IndexError, OSError):
        return None
    name = line[len("# recipe: "):].strip() if line.startswith("# recipe: ") else ""
    return name or None


def _config(run_dir: Path, recipe: Optional[str]) -> str:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return "<p>No config.yaml yet.</p>"
    run, base = _run_config(run_dir), None
    started = _started_from(run_dir) if recipe is None else None
    why = "the run directory does not record which recipe it started from"
    if recipe is not None:
        base, about = _recipe_config(recipe), f"the recipe <code>{html.escape(recipe)}</code> (given)"
    elif started is not None:
        try:
            base, about = _recipe_config(started), f"the recipe it started from, <code>{html.escape(started)}</code>"
        except Exception as exc:  # noqa: BLE001 - a recipe file since removed, a plugin not installed
            why = (f"the recipe it started from, <code>{html.escape(started)}</code>, does not load: "
                   f"{html.escape(repr(exc))}")
    if base is None:
        from ..config import config_to_dict
        from mmrl.config.schema import Config

        name, base = _closest_recipe(run)
        about = (f"the shipped recipe closest to it, <code>{html.escape(name)}</code> ({why}; <code>mmrl report RUN "
                 "--recipe FILE</code> compares with another)") if name else \
            "the schema defaults (no shipped recipe trains this task)"
        base = base or flatten(config_to_dict(Config()))
    changes = config_changes(base, run)
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_yaml(a))}</td><td>{html.escape(_yaml(b))}</td>"
                   "</tr>" for k, a, b in changes)
    diff = (f'<table id="config-diff"><thead><tr><th>key</th><th>recipe</th><th>this run</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>") if changes else "<p>No differences.</p>"
    history = sorted(p.name for p in (run_dir / HISTORY_DIR).glob("*.yaml"))
    starts = (f"<p>Starts of this run (config_history/): {html.escape(', '.join(history))}.</p>"
              if len(history) > 1 else "")
    text = html.escape(path.read_text(encoding="utf-8", errors="replace"))
    return (f"<h3>Differences from the recipe</h3><p>This run's config.yaml compared with {about}.</p>{diff}"
            f"{starts}<details><summary>config.yaml</summary><pre id=\"config-yaml\">{text}</pre></details>")


def _yaml(value: Any) -> str:
    if value is None:
        return _DASH
    return value if isinstance(value, str) else json.dumps(value)


# -- the page -------------------------------------------------------------------------------------

STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1200px;padding:0 16px;color:#222}
h1{margin-bottom:4px}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}.meta,.note{color:#555}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px}th{background:#f3f3f3}
td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}#config-diff td{text-align:left}
.plots,.shots{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0}.plot img{width:290px;height:auto}
.shot img{width:200px;height:auto;image-rendering:pixelated}
.wide .shot{max-width:100%}.wide .shot img{width:auto;max-width:100%;image-rendering:auto}
figcaption{font-size:12px;color:#555;max-width:220px;overflow-wrap:anywhere}.wide figcaption{max-width:none}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:600px}nav a{margin-right:12px}"""


def _section(run_dir: Path, title: str, build: Callable[[], str]) -> str:
    """One part of the page; a part that cannot be drawn says why and the others still are."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - a broken part of a run directory costs only that part
        warnings.warn(f"{run_dir / REPORT_NAME}: {title}: {exc!r}", stacklevel=2)
        return f"<p class=\"note\">This part could not be drawn: {html.escape(repr(exc))}</p>"


def _about(run_dir: Path) -> str:
    """``task T, model M; `` from config.yaml, or nothing (the Config part says why it cannot be read)."""
    try:
        cfg = _run_config(run_dir)
    except Exception:  # noqa: BLE001
        return ""
    return f"task {cfg.get('task.name')}, model {cfg.get('model.path')}; "


def _read_summary(run_dir: Path) -> dict:
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def write_report(run_dir: Union[str, Path], recipe: Optional[str] = None) -> Path:
    """Write ``<run_dir>/report.html`` (module docstring) and return its path. ``recipe`` is the
    recipe to compare the config with (a path or a built-in name; default: the closest shipped one).
    Raises ``FileNotFoundError`` for a directory that is not a run's."""
    run_dir = Path(run_dir)
    if not any((run_dir / n).exists() for n in ("config.yaml", "metrics.jsonl", "summary.json")):
        raise FileNotFoundError(f"{run_dir}: not a run directory (no config.yaml, metrics.jsonl or summary.json); "
                                "give the directory `mmrl train` wrote")
    if recipe is not None:  # a recipe asked for and not found stops here, not as a note on the page
        from ..config import builtin_config_path

        builtin_config_path(recipe)
    metrics = run_dir / "metrics.jsonl"
    records = read_jsonl(metrics) if metrics.is_file() else []
    summary = _read_summary(run_dir)
    steps = [int(r["step"]) for r in records if number(r.get("step")) is not None]
    times = [r["time"] for r in records if number(r.get("time")) is not None]
    status = (f"finished: {summary.get('steps', '?')} steps" if summary else
              f"no summary.json (running, or stopped): {max(steps) if steps else 0} steps logged")
    when = (f"; logged {time.strftime('%Y-%m-%d %H:%M', time.localtime(min(times)))} to "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(max(times)))}") if times else ""
    status = _about(run_dir) + status
    parts = [
        ("results", "Before / after (held-out evaluation)", lambda: _table(summary, records)),
        ("curves", "Curves", lambda: curves_html(records, summary.get("intervals") or {})),
        ("galleries", "Galleries", lambda: _galleries(run_dir)),
        ("config", "Config", lambda: _config(run_dir, recipe)),
    ]
    nav = "".join(f'<a href="#{i}">{html.escape(t)}</a>' for i, t, _ in parts)
    body = "\n".join(f'<h2 id="{i}">{html.escape(t)}</h2>\n{_section(run_dir, t, build)}' for i, t, build in parts)
    name = html.escape(run_dir.resolve().name)
    page = (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>mmrl run {name}</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>{name}</h1>\n<p class=\"meta\">{html.escape(status + when)}"
            f"</p><nav>{nav}</nav>\n{body}\n<p class=\"note\">Written by mmrl at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}; rebuild with <code>mmrl report {html.escape(str(run_dir))}</code>."
            "</p></body></html>\n")
    out = run_dir / REPORT_NAME
    tmp = out.with_name(f".{REPORT_NAME}.tmp-{os.getpid()}")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out


def report_after_run(run_dir: Union[str, Path]) -> Optional[Path]:
    """:func:`write_report` at the end of a run, saying where the page is: a report that cannot be
    written is a warning, never a failed run."""
    try:
        path = write_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - the run itself succeeded
        warnings.warn(f"could not write {Path(run_dir) / REPORT_NAME}: {exc!r} (`mmrl report {run_dir}` retries)",
                      stacklevel=2)
        return None
    print(f"report: {path}", flush=True)
    return path
