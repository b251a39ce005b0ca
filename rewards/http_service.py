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

Its own small client rather than the rollout server engine's (:mod:`mmrl.vlm.engines.server_client`):
that one spreads one request over several rollout servers and names ``rollout.*`` keys in its
errors and counters; this one talks to one service, with a token and back-off.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

from mmrl import register_reward
from mmrl.media.wire import encode, encode_example

log = logging.getLogger("mmrl")

_POOLS: dict[tuple[str, int], ThreadPoolExecutor] = {}  # one pool per (service, concurrency), kept across steps
_LOCK = threading.Lock()


class Refused(RuntimeError):
    """The service refused the request (HTTP 4xx): retrying would not help."""


def _check(url=None, batch_size=16, concurrency=4, timeout=60.0, retries=2, backoff=0.5, token_env=None, **_):
    if not url or not str(url).startswith(("http://", "https://")):
        raise ValueError(f"task.reward_kwargs.http.url={url!r}: give the reward service's base URL, e.g. "
                         "http://127.0.0.1:8100 (start one with `mmrl serve-reward NAME`)")
    if int(batch_size) < 1 or int(concurrency) < 1 or float(timeout) <= 0 or int(retries) < 0 or float(backoff) < 0:
        raise ValueError("task.reward_kwargs.http: batch_size and concurrency must be >= 1, timeout > 0, retries "
                         f"and backoff >= 0 (got {batch_size}, {concurrency}, {timeout}, {retries}, {backoff})")
    if token_env and not os.environ.get(str(token_env)):
        raise ValueError(f"task.reward_kwargs.http.token_env={token_env!r}: that environment variable is not set; "
                         "export the reward service's token in it (the config never holds the token)")


def _check_at_setup(url=None, token_env=None, timeout=60.0, **options):
    """The options (errors), then whether the service answers: a warning, not an error, when it does
    not (it may start after the run; until it answers its samples score the minimum)."""
    _check(url, token_env=token_env, timeout=timeout, **options)
    token = os.environ.get(str(token_env)) if token_env else None
    request = urllib.request.Request(str(url).rstrip("/") + "/health",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=min(float(timeout), 10.0)):
            pass
    except urllib.error.HTTPError as exc:  # it answers; a service of another make may have no /health
        if exc.code == 401:
            log.warning("warning: the reward service %s refuses the token (task.reward_kwargs.http.token_env=%s); "
                        "its samples will score the minimum", url, token_env)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("warning: the reward service %s does not answer GET /health (%s); until it does, its samples "
                    "score the minimum (start it with `mmrl serve-reward NAME`)", url, getattr(exc, "reason", exc))


@register_reward("http", check=_check_at_setup, maximum=float("inf"))
def http_reward(completions, examples, url: str | None = None, batch_size: int = 16, concurrency: int = 4,
                timeout: float = 60.0, retries: int = 2, backoff: float = 0.5, token_env: str | None = None,
                fields: list | None = None, minimum: float = 0.0, group_ids=None) -> list:
    """One future per completion, resolving to the service's score (None: the service could not
    parse it), or raising when its request failed. ``minimum``: the score of a failed or unparsable
    sample (the served reward's minimum)."""
    _check(url, batch_size, concurrency, timeout, retries, backoff, token_env)
    url = str(url).rstrip("/")
    token = os.environ.get(str(token_env)) if token_env else None
    groups = [int(g) for g in group_ids.tolist()] if hasattr(group_ids, "tolist") else group_ids
    pool = _pool(url, int(concurrency))
    futures: list[Future] = [Future() for _ in completions]
    for start in range(0, len(completions), int(batch_size)):
        rows = range(start, min(start + int(batch_size), len(completions)))
        body = {"completions": [_encode_completion(completions[i]) for i in rows],
                "examples": [encode_example(examples[i], fields) if isinstance(examples[i], dict) else {}
                             for i in rows]}
        if groups is not None:
            body["group_ids"] = [groups[i] for i in rows]
        pool.submit(_score_batch, url, body, [futures[i] for i in rows], token, float(timeout), int(retries),
                    float(backoff))
    return futures


def _encode_completion(completion):
    try:
        return encode(completion)
    except ValueError:
        return None  # the service scores it None (unparsable), as a reward does what it cannot read


def _pool(url: str, concurrency: int) -> ThreadPoolExecutor:
    with _LOCK:
        key = (url, concurrency)
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(concurrency, thread_name_prefix="mmrl-reward-http")
        return _POOLS[key]


def _score_batch(url: str, body: dict, futures: list[Future], token, timeout: float, retries: int,
                 backoff: float) -> None:
    """POST one request (retried as the module docstring says) and settle its futures."""
    try:
        scores = post_scores(url, body, token, timeout, retries, backoff)
        if len(scores) != len(futures):
            raise RuntimeError(f"{url}/score answered {len(scores)} scores for {len(futures)} samples")
        for future, score in zip(futures, scores):
            future.set_result(None if score is None else float(score))
    except Exception as exc:  # every future settles: the trainer never waits on a lost one
        for future in futures:
            if not future.done():
                future.set_exception(exc)


def post_scores(url: str, body: dict, token, timeout: float, retries: int, backoff: float) -> list:
    """The ``scores`` of ``POST {url}/score``; raises TimeoutError when the last try timed out,
    :class:`Refused` on a 4xx, RuntimeError on any other failure of the last try."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            request = urllib.request.Request(url + "/score", data=data, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer = json.loads(response.read())
            scores = answer["scores"] if isinstance(answer, dict) else None
            if not isinstance(scores, list):
                raise Refused(f"{url}/score answered without a list of scores: {str(answer)[:200]}")
            return scores
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"
            if 400 <= exc.code < 500:
                log.warning("warning: reward service %s refused a request (%s); its samples score the minimum",
                            url, reason)
                raise Refused(f"{url} refused the request ({reason})") from None
            error: Exception = RuntimeError(f"{url}: {reason}")
        except (TimeoutError, urllib.error.URLError, OSError, ValueError) as exc:
            inner = getattr(exc, "reason", exc)
            timed_out = isinstance(inner, TimeoutError)
            error = (TimeoutError(f"{url}: no answer within timeout={timeout:g} s") if timed_out
                     else RuntimeError(f"{url}: {type(inner).__name__}: {inner}"))
        left = retries - attempt
        log.warning("warning: reward service %s failed (%s); %s", url, error,
                    f"retrying ({left} retries left)" if left else "its samples score the minimum")
    raise error
