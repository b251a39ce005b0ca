"""DeepEyes' LLM judge of an answer's accuracy, as its ``compute_score`` asks it
(``verl/utils/reward_score/vl_agent.py`` in Visual-Agent/DeepEyes; paper: "DeepEyes: Incentivizing
'Thinking with Images' via Reinforcement Learning", Zheng et al., 2025).

The judge (Qwen2.5-72B-Instruct in the paper, any local chat model here) gets a system message
"You are a helpful assistant." and :func:`judge_prompt`: DeepEyes' instruction, its seven worked
examples and the case, ending in "Judgement:". :func:`parse_judgement` reads the reply as its code
does. The text below is DeepEyes' own, typos included ("Judement"), since the judge sees it.
"""

from __future__ import annotations

JUDGE_SYSTEM = "You are a helpful assistant."

INSTRUCTION = """
Below are two answers to a question. Question is [Question], [Standard Answer] is the standard answer to the question, and [Model_answer] is the answer extracted from a model's output to this question.  Determine whether these two answers are consistent.
Note that [Model Answer] is consistent with [Standard Answer] whenever they are essentially the same. If the meaning is expressed in the same way, it is considered consistent, for example, 'pink' and 'it is pink'.
If they are consistent, Judement is 1; if they are different, Judement is 0. Just output Judement and don't output anything else.\\n\\n
"""

# (question, standard answer, model answer, judgement): DeepEyes' in-context examples
EXAMPLES = (
    ("Is the countertop tan or blue?", "The countertop is tan.", "tan", 1),
    ("On which side of the picture is the barrier?", "The barrier is on the left side of the picture.", "left", 1),
    ("Is the kite brown and large?", "Yes, the kite is brown and large.", "Yes", 1),
    ("Are the spots on a giraffe?", "No, the spots are on a banana.", "no", 1),
    ("Who is wearing pants?", "The boy is wearing pants.", "The person in the picture is wearing pants.", 1),
    ("Is the man phone both blue and closed?", "Yes, the man phone is both blue and closed.", "No.", 0),
    ("What color is the towel in the center of the picture?", "The towel in the center of the picture is blue.",
     "The towel in the center of the picture is pink.", 0),
)


def _case(question: str, truth: str, answer: str) -> str:
    return f"\n[Question]: {question}\n[Standard Answer]: {truth}\n[Model_answer] : {answer}\nJudgement:"


def judge_prompt(answer: str, truth: str, question: str) -> str:
    """DeepEyes' ``get_prompt(predict_str, ground_truth, question)``: the instruction, each example
    followed by a blank line, then the case."""
    demos = "".join(f"{_case(q, t, a)} {j}\n\n\n" for q, t, a, j in EXAMPLES)
    return f"{INSTRUCTION}{demos}{_case(question, truth, answer)}"


def parse_judgement(reply: str) -> float:
    """1.0 or 0.0 from the judge's reply, as DeepEyes reads it: after the last "Judgement:" a "1"
    anywhere is 1, else a "0" is 0; without "Judgement:" the stripped reply must be exactly "1" or
    "0"; anything else is 0 (DeepEyes prints a warning)."""
    reply = str(reply).strip()
    if "Judgement:" in reply:
        rest = reply.split("Judgement:")[-1].strip()
        return 1.0 if "1" in rest else 0.0
    return 1.0 if reply == "1" else 0.0
