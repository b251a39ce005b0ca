"""The agent loop (mmrl.core.agent_loop) on hand-checkable interactions, and the calculator example
(docs/examples/calculator.py): a multi-turn task written against the public API in under 80 lines."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from mmrl import Interaction, LoopOptions, Reply, Rollouts
from mmrl.core.agent_loop import run_agent_loop

ROOT = Path(__file__).resolve().parents[1]
CALCULATOR = ROOT / "docs" / "examples" / "calculator.py"


class RecordingPolicy:
    """Writes ``write(prompt)`` for each prompt; records each call's prompts and keyword arguments."""

    capabilities = frozenset({"multi_turn"})

    def __init__(self, write):
        self.write, self.calls = write, []

    def prepare_examples(self, examples):
        return [{**ex, "prepared": True} for ex in examples]

    def rollout(self, examples, prompts, n, mode, need_old_logps=False, need_ref_logps=False, **kwargs):
        self.calls.append({"prompts": list(prompts), "mode": mode, **kwargs})
        return Rollouts(group_ids=torch.arange(len(prompts)), action_mask=torch.ones(len(prompts), 2),
                        completions=[self.write(p) for p in prompts], examples=list(examples))


class Countdown(Interaction):
    """Its prompt is the count left; each message counts down by one and the trajectory is done at
    0, so it lasts ``start`` messages. Each answer sleeps ``delay`` seconds."""

    def __init__(self, start: int, delay: float = 0.0):
        self.left, self.delay, self.answered = start, delay, []

    def ask(self):
        return {"start": self.left}, self.left

    def answer(self, batch, row):
        time.sleep(self.delay)
        self.left -= 1
        self.answered.append(batch.completions[row])
        return Reply(done=self.left == 0, row={"left": self.left})

    def timed_out(self, seconds):
        return Reply(done=True, row={"timed_out_after": seconds})

    def outcome(self, turns, over_turn):
        return {"answered": list(self.answered), "over": over_turn}


def test_rows_groups_keys_outcomes_and_over_turn_masking():
    """Counts 1, 2 (group 0) and 3, 5 (group 1), at most 4 turns: turn 0 runs all four, turn 1 the
    last three, turn 2 the last two, turn 3 only the 5, which the turn limit then cuts."""
    policy = RecordingPolicy(lambda prompt: f"at {prompt}")
    options = LoopOptions(max_turns=4, mask_over_turn=True)
    rows = run_agent_loop(policy, [Countdown(s) for s in (1, 2, 3, 5)], 2, options, "train")
    assert [ex["episode_id"] for ex in rows.examples] == [0, 1, 2, 3, 1, 2, 3, 2, 3, 3]
    assert [ex["step_index"] for ex in rows.examples] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3]
    assert rows.group_ids.tolist() == [0, 0, 1, 1, 0, 1, 1, 1, 1, 1]
    assert [ex["left"] for ex in rows.examples] == [0, 1, 2, 4, 0, 1, 3, 0, 2, 1]
    assert [ex["anchor_key"] for ex in rows.examples][:5] == ["0:0", "1:0", "2:0", "3:0", "1:1"]
    assert [c["prompts"] for c in policy.calls] == [[1, 2, 3, 5], [1, 2, 4], [1, 3], [2]]
    assert all("stop" not in c for c in policy.calls)  # a policy without a stop parameter works
    # every row of a finished trajectory carries its outcome; the cut one is over-turn and masked
    assert [ex["answered"] for ex in rows.examples if ex["episode_id"] == 1] == [["at 2", "at 1"]] * 2
    assert [ex["over"] for ex in rows.examples] == [False] * 3 + [True] + [False] * 2 + [True, False, True, True]
    assert rows.action_mask.sum(1).tolist() == [2, 2, 2, 0, 2, 2, 0, 2, 0, 0]


def test_stop_texts_reach_the_policy_and_a_cut_reply_is_over_turn():
    class Budgeted(Countdown):
        def answer(self, batch, row):
            reply = super().answer(batch, row)
            return Reply(done=reply.done, cut=self.left == 1, row=reply.row)  # a budget ends it at 1 left

    policy = RecordingPolicy(lambda prompt: "x")
    rows = run_agent_loop(policy, [Budgeted(3), Budgeted(1)], 1, LoopOptions(max_turns=5, stop=("</x>",)), "eval")
    assert [c["stop"] for c in policy.calls] == [("</x>",)] * 2 and policy.calls[0]["mode"] == "eval"
    assert [(ex["episode_id"], ex["over"]) for ex in rows.examples] == [(0, True), (1, False), (0, True)]
    assert rows.action_mask.sum() == 6  # no masking unless asked


def test_a_slow_answer_holds_no_other_and_the_rows_keep_their_order():
    """Four answers of 0.3 s each run in one turn concurrently (in turn, 1.2 s); the first is the
    slowest (it finishes last) and its row still comes first."""
    policy = RecordingPolicy(lambda prompt: "x")
    interactions = [Countdown(1, delay=0.3)] + [Countdown(1, delay=0.25 - 0.05 * k) for k in range(3)]
    t0 = time.perf_counter()
    rows = run_agent_loop(policy, interactions, 1, LoopOptions(max_turns=1, workers=4), "train")
    assert time.perf_counter() - t0 < 0.9
    assert [ex["episode_id"] for ex in rows.examples] == [0, 1, 2, 3]


def test_with_no_workers_the_loops_own_thread_answers():
    """For an environment bound to the thread that made it (workers=0)."""
    import threading

    class Where(Countdown):
        def answer(self, batch, row):
            self.thread = threading.current_thread()
            return super().answer(batch, row)

    interactions = [Where(2), Where(1)]
    options = LoopOptions(max_turns=2, workers=0)
    rows = run_agent_loop(RecordingPolicy(lambda prompt: "x"), interactions, 1, options, "train")
    assert all(it.thread is threading.current_thread() for it in interactions)
    assert [ex["left"] for ex in rows.examples] == [1, 0, 0]


def test_an_answer_past_the_time_limit_is_replied_for_and_the_others_go_on():
    policy = RecordingPolicy(lambda prompt: "x")
    t0 = time.perf_counter()
    rows = run_agent_loop(policy, [Countdown(2, delay=0.0), Countdown(2, delay=2.0)], 1,
                          LoopOptions(max_turns=3, step_timeout=0.2), "train")
    assert time.perf_counter() - t0 < 1.5  # the 2 s answer was not waited for
    hung = [ex for ex in rows.examples if ex["episode_id"] == 1]
    assert len(hung) == 1 and hung[0]["timed_out_after"] == 0.2 and "left" not in hung[0]
    assert [ex["left"] for ex in rows.examples if ex["episode_id"] == 0] == [1, 0]


def test_options_and_a_missing_timeout_reply_are_errors_that_say_what_to_do():
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="max_turns must be an int >= 1"):
            LoopOptions(max_turns=bad)
    with pytest.raises(ValueError, match="step_timeout must be >= 0"):
        LoopOptions(max_turns=1, step_timeout=-1)
    with pytest.raises(ValueError, match="workers must be >= 1 with a step_timeout"):
        LoopOptions(max_turns=1, step_timeout=1, workers=0)
    with pytest.raises(NotImplementedError, match="Interaction has no reply .* step_timeout at 0"):
        Interaction().timed_out(1.0)


# -- the calculator example -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def calculator():
    """The example plugin loaded as a user loads theirs (``plugins=[...]``): its module."""
    import sys

    from mmrl.registry import load_plugins

    load_plugins([str(CALCULATOR)])
    return sys.modules["mmrl_plugin_calculator"]


@pytest.mark.parametrize("text, value", [
    ("37 * 58 + 9", "2155"), ("2 ** 10 / 4", "256"), ("(1 + 2) * -3", "-9"), ("7 / 2", "3.5"),
    (" 1.5e3 - +1 ", "1499"), ("__import__('os').system('ls')", "error: not arithmetic: Call"),
    ("x + 1", "error: not arithmetic: Name"), ("(3).real", "error: not arithmetic: Attribute"),
    ("'ab' * 3", "error: not arithmetic: Constant"), ("True + 1", "error: not arithmetic: Constant"),
    ("[1] * 3", "error: not arithmetic: List"), ("1 / 0", "error: division by zero"),
    ("9 ** 9 ** 9", "error: too large"), ("2 ** 101", "error: too large"),
])
def test_the_calculator_reads_arithmetic_only(calculator, text, value):
    assert calculator.calculate(text) == value


def test_the_calculator_refuses_text_it_cannot_parse(calculator):
    assert calculator.calculate("2 +").startswith("error: ")
    assert calculator.calculate("import os").startswith("error: ")


def _question_expression(prompt) -> str:
    """'What is 37 * 58 + 9? ...' -> '37 * 58 + 9'."""
    return prompt[0]["content"].split("What is ", 1)[1].split("?", 1)[0]


def test_the_calculator_runs_through_the_agent_loop(calculator):
    """Trajectory 0 asks the calculator, then answers with its result; trajectory 1 answers a wrong
    number at once. Rows: turn 0 of both, then turn 1 of trajectory 0; every row scores its
    trajectory's last message."""
    from mmrl.registry import REWARDS, TASKS

    task = TASKS.get("calculator")()
    ex = task.examples("train")[0]
    expression = _question_expression(task.build_prompt(ex))
    value = str(eval(expression))  # the test's own reference; the plugin never evals

    def write(prompt):
        if len(prompt) == 1:  # the first turn: trajectory 0 calls, trajectory 1 guesses
            write.first = getattr(write, "first", 0) + 1
            return f"<calc>{expression}</calc>" if write.first == 1 else "<answer>7</answer>"
        result = prompt[-1]["content"].removeprefix("<result>").removesuffix("</result>")
        return f"<answer>{result}</answer>"

    policy = RecordingPolicy(write)
    rows = task.run_episodes(policy, [ex], 2, "train")
    assert [c["stop"] for c in policy.calls] == [("</calc>",)] * 2
    assert [ex["episode_id"] for ex in rows.examples] == [0, 1, 0] and rows.group_ids.tolist() == [0, 0, 0]
    assert rows.completions == [f"<calc>{expression}</calc>", "<answer>7</answer>", f"<answer>{value}</answer>"]
    assert rows.examples[0]["calc_result"] == value and "calc_result" not in rows.examples[1]
    second = policy.calls[1]["prompts"][0]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == rows.completions[0] and second[2]["content"] == f"<result>{value}</result>"
    assert [(e["final"], e["calls"], e["over_turn"]) for e in rows.examples] == [
        (rows.completions[2], 1, False), ("<answer>7</answer>", 0, False), (rows.completions[2], 1, False)]
    assert all(e["prepared"] for e in rows.examples)  # prepared by the policy once per trajectory
    assert REWARDS.get("calculator_answer")(rows.completions, rows.examples) == [1.0, 0.0, 1.0]


def test_a_calculator_trajectory_that_never_answers_is_cut_at_three_messages(calculator):
    from mmrl.registry import REWARDS, TASKS

    task = TASKS.get("calculator")()
    rows = task.run_episodes(RecordingPolicy(lambda prompt: "<calc>2 +</calc>"), [task.examples("eval")[0]], 1, "eval")
    assert len(rows) == 3 and all(e["over_turn"] and e["calls"] == 3 for e in rows.examples)
    assert all(e["calc_result"].startswith("error: ") for e in rows.examples)
    assert REWARDS.get("calculator_answer")(rows.completions, rows.examples) == [None] * 3  # no answer: unparsable


def test_the_calculator_is_a_short_plugin_of_the_public_api_shown_in_the_docs():
    from test_plugin_boundary import imported_modules, violation

    source = CALCULATOR.read_text()
    assert len(source.splitlines()) < 80
    imports = imported_modules(source, "mmrl.tasks")
    assert [m for _, m in imports if violation(m, "mmrl.tasks")] == []
    assert {"mmrl", "mmrl.measures.answers"} <= {m for _, m in imports}
    assert "eval(" not in source and "exec(" not in source
    assert f"```python\n{source}```" in (ROOT / "docs" / "plugins.md").read_text()  # shown whole, as it is


@pytest.mark.slow
def test_the_calculator_on_the_tiny_vlm_keeps_the_result_out_of_the_loss(calculator, random_tiny_dir):
    """The real policy (its samples teacher-forced: the random tiny model writes no call): the second
    turn's prompt is the first turn's prompt and message, then the result turn; each row's action
    mask counts exactly its own message's tokens, so the result is context."""
    from conftest import make_config
    from mmrl.registry import TASKS
    from mmrl.vlm.policy import VLMPolicy

    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu",
                                   "rollout.max_completion_length=64"))
    task = TASKS.get("calculator")()
    ex = task.examples("eval")[0]
    script = [f"<calc>{_question_expression(task.build_prompt(ex))}</calc>", "<answer>1</answer>"]

    def rollout(examples, prompts, n, mode, need_old_logps=False, need_ref_logps=False, stop=()):
        turn = len(prompts_seen)
        prompts_seen.append(prompts)
        return policy.rollout_given(examples, prompts, [script[turn]] * len(prompts), need_old_logps,
                                    need_ref_logps, stop=stop)

    prompts_seen: list = []
    policy.rollout = rollout
    rows = task.run_episodes(policy, [ex], 1, "train", need_old_logps=True)
    assert len(rows) == 2 and rows.examples[1]["calls"] == 1 and rows.old_logps is not None
    (p0, p1), (c0, c1) = rows.payload["prompt_ids"], rows.payload["completion_ids"]
    assert torch.equal(p1[:len(p0) + len(c0)], torch.cat([p0, c0]))  # turn 0 is a prefix of turn 1's prompt
    assert len(p1) > len(p0) + len(c0)  # the result turn lies between, in no row's actions
    assert rows.action_mask.sum(1).tolist() == [len(c0), len(c1)]
