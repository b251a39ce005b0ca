"""Rewards as services (issue 55): the ``http`` reward against ``mmrl serve-reward`` and scripted
stand-in servers on loopback.

- the schema: images travel as PNG (the served reward sees the same pixels), the answer's scores
  are the in-process reward's;
- time-outs, retries with back-off, a refused token, the body cap: each counted, never raised;
- rewards computed while the policy scores: the same rewards and advantages as in process, the
  wait in ``reward_wait_time``;
- a 2-step ``mmrl train diffusion`` with its reward served by ``mmrl serve-reward`` in another
  process logs the rewards of the in-process run; with the server killed mid-run the run finishes
  and counts the failures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import mmrl
from mmrl.cli import app
from mmrl.cli.serve_reward import make_server
from mmrl.core.reward_computer import RewardComputer
from mmrl.media.wire import decode, encode, encode_example

SPEC = [{"count": 1, "color": "red", "shape": "square", "position": "left"}]


def _image(color) -> Image.Image:
    im = Image.new("RGB", (16, 16), (0, 0, 0))
    for x in range(2, 8):
        for y in range(5, 11):
            im.putpixel((x, y), color)
    return im


@pytest.fixture
def served():
    """``served(name, **options)``: a running mmrl serve-reward server (in a thread) and its URL."""
    servers = []

    def start(name, options=None, **kw):
        server = make_server(name, options or {}, port=0, **kw)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class Script(BaseHTTPRequestHandler):
    """A stand-in service: ``plan`` lists what each request gets (a status, "sleep", or "ok")."""

    plan: list = []
    seen: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Script.seen.append((time.monotonic(), body, self.headers.get("Authorization")))
        step = Script.plan.pop(0) if Script.plan else "ok"
        if step == "sleep":
            time.sleep(1.0)
            step = "ok"
        if step == "ok":
            data = json.dumps({"scores": [float(len(c)) for c in body["completions"]]}).encode()
            self.send_response(200)
        else:
            data = b'{"error": "scripted"}'
            self.send_response(step)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def script():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Script)
    server.daemon_threads = True
    Script.plan, Script.seen = [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _computer(url, **options):
    return RewardComputer({"http": 1.0}, {"http": {"url": url, **options}})


# -- the schema ------------------------------------------------------------------------------------

def test_images_and_examples_cross_as_json_unchanged():
    red = _image((255, 0, 0))
    wire = json.loads(json.dumps(encode([red, "text", 3, None])))
    back = decode(wire)
    assert list(back[0].getdata()) == list(red.getdata()) and back[1:] == ["text", 3, None]
    # the trainer's own keys (_index) and objects without a JSON form (a tensor) stay home
    assert encode_example({"spec": SPEC, "_index": 4, "latents": torch.zeros(2), "prompt": "a"}) == \
        {"spec": SPEC, "prompt": "a"}
    assert encode_example({"spec": SPEC, "prompt": "a"}, fields=["prompt"]) == {"prompt": "a"}


@pytest.mark.slow
def test_a_served_reward_scores_as_in_process(served):
    server = served("composition")
    images = [_image((255, 0, 0)), _image((0, 0, 255)), "not an image"]
    examples = [{"spec": SPEC, "prompt": "a red square on the left"}] * 3
    local = RewardComputer({"composition": 1.0})(images, examples)
    remote = _computer(server.url, batch_size=2)(images, examples)
    assert torch.equal(remote[1]["http"], local[1]["composition"])
    assert remote[1]["http"][0] == 1.0 and remote[1]["http"][1] < 1.0  # the red square passes every check
    # the unparsable completion is the served reward's None: counted as unparsable, not as a failure
    assert remote[2]["reward/http/unparsable_frac"] == pytest.approx(1 / 3)
    assert remote[2]["reward/http/failed_frac"] == 0.0 and remote[2]["reward/http/late_frac"] == 0.0


@pytest.mark.slow
def test_two_services_at_once_each_under_its_label(served):
    """``http@<label>``: one reward used twice with other options (two services at once, as PickScore beside
    an OCR service): each label has its own options, scores, counters and weight in the total."""
    from mmrl.registry import UnknownNameError

    composition, brightness = served("composition"), served("brightness", {"target": 0.25})
    images = [_image((255, 0, 0)), _image((0, 0, 255)), "not an image"]
    examples = [{"spec": SPEC, "prompt": "a red square on the left"}] * 3
    local = RewardComputer({"composition": 1.0, "brightness": 1.0}, {"brightness": {"target": 0.25}})(images, examples)
    remote = RewardComputer({"http@layout": 0.5, "http@light": 2.0},
                            {"http@layout": {"url": composition.url}, "http@light": {"url": brightness.url}})
    total, parts, stats = remote(images, examples)
    assert torch.equal(parts["http@layout"], local[1]["composition"])
    assert torch.equal(parts["http@light"], local[1]["brightness"])
    assert not torch.equal(parts["http@layout"], parts["http@light"])
    assert torch.allclose(total, 0.5 * parts["http@layout"] + 2.0 * parts["http@light"])
    assert stats["reward/http@light/unparsable_frac"] == pytest.approx(1 / 3)
    assert stats["reward/http@layout/failed_frac"] == stats["reward/http@light/failed_frac"] == 0.0
    with pytest.raises(ValueError, match=r"task.reward_kwargs.http@light.url"):  # each label is checked
        RewardComputer({"http@layout": 1.0, "http@light": 1.0}, {"http@layout": {"url": composition.url}})
    with pytest.raises(UnknownNameError, match=r"unknown reward 'htp' for task.rewards.htp@layout"):
        RewardComputer({"htp@layout": 1.0})


@pytest.mark.slow
def test_the_schema_is_checked(served):
    import urllib.error
    import urllib.request

    server = served("composition")

    def post(body):
        req = urllib.request.Request(server.url + "/score", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert post({"completions": ["x"], "examples": []})[0] == 400
    status, answer = post({"completions": ["x"], "examples": [{}], "plugins": ["evil.py"]})
    assert status == 400 and "plugins" in answer["error"]  # no plugin loading, no options from a request
    assert post({"completions": ["x"], "examples": [{"spec": SPEC}]}) == (200, {"scores": [None]})
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert json.loads(r.read())["reward"] == "composition"


# -- failures: counted, never raised ---------------------------------------------------------------

def test_a_dead_service_scores_the_minimum_and_is_counted():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    total, comps, stats = _computer(f"http://127.0.0.1:{port}", retries=1, backoff=0.01, minimum=-1.0)(
        ["a", "b"], [{}, {}])
    assert time.monotonic() - began < 5
    assert comps["http"].tolist() == [-1.0, -1.0]  # the option minimum, not the registered 0
    assert stats["reward/http/failed_frac"] == 1.0 and stats["reward/http/unparsable_frac"] == 0.0


@pytest.mark.slow
def test_retries_back_off_then_succeed(script):
    Script.plan = [503, 503]
    total, comps, stats = _computer(script, retries=2, backoff=0.2)(["ab", "abc"], [{}, {}])
    assert comps["http"].tolist() == [2.0, 3.0] and stats["reward/http/failed_frac"] == 0.0
    times = [t for t, _, _ in Script.seen]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.2 and times[2] - times[1] >= 0.4  # backoff * 2**i


@pytest.mark.slow
def test_a_late_score_is_counted_as_late(script):
    Script.plan = ["sleep"]
    total, comps, stats = _computer(script, retries=0, timeout=0.3, batch_size=1)(["ab", "abc"], [{}, {}])
    # one request of two timed out: its sample scores the minimum, the other its score
    assert sorted(comps["http"].tolist()) == [0.0, 3.0] or sorted(comps["http"].tolist()) == [0.0, 2.0]
    assert stats["reward/http/late_frac"] == 0.5 and stats["reward/http/failed_frac"] == 0.0


@pytest.mark.slow
def test_the_token_is_required_beyond_loopback_and_checked(served, monkeypatch):
    with pytest.raises(ValueError, match="--token"):
        make_server("composition", {}, host="0.0.0.0", port=0)
    server = served("composition", token="s3cret")
    examples = [{"spec": SPEC}]
    _, comps, stats = _computer(server.url, retries=3, backoff=0.01)([_image((255, 0, 0))], examples)
    assert stats["reward/http/failed_frac"] == 1.0 and comps["http"].tolist() == [0.0]  # refused: not retried
    monkeypatch.setenv("REWARD_TOKEN_TEST", "s3cret")
    _, comps, stats = _computer(server.url, token_env="REWARD_TOKEN_TEST")([_image((255, 0, 0))], examples)
    assert comps["http"].tolist() == [1.0] and stats["reward/http/failed_frac"] == 0.0


@pytest.mark.slow
def test_a_body_over_the_cap_is_refused(served):
    server = served("composition", max_body_mb=0.001)  # 1048 bytes
    examples = [{"spec": SPEC}] * 2
    _, comps, stats = _computer(server.url, batch_size=1)(["x" * 2000, _image((255, 0, 0))], examples)
    # the long request is refused unread (not retried), the short one scored
    assert comps["http"].tolist() == [0.0, 1.0]
    assert stats["reward/http/failed_frac"] == 0.5 and stats["reward/http/unparsable_frac"] == 0.0


@pytest.mark.slow
def test_a_plugin_reward_is_served(served, tmp_path, monkeypatch):
    import mmrl.registry
    from mmrl.registry import REWARDS, Registry

    registry = Registry("reward")  # a copy for this test: the fuzz test calls every registered reward
    for name in REWARDS.names():
        registry.register(name, REWARDS.get(name))
    monkeypatch.setattr(mmrl.registry, "REWARDS", registry)
    plugin = tmp_path / "length_plugin.py"
    plugin.write_text("from mmrl import register_reward\n\n"
                      "@register_reward('served_length_test', maximum=100.0)\n"
                      "def served_length_test(completions, examples, scale: float = 1.0):\n"
                      "    return [scale * len(c) for c in completions]\n")
    server = served("served_length_test", {"scale": 2.0}, plugins=[str(plugin)])
    _, comps, _ = _computer(server.url)(["ab", "abcd"], [{}, {}])
    assert comps["http"].tolist() == [4.0, 8.0]
    with pytest.raises(Exception, match="takes no sclae"):  # options checked at start, as a run's
        make_server("served_length_test", {"sclae": 2.0}, port=0)


@pytest.mark.slow
def test_a_reward_that_answers_with_futures_is_served(served, tmp_path, monkeypatch):
    """A judge on a server returns futures; the service settles them (a failed one: no score)."""
    import mmrl.registry
    from mmrl.registry import REWARDS, Registry

    registry = Registry("reward")
    for name in REWARDS.names():
        registry.register(name, REWARDS.get(name))
    monkeypatch.setattr(mmrl.registry, "REWARDS", registry)
    plugin = tmp_path / "future_plugin.py"
    plugin.write_text("from concurrent.futures import Future\nfrom mmrl import register_reward\n\n"
                      "def _done(value):\n    f = Future()\n"
                      "    f.set_exception(ConnectionError('judge down')) if value is None else f.set_result(value)\n"
                      "    return f\n\n"
                      "@register_reward('served_future_test', minimum=-1.0, maximum=100.0)\n"
                      "def served_future_test(completions, examples):\n"
                      "    return [_done(None if c == 'x' else float(len(c))) for c in completions]\n")
    server = served("served_future_test", {}, plugins=[str(plugin)])
    _, comps, _ = _computer(server.url)(["ab", "x", "abcd"], [{}, {}, {}])
    assert comps["http"].tolist() == [2.0, 0.0, 4.0]  # no score: the http reward's minimum (its option, 0)


def test_misconfiguration_stops_the_run_at_setup():
    with pytest.raises(ValueError, match="task.reward_kwargs.http.url"):
        RewardComputer({"http": 1.0}, {"http": {}})
    with pytest.raises(ValueError, match="token_env"):
        RewardComputer({"http": 1.0}, {"http": {"url": "http://127.0.0.1:1", "token_env": "MMRL_NO_SUCH_VAR"}})


# -- rewards computed while the policy works -------------------------------------------------------

@pytest.mark.slow
def test_served_rewards_are_awaited_after_the_log_prob_passes(script):
    from mmrl.core.batch.scoring import StepScorer
    from mmrl.core.rollouts import Rollouts

    batch = Rollouts(group_ids=torch.tensor([0, 0]), action_mask=torch.ones(2, 3), completions=["ab", "abc"],
                     examples=[{}, {}])
    scorer = StepScorer(_computer(script, retries=0, timeout=5.0), max_actions=3, buffer=0, penalty=0.0)
    Script.plan = ["sleep"]  # the service takes 1 s
    passes = []
    began = time.monotonic()
    scorer(batch, meanwhile=lambda: (time.sleep(1.0), passes.append(len(Script.seen))))  # a 1 s log-prob pass
    elapsed = time.monotonic() - began
    assert passes == [1]  # the request was out before the pass ended
    assert batch.rewards.tolist() == [2.0, 3.0]
    assert elapsed < 1.8 and scorer.mean_stats()["reward_wait_time"] < 0.6  # 1 s + 1 s overlapped


# -- the whole loop: mmrl train diffusion with its reward served by another process -----------------

def _train(out, name, *extra) -> list[dict]:
    """A few-second 2-step run of the tiny generator recipe (4 images a prompt, 4 denoising steps)."""
    args = ["train", "diffusion", "diffusion/composition_tiny", "train.steps=2", "train.prompts_per_step=2",
            "rollout.num_generations=4", "diffusion.num_steps=4", "diffusion.eval_num_steps=4", "eval.num_examples=4",
            "eval.every=0", "train.threads=1", f"log.output_dir={out}", f"log.run_name={name}",
            "log.progress=false", "log.tensorboard=false", "log.save_rollouts_every=0", "log.save_every=0", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_reward(*args: str):
    """``mmrl serve-reward ...`` in its own process; (process, url) once it answers."""
    import urllib.request

    port = args[args.index("--port") + 1]
    proc = subprocess.Popen([sys.executable, "-m", "mmrl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"mmrl serve-reward did not start: {proc.stdout.read()}")
            time.sleep(0.2)


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@pytest.mark.slow
def test_a_served_reward_trains_as_in_process(tmp_path):
    # docs/plugins.md's commands, on a free port: mmrl serve-reward composition --port 8100, then
    # mmrl train diffusion task.rewards.http=1.0 task.reward_kwargs.http.url=http://127.0.0.1:8100
    proc, url = _serve_reward("serve-reward", "composition", "--port", str(_free_port()))
    try:
        local = _train(tmp_path, "local")
        served = _train(tmp_path, "served", "task.rewards.http=1.0", f"task.reward_kwargs.http.url={url}")
    finally:
        _stop(proc)
    steps = lambda rows: [r for r in rows if "reward" in r]  # noqa: E731
    assert [r["step"] for r in steps(served)] == [1, 2]
    for a, b in zip(steps(local), steps(served)):
        # the same rewards, hence the same advantages, loss and update
        assert b["reward/http"] == a["reward/composition"] and b["reward"] == a["reward"]
        assert b["reward_std"] == a["reward_std"] and b["loss"] == a["loss"] and b["grad_norm"] == a["grad_norm"]
        assert b["reward/http/failed_frac"] == 0.0 and b["reward/http/late_frac"] == 0.0
        assert b["reward_wait_time"] >= 0.0 and a["reward_wait_time"] >= 0.0
    evals = lambda rows: [r["eval/reward"] for r in rows if "eval/reward" in r]  # noqa: E731
    assert evals(served) == evals(local)


@pytest.mark.slow
def test_a_run_outlives_its_killed_reward_service(tmp_path):
    proc, url = _serve_reward("serve-reward", "composition", "--port", str(_free_port()))
    run = tmp_path / "killed"

    def kill_after_step_one():  # the service dies once step 1 is logged
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            path = run / "metrics.jsonl"
            if path.exists() and any('"reward"' in line for line in path.read_text().splitlines()):
                proc.kill()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_after_step_one, daemon=True)
    watcher.start()
    began = time.monotonic()
    try:
        rows = _train(tmp_path, "killed", "train.steps=3", "task.rewards.http=1.0",
                      f"task.reward_kwargs.http.url={url}", "task.reward_kwargs.http.retries=1",
                      "task.reward_kwargs.http.backoff=0.1")
    finally:
        watcher.join(timeout=10)
        _stop(proc)
    steps = {r["step"]: r for r in rows if "reward" in r}
    assert sorted(steps) == [1, 2, 3] and proc.poll() is not None  # every step ran, the service is dead
    assert steps[1]["reward/http/failed_frac"] == 0.0
    assert steps[3]["reward/http/failed_frac"] == 1.0 and steps[3]["reward"] == 0.0  # counted, at the minimum
    evals = [r for r in rows if "eval/reward" in r]  # before the run, and after it (the service dead)
    assert evals[0]["eval/reward/http/failed_frac"] == 0.0 and evals[-1]["eval/reward/http/failed_frac"] == 1.0
    assert (run / "summary.json").exists() and time.monotonic() - began < 240


@pytest.mark.slow
def test_a_served_vlm_reward_overlaps_the_reference_pass_and_trains_as_in_process(tmp_path):
    """The tiny VLM recipe has a KL term: its reference log-prob pass runs while the served
    ``accuracy`` is computed, and the run matches the in-process one (rewards, loss, KL)."""
    def train(name, *rewards):
        args = ["train", "vlm", "vlm/counting_tiny", "train.steps=2", "train.prompts_per_step=2",
                "rollout.num_generations=4", "rollout.max_completion_length=24", "eval.num_examples=2", "eval.every=0",
                "eval.pass_k=0", "train.threads=1", f"log.output_dir={tmp_path}", f"log.run_name={name}",
                "log.progress=false", "log.tensorboard=false", "log.save_rollouts_every=0", "log.save_every=0",
                "task.rewards.format=0.5", *rewards]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (result.output[-3000:], result.exception)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "reward" in r]

    proc, url = _serve_reward("serve-reward", "accuracy", "--port", str(_free_port()))
    try:
        local = train("local", "task.rewards.accuracy=1.0")
        served = train("served", "task.rewards.http=1.0", f"task.reward_kwargs.http.url={url}")
    finally:
        _stop(proc)
    assert len(local) == len(served) == 2
    for a, b in zip(local, served):
        assert b["reward/http"] == a["reward/accuracy"] and b["reward"] == a["reward"]
        assert b["reward/http/unparsable_frac"] == a["reward/accuracy/unparsable_frac"]
        assert b["loss"] == a["loss"] and b["kl"] == a["kl"] and b["reward/http/failed_frac"] == 0.0


@pytest.mark.slow
def test_a_service_that_does_not_answer_at_setup_is_warned_about(served, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="mmrl"):
        RewardComputer({"http": 1.0}, {"http": {"url": f"http://127.0.0.1:{_free_port()}"}})
    assert "does not answer GET /health" in caplog.text
    caplog.clear()
    server = served("composition", token="s3cret")
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        RewardComputer({"http": 1.0}, {"http": {"url": server.url}})
    assert "refuses the token" in caplog.text
