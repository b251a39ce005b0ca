"""`mmrl bench speed`: mmrl and TRL's GRPOTrainer like for like, one table. No timing is asserted
(times on a shared CPU are noise); what must hold is that the runs of a pair did the same work on
the same trained parameters, that the order alternates, and that the table's statistics are the
hand-computed ones."""

from __future__ import annotations

import importlib.util
import inspect
import json
from types import SimpleNamespace

import pytest
import torch

from mmrl.bench.speed import SpeedOptions, mmrl_overrides
from mmrl.bench.speed_common import PhaseClock, median_spread, optimizer_params
from mmrl.bench.speed_compare import HEADER, Row, compare, markdown_table, rows_for, run_order

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                               reason="TRL is not installed (pip install -e \".[bench]\")")


# -- rows, order, statistics (no trainer) ----------------------------------------------------------
def test_rows_come_in_pairs_with_mmrl_first():
    rows = rows_for(("trained", "frozen"), ["static"], ("defaults", "best"))
    assert [(r.pair, r.name, r.side, r.tower) for r in rows] == [
        ("tower trained", "mmrl static", "mmrl", "trained"), ("tower trained", "TRL defaults", "trl", "trained"),
        ("tower trained", "TRL best", "trl", "trained"), ("tower frozen", "mmrl static", "mmrl", "frozen"),
        ("tower frozen", "TRL defaults", "trl", "frozen"), ("tower frozen", "TRL best", "trl", "frozen")]
    lora = rows_for(("trained", "frozen"), [""], ("best",), lora=True)  # LoRA leaves the tower out on both sides
    assert [(r.pair, r.name, r.tower) for r in lora] == [("LoRA, tower frozen", "mmrl LoRA", "frozen"),
                                                         ("LoRA, tower frozen", "TRL best LoRA", "frozen")]
    with pytest.raises(ValueError, match="--towers: unknown half"):
        rows_for(("half",), ["static"], ())
    with pytest.raises(ValueError, match="--trl: unknown fastest"):
        SpeedOptions(trl=("fastest",)).resolved()


def test_the_order_alternates_abba():
    a, b, c = (Row("p", n, "mmrl", "frozen", "") for n in "abc")
    assert [(r, row.name) for r, row in run_order([a, b, c], 3)] == [
        (0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (2, "a"), (2, "b"), (2, "c")]


def _record(pair, name, side, variant, repeat, rate, steps, params, peak):
    """A run whose measured steps are ``steps`` = [(step_s, rollout_s, generate_s, logprobs_s)];
    ``rate`` samples/s (the summary's, set by hand)."""
    s, r, g, lp = (list(x) for x in zip(*steps))
    return {"pair": pair, "name": name, "side": side, "variant": variant, "repeat": repeat,
            "describe": {"weights": "float32", "gradient_checkpointing": "off", "decode": "dynamic cache"},
            "trained_params": params, "step_s": s, "rollout_s": r, "generate_s": g, "logprobs_s": lp,
            "summary": {"samples_per_s": rate, "peak_memory_gib": peak}}


def test_statistics_by_hand():
    """mmrl at 6, 9, 12 samples/s over three repeats against TRL best at 3, 3, 4: ratios 2, 3, 3
    -> median 3 (2-3); rates median 9 (6-12). Phases over mmrl's 3 x 2 steps: step s 1,2 | 1,3 |
    2,2 -> median 2; generate 0.5 each but one 0.7 -> 0.5; update = step - rollout with rollout
    0.6 each -> 0.4,1.4 | 0.4,2.4 | 1.4,1.4 -> median 1.4; other rollout = rollout - generate -
    log-probs (0.1) = 0.0,0.0 | 0.0,0.0 | 0.0,-0.2 -> median 0 (rounding). Memory 3 GiB over
    TRL's 4 = 0.75. TRL defaults (3, 6 samples/s) failed its repeat 2: its ratios are over repeats 0
    and 1 only, 6/3 = 2 and 9/6 = 1.5 -> median 1.75 (1.5-2)."""
    mm = [((1, .6, .5, .1), (2, .6, .5, .1)), ((1, .6, .5, .1), (3, .6, .5, .1)), ((2, .6, .5, .1), (2, .6, .7, .1))]
    records = [_record("tower frozen", "mmrl", "mmrl", "", r, rate, mm[r], 100, 3.0) for r, rate in enumerate((6, 9, 12))]
    records += [_record("tower frozen", "TRL best", "trl", "best", r, rate, [(2, 1, 1, 0)], 100, 4.0)
                for r, rate in enumerate((3, 3, 4))]
    records += [_record("tower frozen", "TRL defaults", "trl", "defaults", r, rate, [(4, 1, 1, 0)], 100, 5.0)
                for r, rate in enumerate((3, 6))]
    records.append({"pair": "tower frozen", "name": "TRL defaults", "side": "trl", "variant": "defaults",
                    "repeat": 2, "note": "failed: RuntimeError: out of memory"})
    table = compare(records)
    mmrl = table["rows"][0]
    assert mmrl["samples_per_s"] == {"median": 9, "min": 6, "max": 12, "n": 3}
    assert mmrl["vs_trl"]["best"] == {"median": 3.0, "min": 2.0, "max": 3.0, "n": 3}
    assert mmrl["vs_trl"]["defaults"] == {"median": 1.75, "min": 1.5, "max": 2.0, "n": 2}
    assert mmrl["phases"]["step_s"] == 2 and mmrl["phases"]["generate_s"] == 0.5
    assert mmrl["phases"]["update_s"] == pytest.approx(1.4) and mmrl["phases"]["logprobs_s"] == 0.1
    assert mmrl["phases"]["other_rollout_s"] == pytest.approx(0.0, abs=1e-12)
    assert mmrl["memory_vs_trl"]["best"] == 0.75 and mmrl["memory_vs_trl"]["defaults"] == 0.6
    defaults = table["rows"][2]
    assert defaults["repeats"] == 2 and defaults["notes"] == ["failed: RuntimeError: out of memory"]
    assert table["pairs"]["tower frozen"] == {"trained_params": 100, "same_trained_params": True}

    md = markdown_table(table).splitlines()
    assert md[0] == HEADER and len(md[0].split("|")) == len(md[2].split("|")) == 17
    cells = [c.strip() for c in md[2].split("|")[1:-1]]
    assert cells[:10] == ["tower frozen", "mmrl", "100", "float32", "off", "dynamic cache", "9 (6-12)",
                          "1.75 (1.50-2.00)", "3.00 (2.00-3.00)", "0.5"]
    assert "failed: RuntimeError: out of memory" in md[-1]


def test_a_pair_training_different_parameters_is_named():
    records = [_record("tower trained", "mmrl", "mmrl", "", 0, 2, [(1, .5, .4, 0)], 120, 1.0),
               _record("tower trained", "TRL best", "trl", "best", 0, 1, [(2, 1, .8, 0)], 100, 1.0)]
    table = compare(records)
    assert table["pairs"]["tower trained"]["same_trained_params"] is False
    assert "pair tower trained: the runs do NOT train the same parameters" in markdown_table(table)
    assert median_spread([]) is None and median_spread([2.0])["n"] == 1


def test_phase_clock_counts_a_call_only_within_its_phase():
    """TRL's log-prob forward runs in the rollout (old log-probs) and in the update (the loss): only
    the rollout's call belongs to the log-probs phase; a phase nested in itself counts once."""
    class Model:
        def logps(self):
            return 1

    clock, m = PhaseClock(torch.device("cpu")), Model()
    clock.wrap(m, "logps", "logprobs", within="rollout")
    assert m.logps() == 1 and clock.take() == {}  # outside the rollout: not counted
    with clock.phase("rollout"):
        with clock.phase("rollout"):  # nested in itself: one interval
            m.logps()
    phases = clock.take()
    assert set(phases) == {"rollout", "logprobs"} and phases["rollout"] >= phases["logprobs"] >= 0
    assert clock.take() == {}


def test_optimizer_params_counts_tied_weights_once():
    emb = torch.nn.Embedding(10, 4)  # 40
    head = torch.nn.Linear(4, 10, bias=True)  # 40 + 10
    head.weight = emb.weight  # tied: 40 once, the bias 10
    groups = SimpleNamespace(param_groups=[{"params": [emb.weight]}, {"params": [head.weight, head.bias]}])
    assert optimizer_params(groups) == 50
    assert optimizer_params(torch.optim.AdamW([emb.weight, head.bias])) == 50


# -- options and settings ------------------------------------------------------------------------------
def test_options_are_checked_before_anything_loads():
    with pytest.raises(ValueError, match="must divide"):
        SpeedOptions(prompts=1, generations=2, micro_batch=3).resolved()
    with pytest.raises(ValueError, match="at least 2"):
        SpeedOptions(generations=1, micro_batch=1).resolved()
    opts = SpeedOptions(prompts=4, generations=8).resolved()
    assert opts.micro_batch == 16 and opts.dtype == "float32"
    assert (opts.repeats, opts.steps, opts.towers, opts.trl) == (3, 5, ("trained", "frozen"), ("defaults", "best"))


def test_the_engine_tower_and_shared_settings_reach_mmrl_config(tmp_path):
    from mmrl.config import builtin_config_path, load_config

    opts = SpeedOptions(prompts=2, generations=4, tokens=16, engine="vllm", lora=True).resolved()
    cfg = load_config(builtin_config_path("vlm/counting_tiny"), mmrl_overrides(opts, "tiny", tmp_path, tower="trained"))
    assert cfg.rollout.engine == "vllm" and cfg.model.lora.enabled and cfg.vlm.freeze_vision is False
    assert (cfg.train.prompts_per_step, cfg.rollout.num_generations, cfg.rollout.max_completion_length) == (2, 4, 16)
    assert cfg.rollout.batch_size == 8 and cfg.train.micro_batch_size == 8 and cfg.algo.beta == 0.0
    frozen = load_config(builtin_config_path("vlm/counting_tiny"), mmrl_overrides(opts, "tiny", tmp_path, tower="frozen"))
    assert frozen.vlm.freeze_vision is True


@pytest.mark.slow
@needs_trl
def test_trl_rows_get_trl_defaults_and_its_best_settings(tmp_path):
    """TRL defaults: GRPOConfig's own gradient checkpointing (on) and dynamic cache; best: the
    static cache and no checkpointing (the weights' dtype is the loader's, see load_model)."""
    from trl import GRPOConfig

    from mmrl.bench.speed_compare import TRL_SETTINGS
    from mmrl.bench.speed_trl import grpo_config
    from mmrl.config import builtin_config_path, load_config

    opts = SpeedOptions(prompts=1, generations=2, tokens=4).resolved()
    cfg = load_config(builtin_config_path("vlm/counting_tiny"), mmrl_overrides(opts, "tiny", tmp_path))
    trl_default = GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert TRL_SETTINGS["defaults"].gradient_checkpointing == trl_default.gradient_checkpointing is True
    assert TRL_SETTINGS["defaults"].cache_implementation == trl_default.cache_implementation is None
    defaults = grpo_config(cfg, opts, tmp_path, TRL_SETTINGS["defaults"])
    best = grpo_config(cfg, opts, tmp_path, TRL_SETTINGS["best"])
    assert (defaults.gradient_checkpointing, defaults.cache_implementation) == (True, None)
    assert (best.gradient_checkpointing, best.cache_implementation) == (False, "static")
    assert defaults.model_init_kwargs is None  # the model is loaded by TRL's loader and passed in


@pytest.mark.slow
@needs_trl
def test_the_trl_internals_the_bench_relies_on_are_still_there():
    """The bench times GRPOTrainer's private methods, loads with TRL's own loader, and the docs say
    TRL's decode is uncompiled because grpo_trainer.py passes disable_compile=True: a TRL release
    that moves any of these fails here, not in a GPU session."""
    import trl.trainer.grpo_trainer as grpo
    from trl import GRPOTrainer
    from trl.trainer.utils import create_model_from_path

    from mmrl.bench.speed_trl import TRL_METHODS

    assert all(callable(getattr(GRPOTrainer, name, None)) for name in TRL_METHODS)
    assert "dtype" in inspect.getsource(create_model_from_path)
    assert "GenerationConfig(**generation_kwargs, disable_compile=True)" in inspect.getsource(grpo)


# -- one real run ------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~40 s on a 2-core CPU: 4 rows x 2 repeats, each loading the tiny model
@needs_trl
def test_a_real_tiny_run_is_like_for_like_and_alternates(tmp_path):
    from mmrl.bench.speed import run_speed_bench

    opts = SpeedOptions(prompts=1, generations=2, tokens=4, steps=1, warmup=0, device="cpu", repeats=2, trl=("best",))
    report = run_speed_bench(opts, tmp_path)

    records = report["records"]
    assert [(r["repeat"], r["pair"], r["name"]) for r in records] == [
        (0, "tower trained", "mmrl"), (0, "tower trained", "TRL best"), (0, "tower frozen", "mmrl"),
        (0, "tower frozen", "TRL best"), (1, "tower frozen", "TRL best"), (1, "tower frozen", "mmrl"),
        (1, "tower trained", "TRL best"), (1, "tower trained", "mmrl")]
    for r in records:  # the same work: 1 prompt x 2 samples x 4 forced tokens, the same prompt tokens
        assert r["samples"] == [2] and r["completion_tokens"] == [8]
        assert r["prompt_tokens"] == records[0]["prompt_tokens"] and r["prompt_tokens"][0] > 0
        assert r["generate_s"][0] > 0 and r["generate_s"][0] + r["logprobs_s"][0] <= r["rollout_s"][0] <= r["step_s"][0]
    # both sides train the same parameters in each pair; the trained tower adds its parameters
    pairs = report["table"]["pairs"]
    assert pairs["tower trained"]["same_trained_params"] and pairs["tower frozen"]["same_trained_params"]
    assert pairs["tower trained"]["trained_params"] > pairs["tower frozen"]["trained_params"] > 0
    mmrl_row = next(r for r in report["table"]["rows"] if r["side"] == "mmrl")
    assert mmrl_row["vs_trl"]["best"]["n"] == 2 and mmrl_row["describe"]["gradient_checkpointing"] == "off"
    trl_row = next(r for r in report["table"]["rows"] if r["side"] == "trl")
    assert trl_row["describe"] == {"weights": "float32", "gradient_checkpointing": "off",
                                   "decode": "static cache, uncompiled"}
    assert not any("NOT" in n for n in report["notes"])  # no same-work warning

    on_disk = json.loads((tmp_path / "speed.json").read_text())
    assert on_disk["settings"]["tokens"] == 4 and on_disk["settings"]["threads"] >= 1
    md = (tmp_path / "speed.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0] == HEADER and len(table) == 1 + 4 and "| tower frozen | TRL best |" in md


@pytest.mark.slow
@needs_trl
def test_cli_reports_a_bad_micro_batch_as_an_error(tmp_path):
    from typer.testing import CliRunner

    from mmrl.cli import app

    res = CliRunner().invoke(app, ["bench", "speed", "--prompts", "1", "--generations", "2", "--micro-batch", "3",
                                   "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "must divide" in " ".join(res.output.split())
