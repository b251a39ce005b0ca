"""A stand-in for vLLM's OpenAI-compatible server, speaking what ``rollout.engine=vllm_server`` uses
of it, over mmrl's own HF engine: for the multi-process tests, whose environment has no vLLM
(tests/test_vllm_server.py runs the real server in the vLLM environment).

It is honest where the tests look: it samples and computes the log-probs with its own copy of the
weights, which only ``/collective_rpc`` ``reload_weights`` (the trainer's safetensors files)
changes, so a push that is missed, repeated on a stale directory or made by a rank with other
weights changes the samples, the log-probs and the trainer's importance weights. What it does
not imitate: concurrency (one request at a time, and one sampling at a time across the stand-ins of
a process: they share torch's global RNG), and vLLM's seeds. A request's samples are drawn
under a seed taken from its prompt's token ids (not the request's ``seed``, which the trainer draws
from its rank's stream), so a prompt rolled out by either of two ranks draws what one process
would: the condition of comparing a 2-process run with a 1-process one, as the generator runs
of tests/test_distributed.py key their noise by example index.

    server = StandIn("vlm/counting_tiny", "rollout.max_completion_length=16")  # the trainer's recipe and overrides
    server.url, server.reloads, server.hits, server.close()
"""

from __future__ import annotations

import base64
import io
import json
import threading
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

RESETS = ("/pause", "/resume", "/reset_encoder_cache", "/reset_mm_cache", "/reset_prefix_cache")
# Sampling seeds torch's global RNG, which every stand-in of this process shares: one at a time
SAMPLING = threading.Lock()


def policy_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages (images as PNG data URLs) as the policy's prompt (PIL images inline)."""
    from PIL import Image

    out = []
    for msg in messages:
        content = msg["content"]
        if isinstance(content, list):
            content = [{"type": "image", "image": Image.open(io.BytesIO(base64.b64decode(
                item["image_url"]["url"].split(",", 1)[1]))).convert("RGB")}
                if item.get("type") == "image_url" else item for item in content]
        out.append({**msg, "content": content})
    return out


class StandIn:
    """The server on 127.0.0.1 (a free port), its model a VLM policy with the hf engine built from
    the trainer's ``recipe`` (None: the defaults) and ``overrides``. ``fail_reload``:
    ``reload_weights`` answers HTTP 400 with that text."""

    def __init__(self, recipe: str | None, *overrides: str, fail_reload: str | None = None):
        from mmrl.config import builtin_config_path, load_config
        from mmrl.registry import load_plugins
        from mmrl.vlm.loading import resolve_model_path
        from mmrl.vlm.policy import VLMPolicy

        load_plugins()
        path = builtin_config_path(recipe) if recipe else None
        cfg = load_config(path, [*overrides, "train.device=cpu", "rollout.engine=hf"])
        self.policy = VLMPolicy(cfg)
        self.model = str(resolve_model_path(cfg.model.path, cfg.model.revision))
        self.fail_reload = fail_reload
        self.reloads: list[str] = []  # the weight directories reloaded, in order
        self.hits: Counter = Counter()  # requests by path
        self.lock = threading.Lock()  # one request at a time: a reload never meets a generation
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                self._answer(stand_in.get(self.path))

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(stand_in.post(self.path.split("?", 1)[0], json.loads(body) if body else {}))

            def _answer(self, reply):
                status, body = reply
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the endpoints ----------------------------------------------------------------------------
    def get(self, path: str):
        self.hits[path] += 1
        if path == "/health":
            return 200, {}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "root": self.model}]}
        return 404, {"error": f"no route {path}"}

    def post(self, path: str, body: dict):
        with self.lock:
            self.hits[path] += 1
            if path in RESETS:
                return 200, {}
            if path == "/collective_rpc" and body.get("method") == "reload_weights":
                return self.reload(Path(body["kwargs"]["weights_path"]))
            if path == "/v1/chat/completions":
                return self.chat(body)
            return 404, {"error": f"no route {path}"}

    def reload(self, directory: Path):
        from safetensors.torch import load_file

        if self.fail_reload:
            return 400, {"error": self.fail_reload}
        weights = {k: v for f in sorted(directory.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
        own = self.policy.module.state_dict()
        unknown = sorted(set(weights) - set(own))
        if not weights or unknown:
            return 400, {"error": f"reload_weights: {len(weights)} tensors in {directory}, unknown {unknown[:3]}"}
        with torch.no_grad():
            for name, tensor in weights.items():
                own[name].copy_(tensor)
        self.reloads.append(str(directory))
        return 200, {"results": [None]}

    def chat(self, body: dict):
        """``n`` samples of the prompt with the policy's sampling of the mode the request's settings
        match (train or eval; anything else is refused), the log-probs of this copy's weights."""
        policy = self.policy
        stop = tuple(body.get("stop", ()))
        mode = next((m for m in ("train", "eval") if self._matches(policy.sampling(m, stop), body)), None)
        if mode is None or body["stop_token_ids"] != sorted(policy.eos_ids):
            return 400, {"error": f"the request's sampling matches neither the train nor the eval settings: {body}"}
        prompt = policy_messages(body["messages"])
        ids = policy.encode_prompts([prompt])[0]["input_ids"][0]
        with SAMPLING:
            torch.manual_seed(zlib.crc32(json.dumps(ids.tolist()).encode()))
            batch = policy.rollout([{}], [prompt], int(body.get("n", 1)), mode, need_old_logps=True,
                                   need_ref_logps=False, stop=stop)
        choices = []
        for i, (tokens, mask) in enumerate(zip(batch.payload["completion_ids"], batch.action_mask)):
            logps = batch.old_logps[i][:len(tokens)].tolist()
            choices.append({"index": i, "token_ids": tokens.tolist(), "finish_reason": "stop",
                            "logprobs": {"content": [{"logprob": x} for x in logps]}})
        return 200, {"prompt_token_ids": batch.payload["prompt_ids"][0].tolist(), "choices": choices}

    @staticmethod
    def _matches(sampling, body: dict) -> bool:
        if sampling.max_new_tokens != body["max_tokens"] or sampling.temperature != body["temperature"]:
            return False
        return sampling.temperature == 0 or (sampling.top_p, sampling.top_k) == (body["top_p"], body["top_k"])
