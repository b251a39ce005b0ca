"""``calculator``: a multi-turn task plugin. The model writes ``<calc>37 * 58 + 9</calc>`` and reads
``<result>2155</result>`` as the next user turn; a message with no call is its answer. An ast walk
reads the arithmetic (numbers, + - * / **, parentheses), never ``eval``."""

import ast
import operator
import random

from mmrl import EpisodicTask, Interaction, LoopOptions, Reply, SyntheticExamples, Task, register_reward, register_task
from mmrl.measures.answers import accuracy_score

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(text: str) -> str:
    """The value of arithmetic ``text``, or what is wrong with it ("error: ..."): a name, a call, 1/0."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if not isinstance(node, (ast.BinOp, ast.UnaryOp)) or type(node.op) not in OPERATORS:
            raise ValueError(f"not arithmetic: {type(node).__name__}")
        args = [value(node.left), value(node.right)] if isinstance(node, ast.BinOp) else [value(node.operand)]
        if any(abs(a) > 1e100 for a in args) or (isinstance(node.op, ast.Pow) and abs(args[1]) > 100):
            raise ValueError("too large")  # bounds the work: 9**9**9 would run for minutes
        return OPERATORS[type(node.op)](*args)
    try:
        return format(value(ast.parse(text.strip(), mode="eval").body), ".10g")
    except (ValueError, TypeError, SyntaxError, ZeroDivisionError, OverflowError, RecursionError) as exc:
        return f"error: {exc}"


class Calculator(Interaction):
    """One trajectory: the prompt, then per turn the model's message and its call's result."""

    def __init__(self, ex: dict, messages: list):
        self.example, self.messages, self.calls, self.last = ex, messages, 0, ""

    def ask(self):
        return self.example, self.messages

    def answer(self, batch, row):
        self.last = text = batch.completions[row]
        if "<calc>" not in text:
            return Reply(done=True)  # no call: the answer
        self.calls, result = self.calls + 1, calculate(text.rpartition("<calc>")[2].partition("</calc>")[0])
        self.messages = [*self.messages, {"role": "assistant", "content": text},
                         {"role": "user", "content": f"<result>{result}</result>"}]
        return Reply(row={"calc_result": result})

    def outcome(self, turns, over_turn):
        return {"final": self.last, "calls": self.calls, "over_turn": over_turn}


@register_reward("calculator_answer")
def calculator_answer(completions, examples):
    """The trajectory's last message against the answer (every row of the trajectory scores it)."""
    return [accuracy_score(ex.get("final"), ex.get("answer")) for ex in examples]  # None: no answer


@register_task("calculator")
class CalculatorTask(Task, EpisodicTask):
    rewards = {"calculator_answer": 1.0}

    def examples(self, split):
        return SyntheticExamples(self.make, 1000, {"train": 0, "eval": 1}[split])

    def make(self, seed):
        a, b, c = random.Random(seed).sample(range(10, 100), 3)
        return {"question": f"What is {a} * {b} + {c}?", "answer": str(a * b + c)}

    def prompt(self, ex):
        return [{"role": "user", "content": f"{ex['question']} Use <calc>...</calc>, answer <answer>...</answer>."}]

    def interaction(self, ex):
        return Calculator(ex, self.build_prompt(ex))

    def loop_options(self):  # 3 messages at most; generation stops where a call closes
        return LoopOptions(max_turns=3, stop=("</calc>",))
