"""DeepEyes' reward with its LLM judge (``deepeyes``): the judge prompt is DeepEyes' text, its reply
is read as DeepEyes' code reads it, the formula is hand-worked with a scripted judge, and a real
local chat model (a tiny random Qwen2 built here) answers through transformers."""

from __future__ import annotations

import shutil

import pytest

from mmrl.measures.deepeyes_judge import JUDGE_SYSTEM, judge_prompt, parse_judgement
from mmrl.registry import REWARDS, load_plugins

load_plugins()

# DeepEyes' get_chat_template() and its first in-context example, as vl_agent.py writes them
DEEPEYES_TEMPLATE = """
Below are two answers to a question. Question is [Question], [Standard Answer] is the standard answer to the question, and [Model_answer] is the answer extracted from a model's output to this question.  Determine whether these two answers are consistent.
Note that [Model Answer] is consistent with [Standard Answer] whenever they are essentially the same. If the meaning is expressed in the same way, it is considered consistent, for example, 'pink' and 'it is pink'.
If they are consistent, Judement is 1; if they are different, Judement is 0. Just output Judement and don't output anything else.\\n\\n
"""
DEEPEYES_EXAMPLE_7 = """
[Question]: What color is the towel in the center of the picture?
[Standard Answer]: The towel in the center of the picture is blue.
[Model_answer] : The towel in the center of the picture is pink.
Judgement: 0
"""


def test_the_prompt_is_deepeyes_get_prompt():
    prompt = judge_prompt("left", "The barrier is on the left.", "Where is the barrier?")
    assert prompt.startswith(DEEPEYES_TEMPLATE + "\n[Question]: Is the countertop tan or blue?\n")
    assert DEEPEYES_EXAMPLE_7 + "\n\n" in prompt and prompt.count("Judgement:") == 8
    assert prompt.endswith(DEEPEYES_EXAMPLE_7 + "\n\n" + "\n[Question]: Where is the barrier?\n"
                           "[Standard Answer]: The barrier is on the left.\n[Model_answer] : left\nJudgement:")
    assert JUDGE_SYSTEM == "You are a helpful assistant."


@pytest.mark.parametrize("reply, verdict", [("Judgement: 1", 1.0), ("1", 1.0), (" 0 ", 0.0), ("Judgement: 0", 0.0),
                                            ("Judgement: 10", 1.0),  # a "1" after the tag counts, as in DeepEyes
                                            ("The answers agree: 1", 0.0),  # no tag: the reply must be "1"
                                            ("Judgement: yes", 0.0), ("", 0.0)])
def test_replies_are_read_as_deepeyes_reads_them(reply, verdict):
    assert parse_judgement(reply) == verdict


def trajectory(answer: str, zoomed: bool, closed: bool = True) -> tuple[str, dict]:
    text = f"<think>look</think><answer>{answer}</answer>" if closed else f"<think>look</think><answer>{answer}"
    ex = {"question": "What colour is the car?", "answer": "red", "trajectory": text,
          "tool_calls": [{"ok": True, "image_size": (112, 112)}] if zoomed else []}
    return text, ex


class ScriptedJudge:
    """Says "Judgement: 1" when the model's answer names the truth's first word, else 0."""

    calls: list = []

    def __init__(self, path, device, dtype):
        pass

    def __call__(self, prompts, system, temperature, max_new_tokens, batch_size):
        ScriptedJudge.calls.append(list(prompts))
        return ["Judgement: 1" if "[Model_answer] : it is red" in p else "Judgement: 0" for p in prompts]


def test_the_formula_with_a_scripted_judge(monkeypatch, tmp_path):
    from mmrl.rewards import model_scorers as scorers

    monkeypatch.setattr(scorers, "ChatJudge", ScriptedJudge)
    scorers.clear_cache()
    ScriptedJudge.calls = []
    rows = [trajectory("it is red", zoomed=True),   # right (by the judge: the rule would say no), looked: 0.8 + 1.2
            trajectory("it is red", zoomed=False),  # right, no tool image: 0.8
            trajectory("blue", zoomed=True),        # wrong: no tool bonus
            trajectory("it is red", zoomed=True, closed=False)]  # unclosed answer: format -1 -> 0.8 - 0.2 + 1.2
    rows.append(rows[0])  # a second turn-row of the first trajectory: the same case, asked once
    scores = REWARDS.get("deepeyes")([c for c, _ in rows], [e for _, e in rows], judge=str(tmp_path))
    assert scores == [pytest.approx(2.0), pytest.approx(0.8), pytest.approx(0.0), pytest.approx(1.8), pytest.approx(2.0)]
    [asked] = ScriptedJudge.calls
    assert len(asked) == 2  # "it is red" and "blue": each case once
    rule = REWARDS.get("deepeyes_rule_judge")([c for c, _ in rows[:1]], [e for _, e in rows[:1]])
    assert rule == [pytest.approx(0.0)]  # the rule does not accept "it is red" for "red"
    scorers.clear_cache()


def test_a_missing_judge_names_the_key():
    with pytest.raises(FileNotFoundError, match="task.reward_kwargs.deepeyes.judge"):
        REWARDS.get("deepeyes")(*zip(*[trajectory("red", True)]), judge=None)


def test_a_local_chat_model_judges_through_transformers(random_tiny_dir, tmp_path):
    """A tiny random Qwen2 chat model with the tiny tokenizer: the reward runs end to end and each
    score is one of the formula's values for that row (random replies: the verdict is 0 or 1)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmrl.rewards import model_scorers as scorers

    judge = tmp_path / "judge"
    judge.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (random_tiny_dir / name).exists():
            shutil.copy(random_tiny_dir / name, judge / name)
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(judge)
    scorers.clear_cache()
    rows = [trajectory("red", zoomed=True), trajectory("blue", zoomed=False)]
    torch.manual_seed(1)
    scores = REWARDS.get("deepeyes")([c for c, _ in rows], [e for _, e in rows], judge=str(judge), device="cpu")
    assert scores[0] in (pytest.approx(0.0), pytest.approx(2.0)) and scores[1] in (pytest.approx(0.0), pytest.approx(0.8))
    scorers.clear_cache()
