"""The one HTTP client of the rewards computed elsewhere: the ``http`` reward (a reward service) and
the judges on an OpenAI-compatible server (``deepeyes``, ``vlm_judge`` and ``rubric_judge`` with a
``judge_url``).

A request that fails to connect, times out (``timeout`` seconds) or gets an HTTP 5xx is retried
``retries`` times after ``backoff * 2**i`` seconds; a refusal (4xx: a wrong token, a body over the
server's cap, an unknown model) is not. Requests run in one thread pool per (server, concurrency),
kept across steps; each returns ``concurrent.futures.Future`` s that the reward computer awaits
after the trainer's log-prob passes, a time-out raising ``TimeoutError`` (counted as late), any
other failure another exception (counted as failed): a dead server never crashes or hangs a run.

Bearer tokens come from an environment variable named in the config (never the token itself, which
the run directory would keep).
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
from typing import Callable

log = logging.getLogger("mmrl")

_POOLS: dict[tuple[str, int], ThreadPoolExecutor] = {}  # one pool per (server, concurrency), kept across steps
_LOCK = threading.Lock()


class Refused(RuntimeError):
    """The server refused the request (HTTP 4xx) or answered what cannot be read: retrying would not help."""


def check_token_env(token_env, key: str) -> None:
    """A ValueError naming ``key`` when ``token_env`` names an unset environment variable."""
    if token_env and not os.environ.get(str(token_env)):
        raise ValueError(f"{key}={token_env!r}: that environment variable is not set; export the server's token "
                         "in it (the config never holds the token)")


def token_from(token_env) -> str | None:
    return os.environ.get(str(token_env)) if token_env else None


def pool(url: str, concurrency: int) -> ThreadPoolExecutor:
    with _LOCK:
        key = (url, concurrency)
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(concurrency, thread_name_prefix="mmrl-reward-http")
        return _POOLS[key]


def submit(executor: ThreadPoolExecutor, call: Callable[[], list], futures: list[Future]) -> None:
    """Run ``call`` (one request, returning one value per future) in ``executor`` and settle every
    future with its value, or with the call's exception: the trainer never waits on a lost one."""

    def run():
        try:
            values = call()
            if len(values) != len(futures):
                raise RuntimeError(f"the server answered {len(values)} values for {len(futures)} samples")
            for future, value in zip(futures, values):
                future.set_result(value)
        except Exception as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)

    executor.submit(run)


def then(future: Future, fn: Callable) -> Future:
    """A future of ``fn(future's value)``; the exception of either passes on (a late answer stays late)."""
    out: Future = Future()

    def done(f: Future):
        try:
            out.set_result(fn(f.result()))
        except BaseException as exc:  # noqa: BLE001 (carried to the awaiting reward computer)
            out.set_exception(exc)

    future.add_done_callback(done)
    return out


def probe(url: str, token, timeout: float) -> tuple[int | None, bytes | str]:
    """``GET url`` at setup: ``(HTTP status, body)`` when the server answers (an error status
    included), ``(None, why)`` when it does not."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, str(getattr(exc, "reason", exc))


def post_json(url: str, body: dict, token, timeout: float, retries: int, backoff: float,
              what: str = "reward service"):
    """The JSON answer of ``POST url``, retried as the module docstring says; raises TimeoutError
    when the last try timed out, :class:`Refused` on a 4xx, RuntimeError on any other failure."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"
            if 400 <= exc.code < 500:
                log.warning("warning: %s %s refused a request (%s); its samples score the minimum", what, url, reason)
                raise Refused(f"{url} refused the request ({reason})") from None
            error: Exception = RuntimeError(f"{url}: {reason}")
        except (TimeoutError, urllib.error.URLError, OSError, ValueError) as exc:
            inner = getattr(exc, "reason", exc)
            timed_out = isinstance(inner, TimeoutError)
            error = (TimeoutError(f"{url}: no answer within timeout={timeout:g} s") if timed_out
                     else RuntimeError(f"{url}: {type(inner).__name__}: {inner}"))
        left = retries - attempt
        log.warning("warning: %s %s failed (%s); %s", what, url, error,
                    f"retrying ({left} retries left)" if left else "its samples score the minimum")
    raise error
