"""``mmrl serve-reward NAME [key=value ...]``: any registered reward served over HTTP (the schema of
docs/plugins.md, "A reward as a service"), so a reward model runs on its own GPU or machine and
the run reaches it with the ``http`` reward.

The standard library's HTTP server (mmrl's main install has no web framework; Gradio is the demo's
extra), each request handled on a bounded thread pool, the reward itself called one batch at a
time (a reward model is not assumed thread-safe; its batch is the parallelism). What a request
cannot do: load a plugin, name another reward, set an option, or interpolate config; the reward and
its options are fixed on the command line and checked at start, as a run checks them. Bound beyond
loopback the server needs a bearer token (``--token`` or ``MMRL_REWARD_TOKEN``), since anyone who
reaches the port can spend its GPU; a body over ``--max-body-mb`` is refused unread.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Callable, List, Optional

import typer
import yaml
from rich.markup import escape

from mmrl.cli.errors import console, user_errors
from mmrl.cli.help import examples
from mmrl.config.options import check_names
from mmrl.demo.exposure import is_loopback
from mmrl.media.wire import decode

TOKEN_ENV = "MMRL_REWARD_TOKEN"


class RewardServer(HTTPServer):
    """An HTTP server scoring with one registered reward; requests run on ``threads`` workers."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], reward: Callable, name: str, options: dict, token: str | None,
                 max_body: int, threads: int):
        self.reward, self.name, self.options = reward, name, options
        self.token, self.max_body = token, max_body
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="mmrl-serve-reward")
        self.reward_lock = threading.Lock()
        super().__init__(address, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def process_request(self, request, client_address):  # the pool, not a thread per connection
        self.pool.submit(self._handle, request, client_address)

    def _handle(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def server_close(self):
        super().server_close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def score(self, body: Any) -> list:
        """The reward's scores of a request body (ValueError: the body breaks the schema)."""
        if not isinstance(body, dict) or not isinstance(body.get("completions"), list):
            raise ValueError('the body must be a JSON object with "completions": [...] and "examples": [...]')
        completions, examples = body["completions"], body.get("examples")
        if not isinstance(examples, list) or len(examples) != len(completions) \
                or not all(isinstance(e, dict) for e in examples):
            raise ValueError('"examples" must be a list of objects, one per completion')
        unknown = sorted(set(body) - {"completions", "examples", "group_ids"})
        if unknown:
            raise ValueError(f"unknown fields {unknown} (a request sends completions, examples, group_ids only)")
        context = {}
        if "group_ids" in body and "group_ids" in self.reward.reward_context:
            groups = body["group_ids"]
            if not isinstance(groups, list) or len(groups) != len(completions) \
                    or not all(isinstance(g, int) for g in groups):
                raise ValueError('"group_ids" must be a list of integers, one per completion')
            import torch

            context["group_ids"] = torch.tensor(groups)
        completions, examples = decode(completions), decode(examples)
        with self.reward_lock:
            raw = list(self.reward(completions, examples, **self.options, **context))
        if len(raw) != len(completions):
            raise RuntimeError(f"reward {self.name!r} returned {len(raw)} scores for {len(completions)} completions")
        return [None if r is None or not math.isfinite(float(r)) else float(r) for r in map(_settled, raw)]


def _settled(score):
    """A score, or the score a reward returned as a future (a judge on a server); None if it failed."""
    if isinstance(score, Future):
        try:
            return score.result()
        except Exception:  # the service behind this reward failed: the client counts a missing score
            return None
    return score


class Handler(BaseHTTPRequestHandler):
    server: RewardServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - quiet: a request per batch is not news
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _authorized(self) -> bool:
        if self.server.token is None:
            return True
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.server.token}".encode()):
            return True
        self._send(401, {"error": "a bearer token is required (Authorization: Bearer ...; the http reward reads "
                                  "it from the environment variable its token_env names)"})
        return False

    def do_GET(self):  # noqa: N802
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/health":
            return self._send(404, {"error": "GET /health or POST /score"})
        fn = self.server.reward
        self._send(200, {"reward": self.server.name, "minimum": fn.reward_minimum,
                         "maximum": fn.reward_maximum if math.isfinite(fn.reward_maximum) else None})

    def do_POST(self):  # noqa: N802
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/score":
            return self._send(404, {"error": "POST /score"})
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send(411, {"error": "a Content-Length is required"})
        if length > self.server.max_body:
            return self._send(413, {"error": f"the body is {length} bytes, over the server's cap of "
                                             f"{self.server.max_body} (--max-body-mb); send smaller batches "
                                             "(task.reward_kwargs.http.batch_size)"})
        try:
            body = json.loads(self.rfile.read(length))
            scores = self.server.score(body)
        except ValueError as exc:
            return self._send(400, {"error": str(exc)})
        except Exception as exc:  # the reward raised: the request's batch fails, the server stays up
            return self._send(422, {"error": f"reward {self.server.name!r} raised {type(exc).__name__}: {exc}"})
        self._send(200, {"scores": scores})


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs (values read as YAML scalars: ``min_area=0.1`` is a float)."""
    options = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"reward options are key=value pairs, got {pair!r}")
        options[key] = yaml.safe_load(value)
    return options


def make_server(name: str, options: dict, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                max_body_mb: float = 64.0, threads: int = 4, plugins: list[str] = ()) -> RewardServer:
    """A :class:`RewardServer` for the registered reward ``name`` with ``options`` (checked as a
    run checks ``task.reward_kwargs``), after importing ``plugins`` (files or modules, as a run's
    ``plugins`` key); refuses a bind beyond loopback without a token."""
    from mmrl.plugins import load_plugins
    from mmrl.registry import REWARDS

    if not token and not is_loopback(host):
        raise ValueError(f"--host {host} would let every machine that can reach it use this reward service; give "
                         f"a token with --token (or the {TOKEN_ENV} environment variable, kept out of `ps`)")
    load_plugins(list(plugins))
    fn = REWARDS.get(name)
    check_names(fn.reward_options, options, "mmrl serve-reward", f"the {name} reward")
    if fn.reward_check is not None:
        fn.reward_check(**options)
    return RewardServer((host, port), fn, name, options, token or None, int(max_body_mb * 2**20), threads)


def command(name: str, pairs: list[str], host: str, port: int, token: str | None, max_body_mb: float,
            threads: int, plugins: list[str], say: Callable[[str], None]) -> None:
    """Serve until interrupted, after printing the URL and how a run uses it."""
    server = make_server(name, parse_options(pairs), host, port, token or os.environ.get(TOKEN_ENV), max_body_mb,
                         threads, plugins)
    say(f"serving reward {name!r} on {server.url}  (in a run: task.rewards.http=1.0 "
        f"task.reward_kwargs.http.url={server.url})")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


SETTINGS = dict(name="serve-reward", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                epilog=examples(
    "mmrl serve-reward composition --port 8100   # then: mmrl train diffusion task.rewards.http=1.0 \\",
    "    task.reward_kwargs.http.url=http://127.0.0.1:8100",
    "mmrl serve-reward image_scorer scorer=aesthetic_mlp path=/ckpt/aesthetic.pt --host 0.0.0.0 --token $T"))


def serve_reward(name: str = typer.Argument(..., help="the registered reward to serve (mmrl list)"),
                 options: Optional[List[str]] = typer.Argument(None, metavar="[key=value ...]",
                                                               help="the reward's options"),
                 host: str = typer.Option("127.0.0.1", help="the address to bind; any other than loopback needs "
                                          "--token"),
                 port: int = typer.Option(8100, help="the port to serve on (0: a free one)"),
                 token: Optional[str] = typer.Option(None, help=f"the bearer token requests must carry (default: "
                                                     f"${TOKEN_ENV})"),
                 max_body_mb: float = typer.Option(64.0, help="requests with a larger body are refused unread"),
                 threads: int = typer.Option(4, help="requests handled at once (the reward runs one at a time)"),
                 plugin: Optional[List[str]] = typer.Option(None, help="a plugin file or module that registers the "
                                                            "reward (repeatable; as a run's plugins key)")):
    """Serve a registered reward over HTTP for the http reward (docs/plugins.md, "A reward as a service")."""
    with user_errors():
        command(name, list(options or []), host, port, token, max_body_mb, threads, list(plugin or []),
                lambda line: console.print(escape(line), highlight=False))
