"""``rubric_judge``: a free-form answer graded by a chat model on an OpenAI-compatible server (the
LLM-as-a-judge of "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena", Zheng et al., 2023:
a rubric in the prompt, a score read out of the reply).

The prompt is ``template`` with ``{question}`` (``ex["question"]``, else ``ex["prompt"]``),
``{answer}`` (the completion's last ``<answer>`` block, else the whole completion), ``{completion}``
(the whole completion), ``{reference}`` (``ex["answer"]``) and any other example field by its
name; ``system`` is the system message. The score is the one group of ``pattern`` matched in the
reply (the last match), mapped to [0, 1] by ``(value - score_min) / (score_max - score_min)``,
clipped. A reply without a match scores None (the minimum, counted as unparsable); a request that
failed scores 0 and is counted in ``reward/rubric_judge/failed_frac`` / ``late_frac``. The server
options (``judge_url``, ...) are those of rewards/_judge_client.py.

``image_field`` (e.g. ``image``) sends the example's image with the prompt (a PNG data URL, before the
text), for a vision-language judge grading an answer about that image; an example without a PIL image
there is not sent and scores the minimum, counted as unparsable.
"""

from __future__ import annotations

import re
import string

from mmrl import register_reward
from mmrl.measures.batch import check_batch
from mmrl.parsing import extract_answer

from ._judge_client import JudgeServer, check_served, replies
from ._service import then

DEFAULT_SYSTEM = "You are a strict, fair grader of answers."
DEFAULT_TEMPLATE = ("Grade the answer to the question against the reference answer, from 0 (wrong) to 10 "
                    "(fully correct and complete).\n\n[Question]\n{question}\n\n[Reference]\n{reference}\n\n"
                    "[Answer]\n{answer}\n\nReply with one line: Score: <0-10>")
DEFAULT_PATTERN = r"[Ss]core\s*[:=]\s*(-?\d+(?:\.\d+)?)"
KEY = "task.reward_kwargs.rubric_judge"


def _check(judge_url=None, template=DEFAULT_TEMPLATE, pattern=DEFAULT_PATTERN, score_min=0.0, score_max=10.0,
           max_tokens=64, image_field=None, **options):
    if judge_url is None:
        raise ValueError(f"{KEY}.judge_url is not set: give the judge server's base URL, e.g. http://127.0.0.1:8000 "
                         "(a vLLM server, `mmrl rollout-server`, or a hosted endpoint)")
    check_served("rubric_judge", "", None, judge_url, **options)
    try:
        groups = re.compile(str(pattern)).groups
    except re.error as exc:
        raise ValueError(f"{KEY}.pattern={pattern!r} is not a regular expression: {exc}") from None
    if groups != 1:
        raise ValueError(f"{KEY}.pattern={pattern!r} has {groups} groups; give one, around the score (e.g. "
                         f"{DEFAULT_PATTERN!r})")
    if not float(score_max) > float(score_min):
        raise ValueError(f"{KEY}: score_max ({score_max}) must be above score_min ({score_min})")
    if image_field is not None and (not isinstance(image_field, str) or not image_field):
        raise ValueError(f"{KEY}.image_field={image_field!r}: give the example field that holds the image, e.g. image")
    if int(max_tokens) < 1:
        raise ValueError(f"{KEY}.max_tokens={max_tokens!r}: give at least 1")
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(str(template)) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{KEY}.template: {exc} (write a literal brace as {{{{ or }}}})") from None
    if any(not name.isidentifier() for name in fields):
        raise ValueError(f"{KEY}.template names fields {fields}; each must be a plain name such as {{question}}")


def _fields(completion, ex: dict) -> dict:
    text = completion if isinstance(completion, str) else ""
    answer = extract_answer(text)
    return {**{k: v for k, v in ex.items() if isinstance(v, (str, int, float))},
            "question": ex.get("question", ex.get("prompt", "")), "reference": ex.get("answer", ""),
            "answer": answer if answer is not None else text.strip(), "completion": text}


def score_of(reply: str, pattern: str, score_min: float, score_max: float) -> float | None:
    """The last match of ``pattern``'s group in ``reply`` mapped to [0, 1]; None without one."""
    matches = re.findall(pattern, str(reply))
    try:
        value = float(matches[-1])
    except (IndexError, ValueError):
        return None
    return min(1.0, max(0.0, (value - score_min) / (score_max - score_min)))


@register_reward("rubric_judge", check=_check)
def rubric_judge(completions, examples, judge_url: str | None = None, template: str = DEFAULT_TEMPLATE,
                 system: str = DEFAULT_SYSTEM, pattern: str = DEFAULT_PATTERN, score_min: float = 0.0,
                 score_max: float = 10.0, temperature: float = 0.0, max_tokens: int = 64,
                 judge_model: str | None = None, judge_token_env: str | None = None, judge_timeout: float = 60.0,
                 judge_retries: int = 2, judge_concurrency: int = 8, image_field: str | None = None) -> list:
    """One future per text completion of the judge's score in [0, 1] (None: no score in the reply);
    None for a completion that is not text."""
    from PIL import Image

    check_batch("rubric_judge", completions, examples)
    server = JudgeServer.of(judge_url, judge_model, judge_token_env, judge_timeout, judge_retries, judge_concurrency)
    out: list = [None] * len(completions)
    # text completions of examples that are records (and, with image_field, hold their image: an example
    # without it is not sent, so it scores as unparsable and is counted)
    rows = [i for i, c in enumerate(completions) if isinstance(c, str) and isinstance(examples[i], dict)
            and (image_field is None or isinstance(examples[i].get(image_field), Image.Image))]
    prompts = []
    for i in rows:
        try:
            prompts.append(str(template).format_map(_fields(completions[i], examples[i])))
        except KeyError as exc:
            raise ValueError(f"{KEY}.template names {{{exc.args[0]}}}, which example {i} does not have") from None
    images = None if image_field is None else [examples[i][image_field] for i in rows]
    lo, hi = float(score_min), float(score_max)
    for i, reply in zip(rows, replies(server, prompts, system or None, temperature, max_tokens, images)):
        out[i] = then(reply, lambda text: score_of(text, str(pattern), lo, hi))
    return out
