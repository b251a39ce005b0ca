"""TTRV's label-free test-time rewards: ``ttrv_agreement`` (frequency) and ``ttrv_low_entropy``
(diversity control), on explicit groups."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.core.reward_computer import PerSourceRewards, RewardComputer
from mmrl.registry import REWARDS
from mmrl.rewards.ttrv import answer_key

agreement = REWARDS.get("ttrv_agreement")
low_entropy = REWARDS.get("ttrv_low_entropy")


def a(text):
    return f"<think>hm</think><answer>{text}</answer>"


NO_LABELS = [{}] * 16  # label-free: the examples' answers are never read


def test_answer_key():
    assert answer_key(a("2")) == answer_key(a("2.0")) == answer_key(a("two")) == answer_key(a(" 2. "))
    assert answer_key(a("Red  Circle.")) == answer_key(a("red circle")) == ("text", "red circle")
    assert answer_key(a("2 circles")) != answer_key(a("2"))  # not a whole number: compared as text
    assert answer_key(a("0")) == answer_key(a("-0"))
    assert answer_key("2") is None and answer_key(a("")) is None and answer_key(a(" . ")) is None
    assert answer_key(None) is None


def test_one_group_without_group_ids():
    """Answers 2, 2.0, 3, (none): counts {2: 2, 3: 1}, K = 4. Agreement 2/4, 2/4, 1/4, None.
    Entropy over {2: 2/4, 3: 1/4, unparsable: 1/4} = 0.5 ln 2 + 0.5 ln 4 = 1.5 ln 2; over
    log 4 = 2 ln 2 that is 0.75, so low_entropy = 0.25 for all four."""
    completions = [a("2"), a("2.0"), a("3"), "no answer"]
    assert agreement(completions, NO_LABELS[:4]) == [0.5, 0.5, 0.25, None]
    assert low_entropy(completions, NO_LABELS[:4]) == pytest.approx([0.25] * 4)


def test_two_groups_from_a_tensor():
    """Group 0 answers a, a, b: agreement 2/3, 2/3, 1/3; H = -(2/3 ln 2/3 + 1/3 ln 1/3)
    = 0.2703 + 0.3662 = 0.63651, / ln 3 (1.09861) = 0.57938, so low_entropy 0.42062.
    Group 1 answers c three times: all 1.0."""
    completions = [a("a"), a("A"), a("b"), a("c"), a("c."), a("C")]
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    assert agreement(completions, NO_LABELS[:6], group_ids=group_ids) == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1, 1, 1])
    assert low_entropy(completions, NO_LABELS[:6], group_ids=group_ids) == pytest.approx(
        [0.42062] * 3 + [1.0] * 3, abs=1e-5)
    # the same batch as one group: a 2, b 1, c 3 of K = 6
    assert agreement(completions, NO_LABELS[:6]) == pytest.approx([2 / 6, 2 / 6, 1 / 6, 3 / 6, 3 / 6, 3 / 6])


def test_interleaved_groups_as_a_list():
    """Groups need not be contiguous: group 7 is samples 0 and 2 (agree), group 3 is 1 and 3
    (differ: agreement 1/2 each; entropy ln 2 / ln 2 = 1, so low_entropy 0)."""
    completions = [a("1"), a("1"), a("one"), a("2")]
    assert agreement(completions, NO_LABELS[:4], group_ids=[7, 3, 7, 3]) == [1.0, 0.5, 1.0, 0.5]
    assert low_entropy(completions, NO_LABELS[:4], group_ids=[7, 3, 7, 3]) == [1.0, 0.0, 1.0, 0.0]


def test_half_and_half():
    """a, a, b, b: H = ln 2, over ln 4 is 1/2, so low_entropy 0.5."""
    completions = [a("x"), a("x"), a("y"), a("y")]
    assert low_entropy(completions, NO_LABELS[:4]) == pytest.approx([0.5] * 4)
    assert agreement(completions, NO_LABELS[:4]) == [0.5] * 4


def test_all_differ_all_agree_all_unparsable():
    differ = [a(str(i)) for i in range(4)]
    assert agreement(differ, NO_LABELS[:4]) == [0.25] * 4
    assert low_entropy(differ, NO_LABELS[:4]) == [0.0] * 4
    same = [a("cat")] * 8
    assert agreement(same, NO_LABELS[:8]) == [1.0] * 8 and low_entropy(same, NO_LABELS[:8]) == [1.0] * 8
    junk = ["", "<answer>", "<answer></answer>", None]
    assert agreement(junk, NO_LABELS[:4]) == [None] * 4
    assert low_entropy(junk, NO_LABELS[:4]) == [0.0] * 4  # unparsables are diversity, not agreement
    # two unparsable, two agreeing: the unparsables do not vote for each other
    mixed = ["x", "y", a("1"), a("1")]
    assert agreement(mixed, NO_LABELS[:4]) == [None, None, 0.5, 0.5]


def test_groups_of_one_and_empty_batch():
    assert agreement([a("1"), "?"], NO_LABELS[:2], group_ids=torch.tensor([0, 1])) == [1.0, None]
    assert low_entropy([a("1"), "?"], NO_LABELS[:2], group_ids=torch.tensor([0, 1])) == [1.0, 0.0]
    assert agreement([], []) == [] and low_entropy([], [], group_ids=torch.tensor([], dtype=torch.long)) == []


def test_caller_bugs_raise():
    with pytest.raises(ValueError):
        agreement([a("1")], [])
    with pytest.raises(ValueError, match="group_ids"):
        agreement([a("1"), a("1")], NO_LABELS[:2], group_ids=torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="group_ids"):
        low_entropy([a("1")], NO_LABELS[:1], group_ids=torch.tensor(0))


def test_through_reward_computer():
    """The recipe for an unlabelled eval set: {ttrv_agreement: 1.0, ttrv_low_entropy: 0.2}.
    Group 0 (x, x, y, none): agreement 0.5, 0.5, 0.25, 0 (unparsable); low_entropy 0.25 each.
    Group 1 (z, z): 1.0 and 1.0. Totals: 0.55, 0.55, 0.3, 0.05, 1.2, 1.2."""
    computer = RewardComputer({"ttrv_agreement": 1.0, "ttrv_low_entropy": 0.2})
    completions = [a("x"), a("x"), a("y"), "?", a("z"), a("z")]
    total, comps, stats = computer(completions, NO_LABELS[:6], group_ids=torch.tensor([0, 0, 0, 0, 1, 1]))
    assert total.tolist() == pytest.approx([0.55, 0.55, 0.3, 0.05, 1.2, 1.2])
    assert stats["reward/ttrv_agreement/unparsable_frac"] == pytest.approx(1 / 6)
    assert stats["reward/ttrv_low_entropy/unparsable_frac"] == 0.0
    assert "reward/ttrv_agreement/errors" not in stats


def test_per_source_rows_keep_groups():
    """PerSourceRewards cuts group_ids with the rows, so each source votes within its groups."""
    scorer = PerSourceRewards({"s": RewardComputer({"ttrv_agreement": 1.0}), "t": RewardComputer({"ttrv_agreement": 1.0})})
    examples = [{"source": s} for s in "sstt"]
    total, _, _ = scorer([a("1"), a("1"), a("1"), a("2")], examples, group_ids=torch.tensor([0, 0, 1, 1]))
    assert total.tolist() == [1.0, 1.0, 0.5, 0.5]


# -- properties ------------------------------------------------------------------------------------
FRAGMENTS = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", ".", "2", "two", "2.0",
                             "Red", "red", "1e999", "nan", "-0", "ſix"])
TEXTS = st.one_of(st.text(), st.lists(st.one_of(FRAGMENTS, st.text(max_size=3)), max_size=10).map("".join))


@st.composite
def batches(draw):
    texts = draw(st.lists(st.one_of(TEXTS, FRAGMENTS.map(lambda f: f"<answer>{f}</answer>")), max_size=12))
    ids = draw(st.lists(st.integers(-3, 3), min_size=len(texts), max_size=len(texts)))
    return texts, torch.tensor(ids, dtype=torch.long)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(batches(), st.booleans())
def test_ttrv_rewards_are_none_or_unit_floats(batch, pass_groups):
    texts, group_ids = batch
    kwargs = {"group_ids": group_ids} if pass_groups else {}
    ids = group_ids.tolist() if pass_groups else [0] * len(texts)
    agree = agreement(texts, [{}] * len(texts), **kwargs)
    entropy = low_entropy(texts, [{}] * len(texts), **kwargs)
    assert len(agree) == len(entropy) == len(texts)
    for i, (x, h) in enumerate(zip(agree, entropy)):
        assert x is None or (type(x) is float and 0.0 < x <= 1.0)
        assert type(h) is float and 0.0 <= h <= 1.0
        k = ids.count(ids[i])
        assert (x is None) == (answer_key(texts[i]) is None)
        if x is not None:
            assert x >= 1 / k - 1e-12
        same = [j for j in range(len(texts)) if ids[j] == ids[i]]
        assert all(entropy[j] == h for j in same)  # one value per group
        unanimous = all(answer_key(texts[j]) is not None and answer_key(texts[j]) == answer_key(texts[i]) for j in same)
        assert (h == 1.0) == unanimous
        assert (x == 1.0) == unanimous


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.lists(TEXTS, min_size=1, max_size=6))
def test_ttrv_without_group_ids_never_raise(texts):
    for fn in (agreement, low_entropy):
        out = fn(texts, [{"answer": "2"}] * len(texts))
        assert all(v is None or 0.0 <= v <= 1.0 for v in out)
