"""``http``: a reward computed by a reward service (``mmrl serve-reward NAME``, or any server that
speaks the schema of docs/plugins.md, "A reward as a service"), so a reward model runs on its own
GPU or machine instead of next to the policy.

The batch is cut into requests of ``batch_size`` samples, at most ``concurrency`` in flight, each
``POST {url}/score`` with the completions (text; images as PNG base64; clips as lists of them), the
examples' fields that have a JSON form (``fields``: only those) and the group ids. The call returns
at once with one ``concurrent.futures.Future`` per sample: the trainer awaits them after its
log-prob passes (:mod:`mmrl.core.batch.scoring`). A request that fails to connect, times out
(``timeout`` seconds) or gets an HTTP 5xx is retried ``retries`` times after ``backoff * 2**i``
seconds; a refusal (4xx: a wrong token, a body over the server's cap, a reward that raised) is not.
A sample whose request failed scores ``minimum`` and is counted (``reward/http/failed_frac``, or
``late_frac`` for a time-out) in ``metrics.jsonl``: a dead service never crashes or hangs a run;
it costs at most ``(retries + 1) * timeout`` plus the back-off per request.

The bearer token is read from the environment variable ``token_env`` (never from the config, which
the run directory keeps).

The client (retries, back-off, pools, tokens) is the one the judges use too (``rewards/_service.py``);
the rollout server engine's (:mod:`mmrl.vlm.engines.server_client`) is another: it spreads one
request over several rollout servers and names ``rollout.*`` keys in its errors and counters.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from mmrl import register_reward
from mmrl.media.wire import encode, encode_example

from ._service import Refused, check_token_env, pool, post_json, probe, submit, token_from

log = logging.getLogger("mmrl")


def _check(url=None, batch_size=16, concurrency=4, timeout=60.0, retries=2, backoff=0.5, token_env=None, **_):
    if not url or not str(url).startswith(("http://", "https://")):
        raise ValueError(f"task.reward_kwargs.http.url={url!r}: give the reward service's base URL, e.g. "
                         "http://127.0.0.1:8100 (start one with `mmrl serve-reward NAME`)")
    if int(batch_size) < 1 or int(concurrency) < 1 or float(timeout) <= 0 or int(retries) < 0 or float(backoff) < 0:
        raise ValueError("task.reward_kwargs.http: batch_size and concurrency must be >= 1, timeout > 0, retries "
                         f"and backoff >= 0 (got {batch_size}, {concurrency}, {timeout}, {retries}, {backoff})")
    check_token_env(token_env, "task.reward_kwargs.http.token_env")


def _check_at_setup(url=None, token_env=None, timeout=60.0, **options):
    """The options (errors), then whether the service answers: a warning, not an error, when it does
    not (it may start after the run; until it answers its samples score the minimum)."""
    _check(url, token_env=token_env, timeout=timeout, **options)
    status, why = probe(str(url).rstrip("/") + "/health", token_from(token_env), min(float(timeout), 10.0))
    if status == 401:  # any other answer will do: a service of another make may have no /health
        log.warning("warning: the reward service %s refuses the token (task.reward_kwargs.http.token_env=%s); "
                    "its samples will score the minimum", url, token_env)
    elif status is None:
        log.warning("warning: the reward service %s does not answer GET /health (%s); until it does, its samples "
                    "score the minimum (start it with `mmrl serve-reward NAME`)", url, why)


@register_reward("http", check=_check_at_setup, maximum=float("inf"))
def http_reward(completions, examples, url: str | None = None, batch_size: int = 16, concurrency: int = 4,
                timeout: float = 60.0, retries: int = 2, backoff: float = 0.5, token_env: str | None = None,
                fields: list | None = None, minimum: float = 0.0, group_ids=None) -> list:
    """One future per completion, resolving to the service's score (None: the service could not
    parse it), or raising when its request failed. ``minimum``: the score of a failed or unparsable
    sample (the served reward's minimum)."""
    _check(url, batch_size, concurrency, timeout, retries, backoff, token_env)
    url = str(url).rstrip("/")
    token = token_from(token_env)
    groups = [int(g) for g in group_ids.tolist()] if hasattr(group_ids, "tolist") else group_ids
    executor = pool(url, int(concurrency))
    futures: list[Future] = [Future() for _ in completions]
    for start in range(0, len(completions), int(batch_size)):
        rows = range(start, min(start + int(batch_size), len(completions)))
        body = {"completions": [_encode_completion(completions[i]) for i in rows],
                "examples": [encode_example(examples[i], fields) if isinstance(examples[i], dict) else {}
                             for i in rows]}
        if groups is not None:
            body["group_ids"] = [groups[i] for i in rows]
        submit(executor, lambda body=body: _scores(url, body, token, float(timeout), int(retries), float(backoff)),
               [futures[i] for i in rows])
    return futures


def _encode_completion(completion):
    try:
        return encode(completion)
    except ValueError:
        return None  # the service scores it None (unparsable), as a reward does what it cannot read


def _scores(url: str, body: dict, token, timeout: float, retries: int, backoff: float) -> list:
    """The ``scores`` of ``POST {url}/score`` (None: the service could not parse that sample)."""
    answer = post_json(url + "/score", body, token, timeout, retries, backoff)
    scores = answer["scores"] if isinstance(answer, dict) else None
    if not isinstance(scores, list):
        raise Refused(f"{url}/score answered without a list of scores: {str(answer)[:200]}")
    return [None if score is None else float(score) for score in scores]
