"""`mmrl bench algos`: variants on the same task and seed, compared in a table, a JSON and a plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmrl.bench.algos import (
    VARIANTS,
    UnknownVariantError,
    moving_average,
    run_algo_bench,
    steps_to_threshold,
    variant_overrides,
)


def _tiny(random_tiny_dir):
    return [f"model.path={random_tiny_dir}", "train.device=cpu", "train.prompts_per_step=2",
            "rollout.num_generations=2", "rollout.max_completion_length=6", "eval.num_examples=4",
            "log.tensorboard=false", "log.save_rollouts_every=0"]


@pytest.mark.slow
def test_two_variants_write_table_json_and_plot(random_tiny_dir, tmp_path):
    from PIL import Image

    out = tmp_path / "bench"
    results = run_algo_bench(["grpo", "spo"], steps=2, seed=0, out_dir=out, extra_overrides=_tiny(random_tiny_dir))
    assert [r["variant"] for r in results] == ["grpo", "spo"]
    for r in results:
        assert r["steps"] == 2 and r["curve"]["step"] == [1, 2]
        assert 0.0 <= r["after"] <= 1.5 and r["wall_time_s"] > 0 and r["time_per_step_s"] > 0
        assert r["threshold"] == results[0]["threshold"]
    # the same seed and starting model: the same held-out reward before training
    assert results[0]["before"] == results[1]["before"]

    summary = json.loads((out / "algos.json").read_text())
    assert [v["variant"] for v in summary["variants"]] == ["grpo", "spo"] and summary["steps"] == 2
    md = (out / "algos.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| variant |") and len(rows) == 3
    assert rows[1].startswith("| grpo |") and rows[2].startswith("| spo |")
    assert "on-policy" in md and any("on-policy" in n for n in summary["notes"])  # one update per batch
    with Image.open(out / "algos.png") as im:
        im.load()
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100

    # each variant ran its own config: spo keeps the samples per step with one sample per prompt
    import yaml

    spo_cfg = yaml.safe_load((out / "spo" / "config.yaml").read_text())
    assert spo_cfg["algo"]["advantage"] == "spo"
    assert spo_cfg["rollout"]["num_generations"] == 1 and spo_cfg["train"]["prompts_per_step"] == 4
    grpo_cfg = yaml.safe_load((out / "grpo" / "config.yaml").read_text())
    assert grpo_cfg["algo"]["advantage"] == "grpo" and grpo_cfg["algo"]["epsilon_high"] is None
    assert grpo_cfg["train"]["steps"] == 2 and grpo_cfg["train"]["seed"] == 0


def test_unknown_variant_is_an_error_listing_the_valid_ones(tmp_path):
    with pytest.raises(UnknownVariantError, match="valid: grpo"):
        run_algo_bench(["grpo", "ppo_typo"], steps=1, seed=0, out_dir=tmp_path)
    assert not (tmp_path / "grpo").exists()  # nothing ran
    r = subprocess.run([sys.executable, "-m", "mmrl.cli", "bench", "algos", "--variants", "grpo,nope",
                        "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    err = " ".join(r.stderr.split())
    assert "nope" in err and all(name in err for name in VARIANTS)
    assert not (tmp_path / "b").exists()


def test_every_variant_resolves_to_a_valid_config():
    from mmrl.config import builtin_config_path, load_config

    base = load_config(builtin_config_path("vlm/counting_tiny"), [])
    for name in VARIANTS:
        cfg = load_config(builtin_config_path("vlm/counting_tiny"), variant_overrides(name, base))
        assert cfg.train.prompts_per_step * cfg.rollout.num_generations == 16 * 8, name
    dapo = load_config(builtin_config_path("vlm/counting_tiny"), variant_overrides("dapo", base)).algo
    grpo = load_config(builtin_config_path("vlm/counting_tiny"), variant_overrides("grpo", base)).algo
    assert dapo.epsilon_high == 0.28 and grpo.epsilon_high is None and dapo.overlong_filter


def test_moving_average_and_threshold():
    assert moving_average([0, 1, 2, 3, 4, 5, 6], window=5) == [0, 0.5, 1, 1.5, 2, 3, 4]
    assert steps_to_threshold([1, 2, 3], [0.1, 0.5, 0.9], 0.5) == 2
    assert steps_to_threshold([1, 2, 3], [0.1, 0.2, 0.3], 0.5) is None
