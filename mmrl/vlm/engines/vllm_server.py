"""``rollout.engine=vllm_server``: rollouts from vLLM's own OpenAI-compatible servers (``vllm serve``,
started by ``mmrl rollout-server RECIPE``) at ``rollout.server_urls``, kept on the trainer's
weights by pushing them after optimizer steps (TRL's ``vllm_mode="server"``, verl's and ms-swift's
rollout servers). The trainer's environment needs no vLLM: everything is HTTP (:mod:`.server_client`).

- Requests: one chat-completions request per prompt with ``n`` samples, all sent at once from a
  thread pool and spread over the servers (least loaded first). Images travel losslessly as PNG
  data URLs; vLLM's extensions ask for the prompt and completion token ids (``return_token_ids``),
  the sampled tokens' log-probs (the server runs with ``--logprobs-mode processed_logprobs``: after
  temperature and the ban, what the importance-sampling correction needs), the policy's EOS ids as
  stop tokens, the vision placeholders banned (``bad_words``), stop texts, and seeds drawn as the
  colocated engine draws them (:mod:`.vllm_requests`, shared with it). The server's prompt ids must
  equal the policy processor's. Video prompts are refused (as by the colocated engine). The image
  budget (vlm.min_pixels/max_pixels) is the server's (``mmrl rollout-server`` passes the recipe's):
  vLLM refuses per-request processor settings unless started with ``--trust-request-mm-kwargs``.
- At first use every server's ``/health`` is asked and ``/v1/models`` must serve ``model.path``'s
  checkpoint (by directory name).
- Weights (``push_weights``; ``sync_weights`` marks them stale and the next ``generate`` pushes):
  the colocated engine's tensors (:func:`.weight_sync.engine_weights`; the first push also the
  frozen vision tower, since a reused server may hold another run's) written as safetensors
  buckets of at most 256 MB into a private directory (mode 0700, under ``rollout.weight_sync_dir``
  or the temp dir; the servers must see the same file system), then on every server: ``/pause``
  (waiting for requests in flight), ``/collective_rpc`` ``reload_weights`` from that directory, the
  encoder, multimodal and prefix caches reset (else vLLM reuses vision embeddings and KV blocks of
  the old weights), ``/resume``. These are vLLM's development endpoints: the server runs with
  ``VLLM_SERVER_DEV_MODE=1``. A server that misses a push holds old weights and is left out.
- Several training processes (DDP: each holds the whole weights): each rank sends its own
  prompts; a push is made by rank 0 while the others wait for it, and its outcome (an error, the
  servers left out) is broadcast, so every rank raises the same error and no rank's next request
  reaches a server before it holds the new weights. Counters stay per rank and are summed over
  ranks with the step's other counters (:mod:`mmrl.core.batch.whole`).
- LoRA: against servers that load adapters at runtime (``--enable-lora``,
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``: what ``mmrl rollout-server`` starts for a LoRA recipe) the
  first push sends the frozen base, every push the adapters alone in peft's format
  (``/v1/load_lora_adapter`` in place, then the prefix cache reset: the adapter keeps its id, which
  the cache keys hold), and requests name the adapter. A server that cannot (HTTP 400/404 at the
  first push) gets the merged weights from then on, with a warning; so does a 4-bit base.
- ``concurrent``: generation reads only the servers' weights, so it may run while the trainer
  updates (``train.async_rollouts``); a lock keeps a push and a generate's own push apart.
"""

from __future__ import annotations

import base64
import io
import logging
import shutil
import tempfile
import threading
import time
import urllib.error
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.registry import register_engine

from ..loading import resolve_model_path
from .base import RolloutEngine, Sampling
from .server_client import ADVICE, ServerError, ServerPool
from .vllm_requests import check_prompt_ids, draw_seeds, encode_requests, group_prompts, refuse_hf_only_keys, to_samples
from .weight_sync import base_weights, engine_weights, write_adapters, write_buckets

log = logging.getLogger("mmrl")

LORA_NAME = "mmrl-lora"  # the adapters' name on the servers
DEV_MODE_HINT = ("the server does not offer vLLM's development endpoints (/pause, /collective_rpc, /reset_*): start "
                 "it with VLLM_SERVER_DEV_MODE=1 (`mmrl rollout-server` does)")


SERVER_KEYS = ("server_urls", "server_timeout", "server_retries", "weight_sync_dir")


def refuse_server_keys(r, engine: str) -> None:
    """The server engine's keys set for another engine are refused, not ignored."""
    from mmrl.config import ConfigError
    from mmrl.config.schema import RolloutConfig

    default = RolloutConfig()
    changed = [f"rollout.{k}={getattr(r, k)!r}" for k in SERVER_KEYS if getattr(r, k) != getattr(default, k)]
    if changed:
        raise ConfigError(f"{', '.join(changed)}: read only by rollout.engine=vllm_server (this run uses "
                          f"rollout.engine={engine}); remove the key(s) or set rollout.engine=vllm_server")


def png_data_url(image) -> str:
    """A PIL image as a lossless PNG data URL (JPEG would change the pixels the trainer sees)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat_messages(clean: list[dict], images: Sequence[Any]) -> list[dict]:
    """The policy's messages (images taken out, ``{"type": "image"}`` where each was) in the
    OpenAI chat format, each placeholder replaced by its image as a PNG data URL."""
    it = iter(images)
    out = []
    for msg in clean:
        content = msg["content"]
        if isinstance(content, list):
            content = [{"type": "image_url", "image_url": {"url": png_data_url(next(it))}}
                       if item.get("type") == "image" else item for item in content]
        out.append({**msg, "content": content})
    return out


def chat_body(model: str, messages: list[dict], sampling: Sampling, n: int, seed: int | None,
              stop_token_ids: Sequence[int], banned: Sequence[str]) -> dict:
    """One chat-completions request of ``n`` samples (greedy: one, repeated by the caller)."""
    body: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": sampling.max_new_tokens,
        "stop_token_ids": list(stop_token_ids), "logprobs": True, "top_logprobs": 0,
        "return_token_ids": True, "skip_special_tokens": False,
    }
    if banned:
        body["bad_words"] = list(banned)
    if sampling.stop:  # vLLM matches stop texts on the detokenized output; the text is kept
        body.update(stop=list(sampling.stop), include_stop_str_in_output=True)
    if sampling.temperature > 0:
        body.update(n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, seed=seed)
    else:
        body.update(n=1, temperature=0.0)
    return body


def parse_chat_response(answer: dict) -> tuple[list[int], list[tuple[list[int], list[float]]]]:
    """``(prompt token ids, [(completion token ids, their log-probs)])`` of a chat-completions
    answer, the choices in their index order."""
    try:
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        completions = []
        for c in choices:
            ids = list(c["token_ids"])
            logps = [float(t["logprob"]) for t in c["logprobs"]["content"]]
            if len(logps) != len(ids):
                raise ValueError(f"{len(ids)} token ids but {len(logps)} log-probs")
            completions.append((ids, logps))
        return list(answer["prompt_token_ids"]), completions
    except (KeyError, TypeError, ValueError) as exc:
        raise RuntimeError(f"rollout.engine=vllm_server: the server's answer lacks token ids or log-probs ({exc}); "
                           "it must be vLLM's OpenAI-compatible server (return_token_ids needs vLLM >= 0.10)") from exc


@register_engine("vllm_server")
class VLLMServerEngine(RolloutEngine):
    """vLLM servers at ``rollout.server_urls``; see the module docstring."""

    concurrent = True

    def __init__(self, policy):
        super().__init__(policy)
        from mmrl.config import ConfigError

        r = policy.cfg.rollout
        if not r.server_urls:
            raise ConfigError("rollout.engine=vllm_server needs rollout.server_urls (the servers' base URLs, e.g. "
                              "rollout.server_urls=[http://127.0.0.1:8000]); start one with `mmrl rollout-server "
                              "RECIPE`, which prints its URL")
        refuse_hf_only_keys(r, "vllm_server")
        if r.vllm_enable_sleep_mode:
            raise ConfigError("rollout.vllm_enable_sleep_mode: read only by rollout.engine=vllm (a server keeps its "
                              "memory); remove the key")
        self.pool = ServerPool(r.server_urls, r.server_timeout, r.server_retries)
        self.model_name: str | None = None  # the served model's id, after the health check
        self.lock = threading.RLock()
        self.stale = True  # the servers get the trainer's weights before the first rollout
        self.pushes = 0
        self.sync_seconds, self.pushes_taken = 0.0, 0  # for take_stats: since its last call
        self.sync_root = Path(tempfile.mkdtemp(prefix="mmrl-weights-", dir=r.weight_sync_dir))  # mode 0700
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.sync_root, True)
        self.current: Path | None = None
        # LoRA: "adapters" while the servers load the adapters at runtime, "merged" once one cannot
        # (or over a 4-bit base, whose dense copy the servers would need anyway); None: not LoRA
        self.lora_mode = None if not policy.lora else ("merged" if policy.four_bit is not None else "adapters")

    # -- servers ----------------------------------------------------------------------------------
    def connect(self) -> str:
        """At first use: every server answers ``/health`` and serves ``model.path``'s checkpoint
        (a server that does not answer is left out with a warning); the served model's id."""
        if self.model_name is not None:
            return self.model_name
        cfg = self.policy.cfg
        want = Path(str(resolve_model_path(cfg.model.path, cfg.model.revision))).name
        served: dict[str, str] = {}
        dead = []
        for url in list(self.pool.urls):
            try:
                self.pool.call(url, "GET", "/health")
                models = self.pool.call(url, "GET", "/v1/models")["data"]
            except (urllib.error.URLError, OSError) as exc:
                dead.append(f"{url} ({exc})")
                continue
            names = {m["id"]: {Path(str(m["id"])).name, Path(str(m.get("root") or m["id"])).name} for m in models}
            match = [mid for mid, ns in names.items() if want in ns]
            if not match:
                raise RuntimeError(f"the rollout server at {url} serves {', '.join(names) or 'no model'}, but "
                                   f"model.path is {cfg.model.path} ({want}): start the server on this recipe "
                                   "(`mmrl rollout-server RECIPE`) or fix rollout.server_urls")
            served[url] = match[0]
        if not served:
            raise RuntimeError(f"rollout.engine=vllm_server: no server answered /health: {'; '.join(dead)}. {ADVICE}")
        for entry in dead:
            url = entry.split(" ", 1)[0]
            log.warning("warning: rollout server %s did not answer /health; left out of this run", entry)
            self.pool.drop(url)
        self.model_name = next(iter(served.values()))
        return self.model_name

    def sync_weights(self) -> None:
        """After an optimizer step: the next rollout pushes the new weights first."""
        self.stale = True

    def push_weights(self) -> None:
        """The policy's current weights onto every server now (see the module docstring). Several
        training processes call it at the same point (each holds the whole weights under DDP):
        rank 0 pushes while the others wait, then rank 0's outcome reaches every rank (its error,
        raised everywhere; the servers it left out; the LoRA mode), so no rank sends a request
        before every server holds the new weights."""
        from mmrl.core import distributed as dist

        with self.lock:
            start = time.perf_counter()
            error = None
            if dist.is_main():
                try:
                    self._push()
                except Exception as exc:  # raised below, after every rank has heard of it
                    error = exc
            failed, urls, self.lora_mode = dist.broadcast(
                (None if error is None else f"{type(error).__name__}: {error}", list(self.pool.urls), self.lora_mode))
            if error is not None:
                raise error
            if failed is not None:
                raise RuntimeError(f"rank 0's weight push to the rollout servers failed: {failed}")
            for url in [u for u in self.pool.urls if u not in urls]:  # left out by rank 0: old weights
                self.pool.drop(url)
            self.stale = False
            self.pushes += 1
            self.sync_seconds += time.perf_counter() - start

    def _push(self) -> None:
        """Write the weights and reload them on every server (rank 0's part of :meth:`push_weights`)."""
        self.connect()
        target = self.sync_root / f"v{self.pushes + 1:06d}"
        if self.lora_mode == "adapters":
            if self.pushes == 0:  # the frozen base once (a server may hold another run's weights)
                write_buckets(base_weights(self.policy), target / "base")
                self._on_every_server(lambda u: self._reload(u, target / "base"))
            write_adapters(self.policy, target / "adapters")
            if not self._on_every_server(lambda u: self._load_adapters(u, target / "adapters")):
                self.lora_mode = "merged"  # a server without runtime LoRA: merged weights from now on
        if self.lora_mode != "adapters":
            # the first push sends every weight: a server may hold what another run pushed
            write_buckets(engine_weights(self.policy, everything=self.pushes == 0), target)
            self._on_every_server(lambda u: self._reload(u, target))
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = target

    def _on_every_server(self, update) -> bool:
        """``update(url)`` on every server at once; a server it fails on (a connection error) is
        left out with a warning. False when one answered that it cannot (``update`` returned False)."""
        urls = list(self.pool.urls)
        with ThreadPoolExecutor(max_workers=len(urls)) as ex:
            results = list(ex.map(update, urls))
        for url, result in zip(urls, results):
            if isinstance(result, Exception):
                log.warning("warning: rollout server %s missed a weight push (%s); left out of this run", url, result)
                self.pool.drop(url)
        return all(r is not False for r in results)

    @property
    def served_model(self) -> str:
        """The model name requests ask for: the adapters' once loaded, else the served checkpoint's."""
        return LORA_NAME if self.lora_mode == "adapters" and self.pushes else self.connect()

    def _load_adapters(self, url: str, directory: Path):
        """The adapters in ``directory`` loaded in place on one server, its prefix cache reset (the
        in-place adapter keeps its id, which vLLM's prefix-cache keys hold); None, False when the
        server does not load adapters at runtime, or the connection error."""
        call = self.pool.call
        try:
            call(url, "POST", "/pause?mode=wait")
            try:
                call(url, "POST", "/v1/load_lora_adapter",
                     {"lora_name": LORA_NAME, "lora_path": str(directory), "load_inplace": True})
                call(url, "POST", "/reset_prefix_cache")
            finally:
                call(url, "POST", "/resume")
        except ServerError as exc:
            if exc.status in (400, 404) and self.pushes == 0:
                log.warning("warning: rollout server %s does not load LoRA adapters at runtime (%s); pushing merged "
                            "weights instead. For adapters alone start it with --enable-lora and "
                            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (`mmrl rollout-server` does for a LoRA recipe)",
                            url, exc)
                return False
            raise
        except (urllib.error.URLError, OSError) as exc:
            return exc
        return None

    def _reload(self, url: str, directory: Path) -> Exception | None:
        """One server onto the weights in ``directory``; None, or the connection error (a 404 of a
        server without the development endpoints is raised with what to do)."""
        call = self.pool.call
        try:
            try:
                call(url, "POST", "/pause?mode=wait")
            except ServerError as exc:
                if exc.status == 404:
                    raise RuntimeError(f"rollout server {url}: {DEV_MODE_HINT}") from None
                raise
            try:
                call(url, "POST", "/collective_rpc",
                     {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}})
                for path in ("/reset_encoder_cache", "/reset_mm_cache", "/reset_prefix_cache"):
                    call(url, "POST", path)
            finally:
                call(url, "POST", "/resume")
        except (urllib.error.URLError, OSError) as exc:
            return exc
        return None

    def take_stats(self) -> dict[str, float]:
        """This rank's requests, retries and errors since the last call, the pushes it made (rank 0
        alone pushes: summed over ranks, the run's count) and the seconds they took (waited for)."""
        from mmrl.core import distributed as dist

        stats = self.pool.take_stats()
        with self.lock:
            pushed = self.pushes - self.pushes_taken if dist.is_main() else 0
            stats.update({"rollout/weight_pushes": float(pushed), "rollout/weight_sync_time": self.sync_seconds})
            self.sync_seconds, self.pushes_taken = 0.0, self.pushes
        return stats

    # -- generation -------------------------------------------------------------------------------
    def encode(self, prompts: Sequence[list[dict]], batch_size: int) -> list[dict]:
        """Per prompt: its messages with PNG images, and what the policy's processor makes of it."""
        return encode_requests(self.policy, prompts, batch_size, "vllm_server", chat_messages)

    @torch.no_grad()
    def generate(self, prompts: Sequence[list[dict]], sampling: Sampling) -> list[dict]:
        with self.lock:
            self.connect()
            if self.stale:  # before the empty check: every rank takes part in a push
                self.push_weights()
            model = self.served_model
        if not prompts:
            return []
        policy = self.policy
        groups = group_prompts(prompts)
        encoded = self.encode([p for p, _ in groups], sampling.batch_size or len(groups))
        banned = [policy.tokenizer.convert_ids_to_tokens(i) for i in policy.suppressed_ids]
        bodies = [chat_body(model, enc["request"], sampling, n, seed, sorted(policy.eos_ids), banned)
                  for (_, n), enc, seed in zip(groups, encoded, draw_seeds(groups))]
        with ThreadPoolExecutor(max_workers=min(len(bodies), 32)) as ex:
            answers = list(ex.map(lambda b: self.pool.request("/v1/chat/completions", b), bodies))
        results: list[dict] = []
        for (_, n), enc, answer in zip(groups, encoded, answers):
            prompt_ids, completions = parse_chat_response(answer)
            check_prompt_ids("vllm_server", prompt_ids, enc)
            results.extend(to_samples(self, sampling, n, enc, completions))
        return results
