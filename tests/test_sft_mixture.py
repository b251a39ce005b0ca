"""The tiny models' warm-start mixture as mmrl sft runs it: a mixture holding one task under several
option sets, the weighted sampler that draws each source by its weight, thought dropout's text and
rate, and the learning-rate schedule that stops the shipped warm starts early."""

from collections import Counter

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.core.batch import make_sampler
from mmrl.vlm.sft import drop_thought


def test_the_weighted_sampler_gives_each_source_its_weights_share():
    sizes = {"a": 10, "b": 30, "c": 5}
    sampler = make_sampler("weighted", sizes, 4000, seed=0, weights={"a": 3, "b": 1, "c": 0})
    picks = sampler.indices(0)
    share = Counter(sampler.source_of(i) for i in picks)
    assert share["c"] == 0  # weight 0: never drawn
    assert abs(share["a"] / 4000 - 0.75) < 0.03 and abs(share["b"] / 4000 - 0.25) < 0.03  # not by size
    assert all(0 <= i < 10 for i in picks if sampler.source_of(i) == "a")
    # examples within a source uniformly: every one of b's 30 is drawn about 1000 / 30 times
    within_b = Counter(i for i in picks if sampler.source_of(i) == "b")
    assert len(within_b) == 30 and max(within_b.values()) < 3 * min(within_b.values())
    # a source it does not name weighs 1: no weights is a uniform draw over the sources
    uniform = Counter(make_sampler("weighted", sizes, 3000, seed=1).source_of(i)
                      for i in make_sampler("weighted", sizes, 3000, seed=1).indices(0))
    assert all(abs(n / 3000 - 1 / 3) < 0.03 for n in uniform.values())


def test_the_weighted_sampler_continues_exactly_from_its_saved_state():
    make = lambda: make_sampler("weighted", {"a": 10, "b": 30}, 8, seed=3, weights={"a": 2})  # noqa: E731
    whole = make()
    steps = [whole.indices(step) for step in range(4)]
    first = make()
    first.indices(0), first.indices(1)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert [resumed.indices(2), resumed.indices(3)] == steps[2:]
    assert make().indices(0) == steps[0]  # a function of the seed
    assert make_sampler("weighted", {"a": 10, "b": 30}, 8, seed=4).indices(0) != steps[0]


def test_the_weighted_sampler_refuses_weights_it_cannot_use():
    with pytest.raises(ConfigError, match=r"no data source named d \(the task's sources: a, b\)"):
        make_sampler("weighted", {"a": 1, "b": 1}, 4, seed=0, weights={"d": 1.0})
    with pytest.raises(ConfigError, match="some source with examples must weigh more than 0"):
        make_sampler("weighted", {"a": 1, "b": 1}, 4, seed=0, weights={"a": 0, "b": 0})


def _scheduler(*overrides, total=600):
    from mmrl.core.optimizer import make_optimizer, step_schedule

    cfg = load_config(None, ["train.learning_rate=1.0", *overrides])
    _, scheduler = make_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg.train, total)

    def rate(step):
        step_schedule(scheduler, step)
        return scheduler.get_last_lr()[0]
    return rate


def test_linear_horizon_stops_part_way_down_a_longer_decay():
    """min(1, (s + 1) / warmup) * max(min_lr_rate, 1 - s / decay_steps) at RL step s + 1."""
    rate = _scheduler("train.lr_scheduler_type=linear_horizon", "train.warmup_steps=20",
                      'train.lr_scheduler_kwargs={"decay_steps": 800, "min_lr_rate": 0.05}')
    assert rate(1) == pytest.approx(1 / 20)  # warmup: the first step already moves
    assert rate(20) == pytest.approx(1 - 19 / 800)
    # the shipped warm start stops at step 600 of an 800-step decay: a quarter of the peak is left
    assert rate(601) == pytest.approx(0.25)
    floor = _scheduler("train.lr_scheduler_type=linear_horizon",
                       'train.lr_scheduler_kwargs={"decay_steps": 800, "min_lr_rate": 0.05}', total=800)
    assert floor(800) == pytest.approx(0.05)  # floored at 5%
    # no horizon: the run's own steps, decaying to 0 at the end (warmup 0: the peak at once)
    plain = _scheduler("train.lr_scheduler_type=linear_horizon", total=10)
    assert plain(1) == pytest.approx(1.0) and plain(6) == pytest.approx(0.5)


def test_scheduler_kwargs_reach_transformers_schedules_and_are_checked_for_ours():
    end = _scheduler("train.lr_scheduler_type=cosine_with_min_lr", 'train.lr_scheduler_kwargs={"min_lr_rate": 0.1}',
                     total=10)
    assert end(10) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(0.9 * torch.pi)).item()))
    with pytest.raises(ConfigError, match=r"linear_horizon schedule takes no decay \(it takes: decay_steps, min_lr_rate"):
        _scheduler("train.lr_scheduler_type=linear_horizon", 'train.lr_scheduler_kwargs={"decay": 8}')


def test_a_mixture_holds_one_task_under_two_option_sets():
    from mmrl import make_task

    mix = make_task("mixture", tasks={"color": {"task": "counting", "query": "color"},
                                      "shape": {"task": "counting", "query": "shape"}})
    assert mix.source_names() == ["color", "shape"]
    assert [t.name for t in mix.sub_tasks.values()] == ["counting", "counting"]
    split = mix.examples("train")
    color, shape = split[0], split[split.source_offsets["shape"]]
    assert color["source"] == "color" and shape["source"] == "shape"
    assert [t.options["query"] for t in mix.sub_tasks.values()] == ["color", "shape"]
    assert mix.prompt(shape) == mix.sub_tasks["shape"].prompt(shape)
    colours = ("red", "green", "blue", "yellow")
    assert any(c in str(mix.prompt(color)[0]["content"][-1]) for c in colours)
    assert not any(c in str(mix.prompt(shape)[0]["content"][-1]) for c in colours)
    assert mix.target(color) == mix.sub_tasks["color"].target(color)
    assert mix.sft_examples("train").source_sizes == split.source_sizes
    with pytest.raises(ValueError, match="cannot contain a mixture"):
        make_task("mixture", tasks={"a": {"task": "mixture"}, "b": {"task": "counting"}})
    with pytest.raises(Exception, match=r"mixture option tasks \(a\)"):
        make_task("mixture", tasks={"a": {"task": "countign"}, "b": {"task": "counting"}})


def test_the_tiny_default_warm_start_is_a_weighted_mixture_of_every_task():
    """The config `mmrl build-tiny vlm` hands to mmrl sft: DEFAULT_TINY_TASKS as a mixture whose
    four counting sources are named by their options, each drawn by its weight."""
    from mmrl.core.trainer import build_task
    from mmrl.vlm.sft_run import sft_sampler
    from mmrl.vlm.tiny_builders import warm_start_overrides
    from mmrl.vlm.tiny_tasks import DEFAULT_TINY_TASKS

    cfg = load_config(None, warm_start_overrides(DEFAULT_TINY_TASKS, 600, 800, 32, 1e-3, 0))
    task = build_task(cfg)
    assert task.source_names()[:4] == ["counting_color", "counting_color_enumerate", "counting_shape",
                                       "counting_color_shape"]
    assert len(task.source_names()) == len(DEFAULT_TINY_TASKS) == 12
    assert (cfg.train.lr_scheduler_type, cfg.train.warmup_steps, cfg.vlm.freeze_vision) == ("linear_horizon", 20, True)
    sampler = sft_sampler(cfg, task.source_sizes(task.sft_examples("train")))
    draws = Counter(sampler.source_of(i).startswith("counting") for step in range(100) for i in sampler.indices(step))
    assert abs(draws[True] / 3200 - 12.5 / 20.5) < 0.03  # counting's 12.5 of the 20.5 shares


def test_thought_dropout_removes_only_the_reasoning_block():
    assert drop_thought("<think>I count 2 red shapes.</think><answer>2</answer>") == "<answer>2</answer>"
    assert drop_thought("<answer>2</answer>") == "<answer>2</answer>"


@pytest.mark.slow
def test_thought_dropout_is_read_by_sft_and_refused_by_rl(random_tiny_dir, tmp_path):
    from mmrl.vlm.sft_run import SFTRun, sft_config

    overrides = [f"model.path={random_tiny_dir}", "train.device=cpu", "train.prompts_per_step=8",
                 f"log.output_dir={tmp_path}", "log.progress=false"]
    run = SFTRun(sft_config("vlm/counting_tiny", [*overrides, "data.thought_dropout=1.0"]))
    batch = run.batch([run.train_examples[i] for i in range(4)], drop=[True, True, False, False])
    texts = [run.policy.tokenizer.decode(ids) for ids in batch.payload["completion_ids"]]
    assert [t.startswith("<think>") for t in texts] == [False, False, True, True]
    assert all("<answer>" in t for t in texts)
    with pytest.raises(ConfigError, match=r"data.thought_dropout=1.0: not used by RL \(mmrl train\)"):
        __import__("mmrl").train("vlm/counting_tiny", [*overrides, "data.thought_dropout=1.0", "train.steps=1"])
    with pytest.raises(ConfigError, match="data.sampler=variance chooses prompts by their rollouts' rewards"):
        SFTRun(sft_config("vlm/counting_tiny", [*overrides, "data.sampler=variance"]))
