"""HTTP to a set of rollout servers (``rollout.server_urls``), with the standard library only: the
trainer's environment needs neither vLLM nor an HTTP package for ``rollout.engine=vllm_server``.

A request goes to the least-loaded server (fewest requests in flight; a server whose last request
failed comes last). Connection errors, time-outs (``rollout.server_timeout``, on every request: a
dead server never hangs the run) and HTTP 5xx answers are retried on another server, up to
``rollout.server_retries`` times (once every server failed it, after a pause of 0.5 s doubling up to
4 s), each with a one-line warning naming the URL; past that the error
names every URL tried and what to do. A 4xx answer is the request's fault and is raised at once
with the server's message. Retries and failed attempts are counted for the step's metrics.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger("mmrl")

ADVICE = ("start the servers with `mmrl rollout-server RECIPE` (or check that the ones in rollout.server_urls are "
          "up and reachable), raise rollout.server_timeout if generation is slow, or rollout.server_retries")


class ServerError(RuntimeError):
    """A request a server refused (HTTP 4xx): not retried elsewhere, the request itself is wrong."""

    def __init__(self, url: str, status: int, body: str):
        super().__init__(f"{url} answered HTTP {status}: {body[:500]}")
        self.url, self.status, self.body = url, status, body


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url.removesuffix("/v1")


class ServerPool:
    """The servers of ``rollout.server_urls``: least-loaded choice, retries, counters."""

    def __init__(self, urls, timeout: float, retries: int):
        self.urls = [normalize_url(u) for u in urls]
        self.timeout, self.retries = float(timeout), int(retries)
        if self.timeout <= 0 or self.retries < 0:
            raise ValueError(f"rollout.server_timeout={timeout} must be > 0 and rollout.server_retries={retries} "
                             ">= 0")
        self.lock = threading.Lock()
        self.in_flight = {u: 0 for u in self.urls}
        self.failed = {u: False for u in self.urls}  # the last request to it failed
        self.turn = 0  # round-robin among equally loaded servers
        self.stats = {"requests": 0, "retries": 0, "errors": 0}

    # -- one server -------------------------------------------------------------------------------
    def call(self, url: str, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """One HTTP call; the JSON answer (None for an empty one, the text for a non-JSON one). Raises :class:`ServerError` on
        4xx, ``urllib.error.HTTPError`` on 5xx, ``OSError`` (connection refused, time-out) otherwise."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout if timeout is None else timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                raise ServerError(url, exc.code, exc.read().decode(errors="replace")) from None
            raise
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:  # a few endpoints answer plain text ("Success: LoRA adapter ... added")
            return raw.decode(errors="replace")

    # -- spread over the servers ------------------------------------------------------------------
    def pick(self, tried: set[str]) -> str:
        """The least-loaded server not tried yet for this request (all tried: the least loaded)."""
        with self.lock:
            fresh = [u for u in self.urls if u not in tried] or self.urls
            n = len(self.urls)
            order = {u: (self.urls.index(u) - self.turn) % n for u in fresh}
            url = min(fresh, key=lambda u: (self.failed[u], self.in_flight[u], order[u]))
            self.turn = (self.urls.index(url) + 1) % n
            self.in_flight[url] += 1
            return url

    def request(self, path: str, body: Any) -> Any:
        """POST ``body`` to ``path`` on one server, retried on others as the module docstring says."""
        tried: list[str] = []
        errors: list[str] = []
        for attempt in range(self.retries + 1):
            url = self.pick(set(tried))
            if url in tried:  # every server failed this request once: give a busy or restarting one a moment
                time.sleep(min(0.5 * 2 ** (attempt - len(self.urls)), 4.0))
            tried.append(url)
            try:
                answer = self.call(url, "POST", path, body)
            except ServerError:
                self._done(url, failed=False)
                raise
            except (urllib.error.URLError, OSError, socket.timeout, ConnectionError) as exc:
                self._done(url, failed=True)
                reason = _reason(exc, self.timeout)
                errors.append(f"{url}: {reason}")
                with self.lock:
                    self.stats["errors"] += 1
                if attempt < self.retries:
                    with self.lock:
                        self.stats["retries"] += 1
                    log.warning("warning: rollout server %s failed (%s); retrying on another server (%d of %d "
                                "retries)", url, reason, attempt + 1, self.retries)
                continue
            self._done(url, failed=False)
            with self.lock:
                self.stats["requests"] += 1
            return answer
        raise RuntimeError(f"rollout.engine=vllm_server: a request failed on every try ({len(tried)} tries, "
                           f"rollout.server_retries={self.retries}): {'; '.join(errors)}. URLs tried: "
                           f"{', '.join(dict.fromkeys(tried))}. What to do: {ADVICE}")

    def _done(self, url: str, failed: bool) -> None:
        with self.lock:
            self.in_flight[url] -= 1
            self.failed[url] = failed

    def drop(self, url: str) -> None:
        """Leave ``url`` out from now on (it missed a weight push, so it holds old weights)."""
        with self.lock:
            self.urls = [u for u in self.urls if u != url]
            self.turn = 0
        if not self.urls:
            raise RuntimeError(f"rollout.engine=vllm_server: no server left ({url} was the last). {ADVICE}")

    def take_stats(self) -> dict[str, float]:
        with self.lock:
            out = {f"rollout/server_{k}": float(v) for k, v in self.stats.items()}
            self.stats = dict.fromkeys(self.stats, 0)
        return out


def _reason(exc: BaseException, timeout: float) -> str:
    """A short reason for a failed request: the time-out, the HTTP status, or the socket error."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    inner = getattr(exc, "reason", exc)
    if isinstance(inner, (socket.timeout, TimeoutError)):
        return f"no answer within rollout.server_timeout={timeout:g} s"
    return f"{type(inner).__name__}: {inner}"
