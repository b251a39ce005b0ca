"""GUI learning tests on the shipped tiny GUI models (`mmrl build-tiny gui` and `gui-grounding`):
both GUI recipes, shortened, through the public ``mmrl.train``, asserting held-out episode
success and held-out point accuracy."""

from __future__ import annotations

import json

import pytest
from learning_fixtures import learned, learning_case

# the runs and thresholds: learning_cases.py; the runs are made by the session's pool (learning_fixtures.py)


@pytest.mark.slow
@learning_case("gui_episodes")
def test_tiny_gui_episodes_raise_heldout_success_with_gigpo_and_show_them(learning_results):
    """The multi-step recipe (`configs/gui/synthetic_gui_tiny.yaml`, GiGPO) shortened to 4 steps,
    evaluated on 50 tasks: held-out episode success rises by the case's 0.2, more than the GUI
    issue's 0.15 (measured 2026-11-27: 0.00 -> 0.34; the 24-step recipe ends at 0.40 on 100); every step logs the
    episode metrics, and the evaluation writes the episode viewer and the saved rollouts show the
    steps' screenshots."""
    result = learned("gui_episodes", learning_results)  # success rose by the case's gain
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert len(steps) == 4
    for r in steps:
        assert 0.0 <= r["episode/success"] <= 1.0 and 1.0 <= r["episode/length"] <= 6.0, r
        assert "episode/invalid_actions" in r and "reward/env_reward" in r
    assert {"success", "episode_length", "invalid_actions"} <= set(result.after)
    page = (result.run_dir / "episodes_after" / "index.html").read_text()
    assert page.count("class='ep") == 24 and "step 1" in page  # the viewer's first 24 episodes
    saved = list((result.run_dir / "rollouts").rglob("*.png"))
    assert saved, "the saved rollouts show each step's screenshot with the click"


@pytest.mark.slow
@learning_case("gui_grounding")
def test_tiny_grounding_raises_heldout_point_accuracy(learning_results):
    """The screen-grounding recipe (`configs/gui/screen_grounding_tiny.yaml`) shortened to 24 of its
    120 steps at its peak learning rate throughout: greedy held-out point accuracy rises (measured
    2026-11-24: 0.375 -> 0.46 here; the full recipe passes 0.505 at step 40 and ends at 0.545) while
    every answer keeps the format."""
    result = learned("gui_grounding", learning_results)  # point accuracy rose by the case's gain
    assert result.after["parsed"] == 1.0, result.after
