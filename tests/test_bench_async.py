"""`mmrl bench async`: the model of sync / one-step-off / k-stale training on M+N devices, the reader
of a run's measured costs, and the --simulate command. Nothing here starts a server (the
measurement is a bench, run by `mmrl bench async`)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import mmrl_in_process
from mmrl.bench.async_costs import RunReadError, read_run
from mmrl.bench.async_model import Costs, Layout, predict, predict_table, schedule, simulate


def test_one_step_off_hides_generation_up_to_the_update():
    # gen 3 s, update 1 s, no push. Sync: 3 + 1 = 4 s a step, the trainer waits 3 of every 4.
    # k=1: generation of the next batch runs during the update: max(3, 1) = 3 s a step; the trainer
    # waits 3 - 1 = 2 s of every 3; the generator never waits.
    c = Costs(gen_s=3.0, update_s=1.0, samples=32)
    sync, k1 = predict(c, Layout(1, 1), "sync"), predict(c, Layout(1, 1), "k=1")
    assert sync.step_s == pytest.approx(4.0) and sync.samples_per_s == pytest.approx(8.0)
    assert sync.trainer_idle == pytest.approx(0.75) and sync.rollout_idle == pytest.approx(0.25)
    assert k1.step_s == pytest.approx(3.0) and k1.samples_per_s == pytest.approx(32 / 3)
    assert k1.trainer_idle == pytest.approx(2 / 3) and k1.rollout_idle == pytest.approx(0.0)
    # a deeper queue cannot beat the generator: k=2 is k=1 with constant costs
    assert predict(c, Layout(1, 1), "k=2").step_s == pytest.approx(3.0)


def test_the_push_holds_both_sides():
    # gen 3, update 1, push 0.5. Sync: 0.5 + 3 + 1 = 4.5 s, the trainer busy 1.5 of them (idle 2/3).
    # k=1: the push waits for the batch in flight, then pauses the generator: max(3, 1) + 0.5 = 3.5 s;
    # the trainer idles 3 - 1 = 2 s of 3.5 (4/7), the generator the 0.5 s push (1/7)
    c = Costs(3.0, 1.0, sync_s=0.5)
    sync = predict(c, Layout(1, 1), "sync")
    assert sync.step_s == pytest.approx(4.5) and sync.trainer_idle == pytest.approx(2 / 3)
    k1 = predict(c, Layout(1, 1), "k=1")
    assert k1.step_s == pytest.approx(3.5) and k1.trainer_idle == pytest.approx(4 / 7)
    assert k1.rollout_idle == pytest.approx(1 / 7)
    # trainer-bound: gen 1, update 3: k=1 takes 3 s, the trainer never waits, the generator waits 2 of 3
    t = predict(Costs(1.0, 3.0), Layout(1, 1), "k=1")
    assert t.step_s == pytest.approx(3.0) and t.trainer_idle == pytest.approx(0.0)
    assert t.rollout_idle == pytest.approx(2 / 3)


def test_devices_scale_each_side():
    # gen 4 s and update 6 s on one device each. 2+3 linear: gen 2, update 2 -> sync 4 s, k=1 2 s.
    c = Costs(4.0, 6.0, samples=8)
    assert predict(c, Layout(2, 3), "sync").step_s == pytest.approx(4.0)
    assert predict(c, Layout(2, 3), "k=1").step_s == pytest.approx(2.0)
    # training devices at efficiency 0.5: 3 devices do 1 + 2 * 0.5 = 2x -> update 3 s, k=1 3 s
    assert predict(c, Layout(2, 3, train_efficiency=0.5), "k=1").step_s == pytest.approx(3.0)
    # colocated on the 5 devices (linear): (4 + 6) / 5 = 2 s, nobody waits for anybody
    col = predict(c, Layout(2, 3), "colocated")
    assert col.step_s == pytest.approx(2.0) and col.trainer_idle is None
    assert Layout.parse("2+6") == Layout(2, 6)
    with pytest.raises(ValueError, match="ROLLOUT\\+TRAIN"):
        Layout.parse("8")


def test_a_slow_batch_delays_the_push_that_waits_for_it():
    # generation 1 s a batch except batch 4 (5 s), update 2 s, no push cost. By hand:
    # sync: 3 x 6 steps + (5 + 2) = 25 s.
    # k=1: batch 4 (from step 2's weights, published at 5) runs 5-10; step 3 trains 5-7 and waits for
    #      batch 4 until 10 before it publishes; steps 4-7 follow every 2 s: 18 s.
    # k=2: batch 4 (step 1's weights, at 3) runs 3-8; step 2 (3-5) waits for it before publishing at 8;
    #      batch 5 (step 2's weights) runs 8-9; steps 3-7 every 2 s from 8: 18 s too. The queue is
    #      deeper but each push still waits for the batch k steps ahead.
    gens, updates = [1, 1, 1, 5, 1, 1, 1], [2] * 7
    assert schedule(gens, updates, 0.0, 0).push_end[-1] == 25
    k1, k2 = schedule(gens, updates, 0.0, 1), schedule(gens, updates, 0.0, 2)
    assert k1.push_end == [3, 5, 10, 12, 14, 16, 18] and k1.gen_start[3] == 5 and k1.push_start[2] == 10
    assert k2.push_end == [3, 8, 10, 12, 14, 16, 18] and k2.gen_start[3] == 3 and k2.push_start[1] == 8


def test_variation_slows_the_overlap_and_seeded_draws_repeat():
    # balanced costs (gen = update = 1 s): constant, k=1 runs at 1 s a step (sync: 2 s); with 50%
    # variation each step waits for the slower side: E[max] > 1
    assert simulate(1.0, 1.0, 0.0, 1, steps=2000)["step_s"] == pytest.approx(1.0)
    assert simulate(1.0, 1.0, 0.0, 0, steps=2000)["step_s"] == pytest.approx(2.0)
    k1 = simulate(1.0, 1.0, 0.0, 1, steps=2000, gen_cv=0.5, update_cv=0.5, seed=3)
    assert 1.1 < k1["step_s"] < 1.5
    assert k1 == simulate(1.0, 1.0, 0.0, 1, steps=2000, gen_cv=0.5, update_cv=0.5, seed=3)


def test_per_token_costs_and_rescaled_batches():
    # 0.25 ms a token x 256 tokens x 32 samples = 2.048 s; 0.075 ms -> 0.6144 s
    c = Costs.per_token(0.25, 0.075, tokens=256, samples=32, sync_s=0.1)
    assert c.gen_s == pytest.approx(2.048) and c.update_s == pytest.approx(0.6144) and c.samples == 32
    d = c.with_samples(64)
    assert d.gen_s == pytest.approx(4.096) and d.update_s == pytest.approx(1.2288) and d.sync_s == 0.1
    rows = predict_table(c, [Layout(1, 1), Layout(2, 6)], (0, 1))
    assert [(r.layout, r.mode) for r in rows] == [("1+1", "colocated"), ("1+1", "sync"), ("1+1", "k=1"),
                                                  ("2+6", "colocated"), ("2+6", "sync"), ("2+6", "k=1")]


def _run(tmp_path, rows, asynchronous=False, after=None, name="run"):
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(
        {"train": {"prompts_per_step": 2, "async_rollouts": asynchronous, "max_staleness": 1},
         "rollout": {"num_generations": 4}}))
    lines = [{"step": 0, "eval/accuracy": 0.5}] + rows  # the evaluation before: no reward, not a step
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if after is not None:
        (run / "summary.json").write_text(json.dumps({"before": {}, "after": after}))
    return run


def test_a_sync_runs_metrics_give_its_rate_idle_share_and_costs(tmp_path):
    # step 1 (warm-up, left out): 20 s. Steps 2-4: 4, 4.5, 3.5 s, waits 3, 3.5, 2.5 s, pushes 0.5 s.
    # 2 prompts x 4 = 8 samples a step: 24 samples in 12 s = 2/s; idle 9 / 12 = 0.75;
    # update = step - wait = 1 s each; gen = wait - push = 2.5 s on average (std 0.5: 20%)
    rows = [{"step": 1, "reward": 0.1, "step_time": 20.0, "rollout_wait_time": 19.0, "rollout/weight_sync_time": 5.0}]
    rows += [{"step": s, "reward": 0.2, "step_time": t, "rollout_wait_time": w, "rollout/weight_sync_time": 0.5}
             for s, t, w in ((2, 4.0, 3.0), (3, 4.5, 3.5), (4, 3.5, 2.5))]
    m = read_run(_run(tmp_path, rows, after={"accuracy": 0.7}), warmup=1)
    assert m.samples_per_step == 8 and m.samples_per_s == pytest.approx(2.0)
    assert m.trainer_idle == pytest.approx(0.75) and m.after == {"accuracy": 0.7}
    c = m.costs()
    assert (c.gen_s, c.update_s, c.sync_s, c.samples) == (pytest.approx(2.5), pytest.approx(1.0), 0.5, 8)
    assert c.gen_cv == pytest.approx(0.2) and c.update_cv == pytest.approx(0.0)
    assert m.costs(sync_s=0.0).sync_s == 0.0  # the model's push given, the run's still taken out of gen


def test_older_runs_rollout_time_is_read_and_async_runs_give_no_costs(tmp_path):
    old = read_run(_run(tmp_path, [{"step": 1, "reward": 0.0, "step_time": 2.0, "rollout_time": 1.5}], name="old"),
                   warmup=0)
    assert old.trainer_idle == pytest.approx(0.75) and old.costs().gen_s == pytest.approx(1.5)
    rows = [{"step": 1, "reward": 0.0, "step_time": 2.0, "rollout_wait_time": 0.2, "rollout_time": 0.5,
             "async/staleness": 1.0}]
    a = read_run(_run(tmp_path, rows, asynchronous=True, name="async"), warmup=0)
    assert a.asynchronous and a.staleness == [1.0] and a.scoring_s == [pytest.approx(0.3)]
    with pytest.raises(RunReadError, match="sync run"):
        a.costs()
    with pytest.raises(RunReadError, match="no training steps after the first 1"):
        read_run(tmp_path / "old", warmup=1)
    with pytest.raises(RunReadError, match="metrics.jsonl not found"):
        read_run(tmp_path / "nowhere")


def test_simulate_prints_the_table_from_flags_and_from_a_run(tmp_path):
    r = mmrl_in_process("bench", "async", "--simulate", "--gen-s", "3", "--update-s", "1", "--samples", "32",
                        "--layouts", "1+1")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines if line.startswith("1+1")}
    assert rows[("1+1", "sync")][:3] == ["4", "8", "1.00"] and rows[("1+1", "sync")][3] == "75%"
    assert rows[("1+1", "k=1")][:3] == ["3", "10.7", "1.33"] and rows[("1+1", "k=1")][3] == "67%"
    assert rows[("1+1", "colocated")][:2] == ["2", "16"]
    assert any("predictions, not measurements" in line for line in lines)

    rows = [{"step": s, "reward": 0.0, "step_time": 4.0, "rollout_wait_time": 3.0} for s in (1, 2, 3)]
    r = mmrl_in_process("bench", "async", "--simulate", "--from", _run(tmp_path, rows), "--staleness", "0,1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "generation 3 s" in r.stdout and "update 1 s" in r.stdout and "of 8 samples" in r.stdout
    k1 = [line.split() for line in r.stdout.splitlines() if line.startswith("1+1") and " k=1 " in line][0]
    assert k1[2:5] == ["3", "2.67", "1.33"]

    bad = mmrl_in_process("bench", "async", "--simulate")
    assert bad.returncode == 2 and "--from RUN" in bad.stdout + bad.stderr


def test_the_bench_table_from_measured_runs():
    # per seed, 2 measured steps of 8 samples. Sync: 4 s a step, 3 s waiting: 2 samples/s, idle 0.75.
    # Async (k=1): 3 s a step, 1 s waiting, 0.5 s of the trainer's log-prob passes: 8/3 samples/s,
    # idle 1/3; async / sync = 4/3. Model: gen = 3 - 0.5 = 2.5 s, update = 1 + 0.5 = 1.5 s, no push:
    # k=1 predicted max(2.5, 1.5) = 2.5 s a step, 3.2 samples/s, the trainer idle 1 s of 2.5.
    from mmrl.bench.async_bench import report_lines, summarize
    from mmrl.bench.async_costs import RunMeasure

    def run(mode, seed, step, wait, after, **kw):
        return RunMeasure(f"out/{mode}-seed{seed}", 8, mode == "async", 1, [step] * 2, [wait] * 2,
                          after={"accuracy": after}, **kw)

    runs = {"sync": [run("sync", 0, 4.0, 3.0, 0.70), run("sync", 1, 4.0, 3.0, 0.74)],
            "async": [run("async", s, 3.0, 1.0, a, scoring_s=[0.5, 0.5], staleness=[1.0, 1.0])
                      for s, a in ((0, 0.72), (1, 0.73))]}
    summary = summarize(runs, "accuracy", 1)
    assert summary["modes"]["sync"]["samples_per_s"] == [2.0, 2.0]
    assert summary["modes"]["async"]["trainer_idle"] == [pytest.approx(1 / 3)] * 2
    assert summary["ratio"] == [pytest.approx(4 / 3)] * 2
    assert summary["costs"]["gen_s"] == pytest.approx(2.5) and summary["costs"]["update_s"] == pytest.approx(1.5)
    assert summary["predicted"]["async"]["samples_per_s"] == pytest.approx(3.2)
    assert summary["predicted"]["async"]["trainer_idle"] == pytest.approx(0.4)
    assert summary["predicted"]["sync"]["samples_per_s"] == pytest.approx(2.0)
    text = "\n".join(report_lines(summary, [0, 1], 1))
    assert "| async (k=1) | 2.67 ± 0 | 3 ± 0 | 0.33 ± 0.00 | 0.720, 0.730 | 1.00 ± 0.00 | 3.2 | 0.40 |" in text
    assert "async / sync samples/s: 1.33 ± 0.00" in text
    assert "accuracy after: async mean 0.725, sync seeds 0.700-0.740 (inside" in text


def test_each_runs_overrides_make_a_valid_config(tmp_path):
    from mmrl.bench.async_bench import run_overrides
    from mmrl.config import builtin_config_path, load_config

    for mode, asynchronous in (("sync", False), ("async", True)):
        cfg = load_config(builtin_config_path("vlm/counting_tiny"),
                          run_overrides(mode, 2, 5, 1, "http://127.0.0.1:8011", tmp_path))
        assert cfg.rollout.engine == "vllm_server" and cfg.rollout.server_urls == ["http://127.0.0.1:8011"]
        assert cfg.train.async_rollouts is asynchronous and cfg.train.seed == 2 and cfg.train.steps == 5
        assert cfg.log.run_name == f"{mode}-seed2" and cfg.log.log_every == 1


def test_the_servers_own_cpu_time_is_not_counted_as_other_load():
    # vLLM's engine polls while idle: its process tree (the API server, the engine core, its workers)
    # is left out of "other processes keep N cores busy". Ticks: 10 -> 11 -> 12 the server's, 13 not.
    from mmrl.bench.async_bench import _tree_ticks

    procs = {10: (1, 5), 11: (10, 7), 12: (11, 100), 13: (1, 50)}
    assert _tree_ticks(10, procs) == 112 and _tree_ticks(13, procs) == 50
