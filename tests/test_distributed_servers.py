"""Two training processes (torchrun, gloo, DDP on this CPU) with the rollout server engine
(``rollout.engine=vllm_server``), on-policy and asynchronous, against one process, through
tests/dist_worker.py's ``vlm_run`` (the counting recipe, 4 prompts x 4 samples a step).

The servers are tests/vllm_standin.py's stand-ins (this environment has no vLLM; the real server
runs in tests/test_vllm_server.py): each samples and scores with its own copy of the weights,
replaced only by the weight pushes, and draws a prompt's samples from a seed of the prompt itself,
so that a prompt rolled out by either rank draws what one process draws.

- on-policy: each step's metrics and the final weights equal one process's; one push per optimizer
  step reaches the server (rank 0's alone: counted by the server's reloads) and the trainer's
  log-probs equal the server's at every step (a missed or stale push would make them differ);
  each rank's requests are counted and summed over ranks;
- asynchronous, k = 1: the same against one process, and a 2-process run killed at step 3 and
  resumed from its step-2 checkpoint (each rank's batches generated ahead kept in its own file)
  continues bit for bit;
- a weight push refused on rank 0 ends both processes with its message, not a hang.
"""

from __future__ import annotations

import time

import pytest
import torch

from test_distributed import assert_rows_close, launch, launch_together, train_rows, vlm_weights
from vllm_standin import StandIn

pytestmark = pytest.mark.slow

RECIPE = "vlm/counting_tiny"
SHORT = ("rollout.max_completion_length=24",)  # the stand-in must sample with the trainer's settings
ASYNC = ("train.async_rollouts=true", "train.max_staleness=1")


def standin(fail_reload: str | None = None) -> StandIn:
    return StandIn(RECIPE, "model.path=tiny", *SHORT, fail_reload=fail_reload)


def engine(server: StandIn) -> tuple[str, ...]:
    return ("rollout.engine=vllm_server", f"rollout.server_urls=[{server.url}]", *SHORT)


def run_pair(out, steps: int, *extra: str) -> dict:
    """The same run on 1 and on 2 processes, at the same time, each against its own stand-in:
    ``{"one": (run_dir, server), "two": ...}``."""
    servers = {name: standin() for name in ("one", "two")}
    try:
        launch_together(*((n, ("vlm_run", "tiny", out / name, steps, *engine(servers[name]), *extra), None)
                          for n, name in ((1, "one"), (2, "two"))))
    finally:
        for server in servers.values():
            server.close()
    return {name: (out / name, server) for name, server in servers.items()}


def assert_runs_equal(one, two, steps: int) -> None:
    a, b = train_rows(one), train_rows(two)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    for step in a:
        assert_rows_close(a[step], b[step], 1e-4)
    assert all(a[step]["grad_norm"] > 0 for step in a)  # the rewards varied: every step trained
    wa, wb, w2 = vlm_weights(one), vlm_weights(two), vlm_weights(one, f"step_{steps - 1:08d}")
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-4
    assert max((wa[k] - w2[k]).abs().max().item() for k in wa) > 1e-4  # the last step alone moved them further


@pytest.fixture(scope="module")
def on_policy(tmp_path_factory):
    return run_pair(tmp_path_factory.mktemp("servers-sync"), 3)


def test_two_processes_with_servers_equal_one_and_push_once_per_step(on_policy):
    (one, s1), (two, s2) = on_policy["one"], on_policy["two"]
    assert_runs_equal(one, two, 3)
    # pushes: before the evaluation before training, after steps 1 and 2 (before the next rollout),
    # after step 3 (before the evaluation after it): 4, made by rank 0 alone (2 ranks each pushing: 8)
    assert len(s1.reloads) == len(s2.reloads) == 4
    assert len(set(s2.reloads)) == 4  # a new directory each time
    for run in (one, two):
        rows = train_rows(run)
        # step 1 reports the push made for the evaluation before it; each later step its own
        assert [rows[s]["rollout/weight_pushes"] for s in (1, 2, 3)] == [1.0, 1.0, 1.0], run
        # every rank's requests (one per prompt: 4 a step, and step 1 also the 4 of the evaluation
        # before it), summed over ranks
        assert [rows[s]["rollout/server_requests"] for s in (1, 2, 3)] == [8.0, 4.0, 4.0], run
        assert all(rows[s]["rollout/server_retries"] == 0.0 for s in rows), run
        # the server's log-probs are the trainer's: it held the step's weights when it sampled
        assert all(abs(rows[s]["rollout_is_ratio"] - 1.0) < 1e-5 for s in rows), [r["rollout_is_ratio"] for r in rows.values()]
    assert s2.hits["/v1/chat/completions"] == s1.hits["/v1/chat/completions"]


@pytest.fixture(scope="module")
def asynchronous(tmp_path_factory):
    return run_pair(tmp_path_factory.mktemp("servers-async"), 4, *ASYNC)


def test_async_two_processes_with_servers_equal_one(asynchronous):
    (one, s1), (two, s2) = asynchronous["one"], asynchronous["two"]
    assert_runs_equal(one, two, 4)
    for run in (one, two):
        rows = train_rows(run)
        assert [rows[s]["async/staleness"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 1.0, 1.0], run
        # one push per publish, rank 0's alone, reported by the next batch built: step 1's batch the
        # push before the evaluation, step 2's none (built before the first publish), then one each
        assert [rows[s]["rollout/weight_pushes"] for s in (1, 2, 3, 4)] == [1.0, 0.0, 1.0, 1.0], run
    assert len(s1.reloads) == len(s2.reloads)


def test_async_two_process_run_killed_resumes_exactly(asynchronous, tmp_path):
    full = asynchronous["two"][0]
    run = tmp_path / "killed"
    server = standin()
    try:
        out = launch(2, "vlm_run", "tiny", run, 4, *engine(server), *ASYNC, env={"DIE_AT_STEP": "3"}, check=False)
        assert out.returncode != 0
        assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
        step2 = run / "checkpoints" / "step_00000002"
        pending = [torch.load(step2 / f"rank{r:05d}.pt", weights_only=False)["async_pending"] for r in (0, 1)]
        assert [sorted(p) for p in pending] == [[3, 4], [3, 4]]  # generated ahead from versions 1 and 2
        assert all(len(p[3][0]) == 8 for p in pending)  # each rank's own share: 2 prompts x 4 samples
        launch(2, "vlm_run", "tiny", run, 4, *engine(server), *ASYNC, "resume=true")
    finally:
        server.close()
    a, b = train_rows(full), train_rows(run)
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        assert_rows_close(a[step], b[step], 0.0)  # bit for bit
    wa, wb = vlm_weights(full), vlm_weights(run)
    assert wa.keys() == wb.keys() and all(torch.equal(w, wb[k]) for k, w in wa.items())


def test_a_push_refused_on_rank_0_ends_both_processes_with_its_message(tmp_path):
    server = standin(fail_reload="reload refused by the test server")
    t0 = time.monotonic()
    try:
        out = launch(2, "vlm_run", "tiny", tmp_path / "run", 2, *engine(server), check=False)
    finally:
        server.close()
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "HTTP 400" in text and "reload refused by the test server" in text  # rank 0's own error
    assert "rank 0's weight push to the rollout servers failed: ServerError" in text  # rank 1's
    assert time.monotonic() - t0 < 240  # two processes start (about a minute on a loaded 2-core machine), then stop at once
