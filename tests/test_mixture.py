"""The ``mixture`` task (several tasks in one run, each example labelled with its source) and the
per-source reward scoring that goes with it."""

import pytest

from mmrl.config import load_config
from mmrl.config.schema import TaskConfig
from mmrl.core.reward_computer import PerSourceRewards, RewardComputer, make_reward_computer
from mmrl.registry import TASKS, UnknownNameError, load_plugins

load_plugins([])
from mmrl.tasks.mixture import SourceConcat  # noqa: E402  (after the plugins are importable)

# counting: format 0.5 + accuracy 1.0; grounding: format 0.5 + iou 1.0 (the tasks' defaults).
SMALL = {"counting": {"query": "color", "train_size": 3, "eval_size": 3}, "grounding": {"train_size": 2, "eval_size": 2}}


def _mixture(**options):
    return TASKS.get("mixture")(**{"tasks": SMALL, **options})


def _text(messages):
    return " ".join(i["text"] for m in messages for i in m["content"] if i.get("type") == "text")


# -- SourceConcat --------------------------------------------------------------------------------
def _letters():
    return {"a": [{"v": "a0"}, {"v": "a1"}, {"v": "a2"}], "b": [{"v": "b0"}], "c": [{"v": "c0"}, {"v": "c1"}]}


def test_concat_indexing_sizes_offsets():
    seq = SourceConcat(_letters())
    assert len(seq) == 6
    assert seq.source_sizes == {"a": 3, "b": 1, "c": 2}
    assert seq.source_offsets == {"a": 0, "b": 3, "c": 4}
    assert [seq.locate(i) for i in range(6)] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("c", 0), ("c", 1)]
    assert [ex["v"] for ex in seq] == ["a0", "a1", "a2", "b0", "c0", "c1"]
    assert seq[-1]["v"] == "c1" and [ex["v"] for ex in seq[2:5]] == ["a2", "b0", "c0"]
    with pytest.raises(IndexError):
        seq[6]


def test_round_robin_order_continues_after_short_sources_end():
    seq = SourceConcat(_letters(), order="round_robin")
    # round 0: a0 b0 c0; round 1 (b is used up): a1 c1; round 2: a2
    assert [ex["v"] for ex in seq] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert [seq.locate(i) for i in range(6)] == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]
    with pytest.raises(ValueError, match="round_robin"):
        SourceConcat(_letters(), order="shuffled")


@pytest.mark.parametrize("order", ["concat", "round_robin"])
def test_index_of_inverts_locate(order):
    seq = SourceConcat(_letters(), order=order)
    assert [seq.index_of(*seq.locate(i)) for i in range(len(seq))] == list(range(6))
    with pytest.raises(IndexError):
        seq.index_of("b", 1)
    with pytest.raises(KeyError):
        seq.index_of("d", 0)


def test_items_are_labelled_copies():
    parts = _letters()
    seq = SourceConcat(parts)
    ex = seq[3]
    assert ex == {"v": "b0", "source": "b", "source_id": 1}
    assert parts["b"][0] == {"v": "b0"}  # the source's own dict is not modified


# -- the mixture task ----------------------------------------------------------------------------
def test_splits_concatenate_train_and_interleave_eval():
    mix = _mixture()
    train, eval_ = mix.examples("train"), mix.examples("eval")
    assert train.source_sizes == {"counting": 3, "grounding": 2} and train.source_offsets == {"counting": 0, "grounding": 3}
    assert train.locate(3) == ("grounding", 0)
    assert [ex["source"] for ex in train] == ["counting"] * 3 + ["grounding"] * 2
    assert [eval_.locate(i) for i in range(5)] == [
        ("counting", 0), ("grounding", 0), ("counting", 1), ("grounding", 1), ("counting", 2)]
    assert [ex["source_id"] for ex in eval_] == [0, 1, 0, 1, 0]


def test_examples_carry_the_sub_tasks_content():
    mix = _mixture()
    ex = mix.examples("train")[4]
    own = mix.sub_tasks["grounding"].examples("train")[1]
    assert ex["source"] == "grounding" and ex["box"] == own["box"] and ex["objects"] == own["objects"]
    assert ex["image"].tobytes() == own["image"].tobytes()
    assert mix.examples("eval")[2]["answer"] == mix.sub_tasks["counting"].examples("eval")[1]["answer"]


def test_full_size_splits_stay_lazy():
    mix = TASKS.get("mixture")(tasks={"counting": {}, "grounding": {}})
    train = mix.examples("train")
    assert len(train) == 2_000_000 and train.locate(1_000_000) == ("grounding", 0)
    assert train[1_000_000]["id"] == mix.sub_tasks["grounding"].examples("train")[0]["id"]
    assert len(mix.examples("eval")) == 2000


def test_prompt_target_hints_visualize_dispatch():
    mix = _mixture()
    c, g = mix.examples("eval")[0], mix.examples("eval")[1]
    for ex in (c, g):
        sub = mix.sub_tasks[ex["source"]]
        assert _text(mix.prompt(ex)) == _text(sub.prompt(ex)) and ex["question"] in _text(mix.prompt(ex))
        assert mix.target(ex) == sub.target(ex)
        assert mix.hints(ex) == sub.hints(ex)
    assert mix.target(c).endswith(f"<answer>{c['answer']}</answer>")
    assert mix.target(g).endswith(f"<answer>{g['answer']}</answer>")
    mix.sub_tasks["grounding"].hints = lambda ex: ["the box is small"]  # instance override
    assert mix.hints(g) == ["the box is small"]
    assert _text(mix.build_prompt({**c, "hint": "look at the colours"})).endswith("Hint: look at the colours")
    # counting's picture has a label strip under it, grounding's is square
    vc, vg = mix.visualize(c, mix.target(c)), mix.visualize(g, mix.target(g))
    assert vc.size[1] > vc.size[0] and vg.size[1] == vg.size[0]


def test_examples_without_a_known_source_are_refused():
    mix = _mixture()
    ex = dict(mix.examples("eval")[0])
    del ex["source"]
    with pytest.raises(ValueError, match="no 'source'"):
        mix.prompt(ex)
    with pytest.raises(ValueError, match="unknown source 'ocr'.*counting"):
        mix.metrics(["x"], [{**ex, "source": "ocr"}])


def test_metrics_per_source():
    mix = _mixture()
    examples = mix.examples("eval")[0:4]  # counting 0, grounding 0, counting 1, grounding 1
    completions = [mix.target(examples[0]), mix.target(examples[1]), mix.target(examples[2]), "no answer"]
    m = mix.metrics(completions, examples)
    expected = {"counting/count", "grounding/count"}
    expected |= {f"counting/{k}" for k in mix.sub_tasks["counting"].metrics(completions[:1], examples[:1])}
    expected |= {f"grounding/{k}" for k in mix.sub_tasks["grounding"].metrics(completions[:1], examples[:1])}
    assert set(m) == expected
    assert m["counting/count"] == 2 and m["grounding/count"] == 2
    assert m["counting/accuracy"] == 1.0
    assert m["grounding/accuracy"] == 0.5 and m["grounding/mean_iou"] == 0.5 and m["grounding/parsed"] == 0.5
    only = mix.metrics(completions[:1], examples[:1])
    assert only["grounding/count"] == 0 and not any(k.startswith("grounding/") and k != "grounding/count" for k in only)


def test_option_errors():
    with pytest.raises(UnknownNameError, match="did you mean 'counting'.*known: .*grounding"):
        TASKS.get("mixture")(tasks={"countng": {}, "grounding": {}})
    with pytest.raises(ValueError, match="at least two"):
        TASKS.get("mixture")(tasks={"counting": {}})
    with pytest.raises(ValueError, match="mixture cannot contain a mixture"):
        TASKS.get("mixture")(tasks={"counting": {}, "mixture": {}})
    with pytest.raises(ValueError, match="not in the mixture: \\['ocr'\\]"):
        _mixture(rewards={"ocr": {"accuracy": 1.0}})
    with pytest.raises(ValueError, match="valid options"):  # the sub-task's own option check
        TASKS.get("mixture")(tasks={"counting": {"colour": "red"}, "grounding": {}})
    assert list(TASKS.get("mixture")(tasks={"grounding": None, "counting": {}}).sub_tasks) == ["grounding", "counting"]


# -- per-source rewards --------------------------------------------------------------------------
def _per_source():
    return PerSourceRewards({
        "counting": RewardComputer({"format": 0.5, "accuracy": 1.0}),
        "grounding": RewardComputer({"format": 0.5, "iou": 1.0}),
    })


def test_per_source_rewards_hand_batch():
    examples = [
        {"source": "counting", "answer": "2"},
        {"source": "grounding", "box": (0, 0, 10, 10)},
        {"source": "counting", "answer": "3"},
        {"source": "grounding", "box": (0, 0, 10, 10)},
        {"source": "grounding", "box": (0, 0, 10, 10)},
    ]
    completions = [
        "<think>two</think><answer>2</answer>",  # 0.5 * 1 + 1 = 1.5 (counting's maximum)
        "<think>here</think><answer>[0, 0, 10, 10]</answer>",  # 0.5 * 1 + 1 = 1.5 (grounding's maximum)
        "<think>many</think><answer>99</answer>",  # format only: 0.5
        "<think>half</think><answer>[0, 0, 5, 10]</answer>",  # 0.5 + IoU 0.5 = 1.0
        "no idea",  # 0 + unparsable iou (minimum 0) = 0
    ]
    total, comps, stats = _per_source()(completions, examples)
    assert total.tolist() == [1.5, 1.5, 0.5, 1.0, 0.0]
    assert set(comps) == {"format", "accuracy", "iou"}
    assert comps["format"].tolist() == [1, 1, 1, 1, 0]
    assert comps["accuracy"].tolist() == [1, 0, 0, 0, 0]  # 0.0 where the source has no accuracy reward
    assert comps["iou"].tolist() == [0, 1, 0, 0.5, 0]
    assert stats["reward/by_source/counting"] == pytest.approx((1.5 + 0.5) / 2)
    assert stats["reward/by_source/grounding"] == pytest.approx((1.5 + 1.0 + 0.0) / 3)
    assert stats["reward/grounding/iou/unparsable_frac"] == pytest.approx(1 / 3)
    assert stats["reward/counting/accuracy/unparsable_frac"] == 0.0
    assert not any(k.startswith("reward/format") for k in stats)


def test_per_source_rewards_targets_score_each_maximum():
    mix = _mixture()
    scorer = make_reward_computer(mix, TaskConfig(name="mixture"))
    examples = mix.examples("eval")[0:5]
    total, comps, _ = scorer([mix.target(ex) for ex in examples], examples)
    assert total.tolist() == [1.5] * 5  # both tasks' maxima: 0.5 + 1.0
    wrong = ["<answer>99</answer>" if ex["source"] == "counting" else "<answer>[0, 0, 1, 1]</answer>" for ex in examples]
    assert (scorer(wrong, examples)[0] < 1.5).all()


def test_per_source_rewards_edge_cases():
    scorer = _per_source()
    assert scorer.weights == {"format": 0.5, "accuracy": 1.0, "iou": 1.0}
    total, comps, stats = scorer([], [])
    assert total.shape == (0,) and set(comps) == {"format", "accuracy", "iou"} and stats == {}
    total, _, stats = scorer(["<answer>1</answer>"], [{"source": "counting", "answer": "1"}])
    assert "reward/by_source/grounding" not in stats  # absent sources report nothing
    with pytest.raises(ValueError, match="source None"):
        scorer(["x"], [{"answer": "1"}])
    with pytest.raises(ValueError, match="weight 0.5 in source 'counting' but 0.2 in 'grounding'"):
        PerSourceRewards({"counting": RewardComputer({"format": 0.5}), "grounding": RewardComputer({"format": 0.2})})


def test_make_reward_computer_plain_task_matches_the_trainer():
    task = TASKS.get("grounding")()
    plain = make_reward_computer(task, TaskConfig(name="grounding"))
    assert type(plain) is RewardComputer and plain.weights == task.rewards and plain.kwargs == task.reward_kwargs
    cfg = TaskConfig(name="grounding", rewards={"iou": 2.0}, reward_kwargs={"iou": {}})
    custom = make_reward_computer(task, cfg)
    assert custom.weights == {"iou": 2.0} and custom.kwargs["iou"] == {}


def test_make_reward_computer_mixture_options_and_errors():
    mix = _mixture(rewards={"grounding": {"format": 0.5, "iou": 2.0}},
                   reward_kwargs={"grounding": {"format": {"mode": "lenient"}}})
    scorer = make_reward_computer(mix, TaskConfig(name="mixture"))
    assert isinstance(scorer, PerSourceRewards)
    assert scorer.computers["grounding"].weights == {"format": 0.5, "iou": 2.0}
    assert scorer.computers["grounding"].kwargs == {"format": {"mode": "lenient"}}
    assert scorer.computers["counting"].weights == mix.sub_tasks["counting"].rewards
    with pytest.raises(ValueError, match="task.options.rewards.<source>"):
        make_reward_computer(mix, TaskConfig(name="mixture", rewards={"format": 1.0}))
    with pytest.raises(ValueError, match="task.options.reward_kwargs.<source>"):
        make_reward_computer(mix, TaskConfig(name="mixture", reward_kwargs={"format": {"mode": "lenient"}}))
    clash = _mixture(rewards={"grounding": {"format": 0.2, "iou": 1.0}})
    with pytest.raises(ValueError, match="same weight in every source"):
        make_reward_computer(clash, TaskConfig(name="mixture"))


# -- the recipe ----------------------------------------------------------------------------------
def test_mixture_tiny_recipe_loads_and_builds():
    cfg = load_config("vlm/mixture_tiny")
    assert cfg.task.name == "mixture" and cfg.algo.advantage == "stratified_grpo"
    assert cfg.task.options["tasks"] == {"counting": {"query": "color"}, "grounding": {}}
    task = TASKS.get(cfg.task.name)(**dict(cfg.task.options))
    assert list(task.sub_tasks) == ["counting", "grounding"]
    assert task.sub_tasks["counting"].options["query"] == "color"
    assert isinstance(make_reward_computer(task, cfg.task), PerSourceRewards)
