"""An episode viewer: each episode of an environment task as a row of its steps, in one HTML page.

``write_episode_viewer`` writes ``index.html`` and one PNG per step (the task's picture: the
screenshot with the click drawn, the action and step reward in its footer). A row starts with the
instruction and the outcome (success in green, failure in red, return and length); each step card
shows the action the policy wrote, the environment's message and the step reward, so an episode
can be stepped through left to right without any tooling. The Prev / Next buttons move between
episodes.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Sequence

from .gallery import RIGHT, WRONG, sample_picture

STYLE = """body{font-family:sans-serif;margin:16px} .ep{display:none;border:3px solid;padding:8px;margin:8px 0}
.ep.on{display:block} .steps{display:flex;gap:8px;overflow-x:auto} .step{border:1px solid #ccc;padding:4px;
max-width:240px;font-size:12px} .step img{max-width:230px} code{white-space:pre-wrap;word-break:break-all}"""
SCRIPT = """let i=0;const eps=document.querySelectorAll('.ep');function show(d){eps[i].classList.remove('on');
i=(i+d+eps.length)%eps.length;eps[i].classList.add('on');document.getElementById('pos').textContent=
(i+1)+' / '+eps.length}"""


def write_episode_viewer(out_dir: Path, task, completions: Sequence[Any], examples: Sequence[dict],
                         episodes: Sequence[Sequence[int]], max_episodes: int = 24) -> Path | None:
    """The viewer of the first ``max_episodes`` ``episodes`` (each an episode's rows in step order,
    :func:`mmrl.core.episodes.episode_rows`; the rows' examples carry ``step_index`` and the
    outcome set by :mod:`mmrl.core.episodes`); None when there are none. Returns the path of ``index.html``."""
    if not episodes:
        return None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = []
    for n, rows in enumerate(episodes[:max_episodes]):
        first = examples[rows[0]]
        colour = RIGHT if first.get("episode_success") else WRONG
        outcome = "success" if first.get("episode_success") else "failure"
        cards = []
        for i in rows:
            ex = examples[i]
            name = f"episode{n:03d}_step{ex['step_index']:02d}.png"
            picture = sample_picture(task, ex, completions[i])
            if picture is not None:
                picture.save(out_dir / name)
            cards.append(
                f"<div class='step'><b>step {ex['step_index'] + 1}</b>"
                + (f"<br><img src='{name}'>" if picture is not None else "")
                + f"<br><code>{html.escape(str(completions[i]))}</code>"
                + f"<br>{html.escape(str(ex.get('step_message', '')))} &middot; reward {ex.get('step_reward', 0):g}</div>")
        blocks.append(
            f"<div class='ep{' on' if n == 0 else ''}' style='border-color:rgb{colour}'>"
            f"<h3>{html.escape(str(first.get('instruction', '')))}</h3>"
            f"<p>{outcome} &middot; return {first.get('episode_return', 0):g} &middot; "
            f"{first.get('episode_length', len(rows))} steps</p><div class='steps'>{''.join(cards)}</div></div>")
    page = (f"<html><head><meta charset='utf-8'><title>episodes</title><style>{STYLE}</style></head><body>"
            f"<button onclick='show(-1)'>Prev</button> <span id='pos'>1 / {len(blocks)}</span> "
            f"<button onclick='show(1)'>Next</button>{''.join(blocks)}<script>{SCRIPT}</script></body></html>")
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
