"""Judges on an OpenAI-compatible server (a vLLM server, ``mmrl rollout-server``, a hosted endpoint):
what ``deepeyes``, ``vlm_judge`` and ``rubric_judge`` send to ``POST {judge_url}/v1/chat/completions``
and how they read the answer, through the rewards' one HTTP client (``_service.py``: time-outs,
retries with back-off, one pool per server, futures awaited after the trainer's log-prob passes).

Options each of them takes (``task.reward_kwargs.<reward>.*``):

- ``judge_url``: the server's base URL (``http://127.0.0.1:8000``; ``/v1`` is appended);
- ``judge_model``: the ``model`` field (a hosted endpoint needs it; a vLLM server serving one model
  takes its default when it is left out);
- ``judge_token_env``: the NAME of the environment variable holding the bearer token;
- ``judge_timeout`` (seconds per try), ``judge_retries``, ``judge_concurrency`` (requests in flight;
  a vLLM server batches concurrent requests). Back-off: 0.5 s doubling.

A sample whose request failed scores the reward's minimum and is counted
(``reward/<name>/failed_frac``, ``late_frac`` for a time-out), as the ``http`` reward's.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future
from dataclasses import dataclass

from mmrl.media.wire import IMAGE_TAG, encode_image

from ._service import Refused, check_token_env, pool, post_json, probe, submit, then, token_from

BACKOFF = 0.5  # seconds before the first retry, doubling
log = logging.getLogger("mmrl")


def check_judge_url(reward: str, judge_url=None, judge_token_env=None, judge_timeout=60.0, judge_retries=2,
                    judge_concurrency=8) -> None:
    """Configuration errors of the server options, each naming its key."""
    key = f"task.reward_kwargs.{reward}"
    if not str(judge_url).startswith(("http://", "https://")):
        raise ValueError(f"{key}.judge_url={judge_url!r}: give the judge server's base URL, e.g. "
                         "http://127.0.0.1:8000 (a vLLM server, `mmrl rollout-server`, or a hosted endpoint)")
    if float(judge_timeout) <= 0 or int(judge_retries) < 0 or int(judge_concurrency) < 1:
        raise ValueError(f"{key}: judge_timeout must be > 0, judge_retries >= 0 and judge_concurrency >= 1 (got "
                         f"{judge_timeout}, {judge_retries}, {judge_concurrency})")
    check_token_env(judge_token_env, f"{key}.judge_token_env")


def check_served(reward: str, local_key: str, local, judge_url, judge_model=None, judge_token_env=None,
                 judge_timeout=60.0, judge_retries=2, judge_concurrency=8, judge_top_logprobs=20, **_) -> bool:
    """Whether the judge is served (``judge_url``, checked; a local checkpoint too is an error)."""
    if judge_url is None:
        return False
    if int(judge_top_logprobs) < 1:
        raise ValueError(f"task.reward_kwargs.{reward}.judge_top_logprobs={judge_top_logprobs!r}: give at least 1 "
                         "(20, the most an OpenAI-style API returns; a vLLM server up to its --max-logprobs)")
    if local is not None:
        raise ValueError(f"task.reward_kwargs.{reward}: set {local_key} (a local checkpoint) or judge_url (a "
                         "server), not both")
    check_judge_url(reward, judge_url, judge_token_env, judge_timeout, judge_retries, judge_concurrency)
    _probe(reward, JudgeServer.of(judge_url, judge_model, judge_token_env, judge_timeout))
    return True


def _probe(reward: str, server: "JudgeServer") -> None:
    """Warnings, not errors, at setup: a judge that does not answer ``GET /v1/models`` (it may start
    later; until then its samples score the minimum), refuses the token, or does not list ``judge_model``."""
    key = f"task.reward_kwargs.{reward}"
    status, body = probe(server.url + "/v1/models", token_from(server.token_env), min(server.timeout, 10.0))
    if status is None:
        log.warning("warning: the judge server %s does not answer GET /v1/models (%s); until it does, %s's samples "
                    "score the minimum", server.url, body, reward)
    elif status == 401:
        log.warning("warning: the judge server %s refuses the token (%s.judge_token_env=%s); %s's samples will "
                    "score the minimum", server.url, key, server.token_env, reward)
    elif status == 200 and server.model:
        try:
            served = [m.get("id") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            return
        if server.model not in served:
            log.warning("warning: the judge server %s does not list %s.judge_model=%s (it serves %s)", server.url,
                        key, server.model, ", ".join(map(str, served)) or "nothing")


@dataclass(frozen=True)
class JudgeServer:
    """One OpenAI-compatible server, as the options above name it."""

    url: str
    model: str | None = None
    token_env: str | None = None
    timeout: float = 60.0
    retries: int = 2
    concurrency: int = 8

    @classmethod
    def of(cls, judge_url, judge_model=None, judge_token_env=None, judge_timeout=60.0, judge_retries=2,
           judge_concurrency=8) -> "JudgeServer":
        return cls(str(judge_url).rstrip("/").removesuffix("/v1"), judge_model, judge_token_env,
                   float(judge_timeout), int(judge_retries), int(judge_concurrency))

    def chat(self, messages: list[dict], **settings) -> Future:
        """A future of the first choice of one chat completion of ``messages`` with ``settings``."""
        body = {**({"model": self.model} if self.model else {}), "messages": messages, "n": 1, **settings}
        url = self.url + "/v1/chat/completions"
        token = token_from(self.token_env)
        future: Future = Future()
        submit(pool(self.url, self.concurrency),
               lambda: [_first_choice(url, post_json(url, body, token, self.timeout, self.retries, BACKOFF,
                                                     what="judge server"))], [future])
        return future


def _first_choice(url: str, answer) -> dict:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise Refused(f"{url} answered without choices: {str(answer)[:200]}")
    return choices[0]


def image_part(image) -> dict:
    """An image as a chat message part: a PNG data URL (lossless, so the judge sees the pixels scored)."""
    png = encode_image(image.convert("RGB"))[IMAGE_TAG]
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}


def replies(server: JudgeServer, prompts: list[str], system: str | None, temperature: float,
            max_tokens: int, images: list | None = None) -> list[Future]:
    """A future of the judge's reply text to each prompt (the user turn, after ``system`` when given;
    with ``images``, each prompt's image before its text)."""
    out = []
    for k, prompt in enumerate(prompts):
        content = prompt if images is None else [image_part(images[k]), {"type": "text", "text": prompt}]
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
        out.append(then(server.chat(messages, temperature=float(temperature), top_p=1.0, max_tokens=int(max_tokens)),
                        _content))
    return out


def _content(choice: dict) -> str:
    return str((choice.get("message") or {}).get("content") or "")


def yes_probabilities(server: JudgeServer, images: list, questions: list[str], top_logprobs: int) -> list[Future]:
    """A future of P(yes) / (P(yes) + P(no)) for each (image, question): the question asked with the
    image (a PNG data URL, lossless), one answer token, its ``top_logprobs`` read by
    :func:`mmrl.vlm.judge.yes_share` (None when neither answer is among them)."""
    from mmrl.vlm.judge import yes_share

    out = []
    for image, question in zip(images, questions):
        content = [image_part(image), {"type": "text", "text": question}]
        choice = server.chat([{"role": "user", "content": content}], max_tokens=1, temperature=0.0,
                             logprobs=True, top_logprobs=int(top_logprobs))
        out.append(then(choice, lambda c: yes_share(_first_token_top(c))))
    return out


def _first_token_top(choice: dict) -> list[tuple[str, float]]:
    tokens = ((choice.get("logprobs") or {}).get("content") or [])
    if not tokens:
        raise Refused("the judge server answered without log-probs (it must support logprobs/top_logprobs)")
    return [(str(t.get("token")), float(t.get("logprob"))) for t in tokens[0].get("top_logprobs") or []]
