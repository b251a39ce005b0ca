"""`mmrl bench algos` over seeds: IQM, mean, median and optimality gap with stratified-bootstrap
intervals and performance profiles, from rliable (Agarwal et al., NeurIPS 2021)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from mmrl.bench import algo_stats, rliable_import
from mmrl.bench.algo_figures import over_seeds
from mmrl.bench.algo_report import write_report

needs_rliable = pytest.mark.skipif(importlib.util.find_spec("rliable") is None,
                                   reason="rliable is not installed: pip install -e '.[bench]'")
# 8 runs of one variant, out of order: sorted 0.1 0.2 0.3 0.4 0.5 0.6 0.9 1.0
EIGHT = [0.9, 0.1, 0.5, 0.3, 1.0, 0.2, 0.6, 0.4]


def _run(seed: int, acc: float | None, reward: float = 0.8) -> dict:
    return {"seed": seed, "metric": "accuracy" if acc is not None else None, "metric_before": 0.25,
            "metric_after": acc, "pass1_after": 0.4, "passk_after": 0.9, "pass_k": 8, "before": 0.3, "after": reward,
            "final_train_reward": reward, "steps": 2, "wall_time_s": 2.0, "time_per_step_s": 1.0,
            "median_step_time_s": 1.0, "total_time_s": 3.0, "curve": {"step": [1, 2], "reward": [0.2, 0.4],
                                                                     "reward_ma": [0.2, 0.4]},
            "run_dir": f"r{seed}", "eval_before": {}, "eval_after": {}, "reward_components_final": {}}


def _variant(name: str, scores, rewards=None) -> dict:
    rewards = rewards or [0.8] * len(scores)
    return over_seeds(name, [_run(s, a, r) for s, (a, r) in enumerate(zip(scores, rewards))], [])


@pytest.mark.slow
@needs_rliable
def test_rliable_loads():
    # rliable 1.2.0 pins arch<8, whose import breaks on pandas 3; the adapter must still load it
    rly = rliable_import.load()
    assert callable(rly.library.get_interval_estimates) and callable(rly.metrics.aggregate_iqm)
    assert callable(rly.plot_utils.plot_performance_profiles)


@pytest.mark.slow
@needs_rliable
def test_iqm_is_the_mean_of_the_middle_half_with_a_deterministic_interval():
    from scipy.stats import trim_mean

    results = [_variant("grpo", EIGHT)]
    state = np.random.get_state()
    try:
        np.random.seed(7)
        expected_next = np.random.rand()
        np.random.seed(7)
        stats = algo_stats.aggregate_over_seeds(results, reps=2000)
        # nobody else's random numbers moved: the global state is as the caller left it
        assert np.random.rand() == expected_next
    finally:
        np.random.set_state(state)

    row = stats["variants"]["grpo"]
    assert stats["score"] == "accuracy after" and row["scores"] == EIGHT
    # IQM: drop floor(8 / 4) = 2 runs at each end (0.1, 0.2 and 0.9, 1.0), average the middle four
    assert row["iqm"]["estimate"] == pytest.approx((0.3 + 0.4 + 0.5 + 0.6) / 4)  # 0.45
    assert row["iqm"]["estimate"] == pytest.approx(trim_mean(EIGHT, 0.25))
    assert row["mean"]["estimate"] == pytest.approx(4.0 / 8)  # 0.5
    assert row["median"]["estimate"] == pytest.approx(0.5)  # median of the one task's mean
    assert row["optimality_gap"]["estimate"] == pytest.approx(1 - 0.5)  # gamma = 1, no score above it
    for name in ("iqm", "mean", "median", "optimality_gap"):
        lo, hi = row[name]["ci"]
        assert lo <= row[name]["estimate"] <= hi and lo < hi
    lo, hi = row["iqm"]["ci"]
    assert 0.1 <= lo and hi <= 1.0  # within the scores
    again = algo_stats.aggregate_over_seeds(results, reps=2000)
    assert again["variants"] == stats["variants"]  # the same intervals, call after call


@pytest.mark.slow
@needs_rliable
def test_one_seed_gives_a_degenerate_interval_not_a_crash():
    stats = algo_stats.aggregate_over_seeds([_variant("grpo", [0.5]), _variant("dapo", [0.6])], reps=200)
    row = stats["variants"]["grpo"]
    assert row["iqm"] == {"estimate": 0.5, "ci": None} and "1 seed" in row["degenerate"]
    header, rows = algo_stats.table_rows(stats)
    assert header[2] == "accuracy after: IQM [95% CI]"
    assert rows[0] == ["grpo", "1", "0.500 [degenerate: 1 seed]", "0.500 [degenerate: 1 seed]"]
    assert any("degenerate" in n for n in algo_stats.stats_notes(stats))
    profile = algo_stats.performance_profiles(stats, reps=50)
    assert profile["bands"] == {"grpo": None, "dapo": None}


@needs_rliable
def test_few_seeds_say_the_iqm_is_the_mean_and_a_task_without_a_metric_uses_the_reward():
    stats = algo_stats.aggregate_over_seeds([_variant("grpo", [None, None, None], [0.2, 0.9, 1.4])], reps=500)
    row = stats["variants"]["grpo"]
    assert stats["score"] == "held-out reward after" and row["scores"] == [0.2, 0.9, 1.4]
    assert "optimality_gap" not in row  # gamma = 1 is the top of a rate, not of a reward
    assert row["iqm"]["estimate"] == pytest.approx(0.833333, abs=1e-6)  # floor(3 / 4) = 0 dropped: the mean
    assert any("equals the mean" in n for n in algo_stats.stats_notes(stats))


@pytest.mark.slow
@needs_rliable
def test_performance_profiles_fall_from_one_to_zero_over_the_scores():
    stats = algo_stats.aggregate_over_seeds([_variant("grpo", EIGHT), _variant("dapo", [0.3, 0.4, 0.5, 0.6])], reps=200)
    profile = algo_stats.performance_profiles(stats, reps=200)
    tau = np.array(profile["tau"])
    # from 5% of the span (0.9) below the lowest score to 5% above the highest, kept within [0, 1] for a rate
    assert tau[0] == pytest.approx(0.1 - 0.045) and tau[-1] == 1.0  # not 1.045
    grpo = np.array(profile["profiles"]["grpo"])
    assert grpo[0] == 1.0 and grpo[-1] == 0.0 and np.all(np.diff(grpo) <= 0)
    # fraction of the eight runs above tau: at tau = 0.45, the four of 0.5, 0.6, 0.9, 1.0
    assert grpo[np.argmin(np.abs(tau - 0.45))] == 0.5
    lo, hi = np.array(profile["bands"]["grpo"])
    assert np.all(lo <= grpo + 1e-12) and np.all(grpo <= hi + 1e-12)


def _valid_png(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100


@pytest.fixture
def few_resamples(monkeypatch):
    """The report's bootstraps with fewer resamples than a real bench's: seconds instead of tens."""
    monkeypatch.setattr(algo_stats, "BOOTSTRAP_REPS", 1000)
    monkeypatch.setattr(algo_stats, "PROFILE_REPS", 200)


@pytest.mark.slow
@needs_rliable
def test_the_report_prints_and_writes_the_iqm_with_intervals(tmp_path, capsys, few_resamples):
    results = [_variant("grpo", [0.5, 0.7]), _variant("dapo", [0.55, 0.6])]
    write_report(results, tmp_path, config="vlm/counting_tiny", steps=2, seed=[0, 1])
    out = capsys.readouterr().out
    assert "IQM" in out and "stratified-bootstrap" in out
    md = (tmp_path / "algos.md").read_text()
    assert "| variant | seeds | accuracy after: IQM [95% CI] | mean [95% CI] |" in md
    assert re.search(r"\| grpo \| 2 \| 0\.600 \[0\.500, 0\.700\] \|", md)  # 2 runs: resamples average 0.5 or 0.7
    summary = json.loads((tmp_path / "algos.json").read_text())
    assert summary["aggregates"]["profiles_png"] == "algos_profiles.png"
    assert summary["aggregates"]["reps"] == 1000 and summary["aggregates"]["profiles"]["reps"] == 200
    for v in summary["variants"]:
        iqm = v["aggregates"]["iqm"]
        assert iqm["ci"][0] <= iqm["estimate"] <= iqm["ci"][1]
    _valid_png(tmp_path / "algos_profiles.png")


def test_without_rliable_the_report_still_writes_and_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    def missing():
        raise rliable_import.RliableMissingError("IQM ... need rliable: pip install 'mmrl[bench]'")

    monkeypatch.setattr(rliable_import, "load", missing)
    write_report([_variant("grpo", [0.5, 0.7])], tmp_path, config="vlm/counting_tiny", steps=2, seed=[0, 1])
    assert "mmrl[bench]" in capsys.readouterr().out
    summary = json.loads((tmp_path / "algos.json").read_text())
    assert summary["aggregates"] is None and any("mmrl[bench]" in n for n in summary["notes"])
    assert (tmp_path / "algos.md").exists() and not (tmp_path / "algos_profiles.png").exists()


def _fake_train(accuracy):
    """Stands in for mmrl.train: writes the metrics.jsonl a run writes and returns its held-out figures."""
    from mmrl.core.trainer import TrainResult

    def train(config, overrides):
        opts = dict(o.split("=", 1) for o in overrides)
        run_dir = Path(opts["log.output_dir"]) / opts["log.run_name"]
        run_dir.mkdir(parents=True)
        steps = int(opts["train.steps"])
        rows = [{"step": s, "reward": 0.3 + 0.1 * s, "step_time": 0.01} for s in range(1, steps + 1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        acc = accuracy[opts["log.run_name"]]
        return TrainResult(run_dir, {"reward": 0.3, "accuracy": 0.25}, {"reward": 0.5 + acc, "accuracy": acc,
                                                                         "pass@1": acc, "pass@8": 0.9}, steps)

    return train


@pytest.mark.slow
@needs_rliable
def test_bench_algos_over_two_seeds_prints_iqm_and_writes_the_profiles(tmp_path, monkeypatch, few_resamples):
    """The CLI path end to end, with training replaced by a stand-in (the slow test in test_bench.py trains)."""
    from typer.testing import CliRunner

    import mmrl
    from mmrl.cli import app

    accuracy = {"grpo-seed0": 0.5, "grpo-seed1": 0.7, "dapo-seed0": 0.55, "dapo-seed1": 0.6}
    monkeypatch.setattr(mmrl, "train", _fake_train(accuracy))
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "b"
    r = CliRunner().invoke(app, ["bench", "algos", "--variants", "grpo,dapo", "--seeds", "0,1", "--steps", "2",
                                 "--out", str(out)], prog_name="mmrl")
    assert r.exit_code == 0, r.output
    assert "accuracy after: IQM [95% CI]" in r.output
    assert re.search(r"grpo\s*│\s*2\s*│\s*0\.600 \[0\.500, 0\.700\]", r.output)
    assert re.search(r"dapo\s*│\s*2\s*│\s*0\.575 \[0\.550, 0\.600\]", r.output)
    _valid_png(out / "algos_profiles.png")
    rows = {v["variant"]: v for v in json.loads((out / "algos.json").read_text())["variants"]}
    assert rows["grpo"]["aggregates"]["scores"] == [0.5, 0.7] and rows["grpo"]["metric_after"] == pytest.approx(0.6)
