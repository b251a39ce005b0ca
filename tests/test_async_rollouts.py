"""Asynchronous training (``train.async_rollouts``, ``train.max_staleness``): the schedule (which
weights version makes each step's batch), the staleness bookkeeping, k=0 as the on-policy loop bit
for bit, and exact resume with the batches generated ahead kept in the checkpoint.

The runs here use a test engine that generates with transformers from a snapshot of the policy's
weights taken at each push (a stand-in for a vLLM server's own copy, which needs the vLLM
environment: tests/test_vllm_server.py runs the real one)."""

from __future__ import annotations

import copy
import shutil
import threading

import pytest
import torch

from conftest import tiny_run_overrides
from mmrl.core.async_rollouts import RolloutsAhead, batch_version, stale_groups, staleness_metrics
from mmrl.core.rollouts import Rollouts
from mmrl.registry import ENGINES, register_engine
from mmrl.vlm.engines import HFGenerate, RolloutEngine


class _WithModule:
    """The policy as an engine sees it, with ``module`` replaced by a snapshot."""

    def __init__(self, policy, module):
        self._policy, self.module = policy, module

    def __getattr__(self, name):
        return getattr(self._policy, name)


class SnapshotEngine(RolloutEngine):
    """HF generation from its own copy of the weights, refreshed only by ``push_weights``."""

    concurrent = True

    def __init__(self, policy):
        super().__init__(policy)
        self.hf = None
        self.pushes = 0

    def sync_weights(self):
        self.hf = None

    def push_weights(self):
        self.hf = HFGenerate(_WithModule(self.policy, copy.deepcopy(self.policy.module)))
        self.pushes += 1

    def generate(self, prompts, sampling):
        if self.hf is None:
            self.push_weights()
        return self.hf.generate(prompts, sampling)


try:
    ENGINES.get("test_snapshot")
except KeyError:
    register_engine("test_snapshot")(SnapshotEngine)


# -- the bookkeeping, hand-worked ------------------------------------------------------------------
def test_each_batch_comes_from_the_weights_k_steps_back():
    # k=1: steps 1, 2 from the initial weights (version 0), step s from version s - 2
    assert [batch_version(s, 1) for s in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [batch_version(s, 2) for s in range(1, 6)] == [0, 0, 0, 1, 2]
    # a launch resumed after step 4 starts from version 4: steps 5 and 6 (k=1) both from it
    assert [batch_version(s, 1, base=4) for s in (5, 6, 7)] == [4, 4, 5]


def test_samples_of_a_group_older_than_k_versions_are_dropped_together():
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    versions = torch.tensor([4, 4, 3, 3, 4, 3])  # group 2 mixes versions: its oldest sample decides
    assert stale_groups(groups, versions, current=5, k=1).tolist() == [False, False, True, True, True, True]
    assert not stale_groups(groups, versions, current=5, k=2).any()
    kept = torch.tensor([4, 4])
    assert staleness_metrics(kept, 5, dropped=4) == {"async/staleness": 1.0, "async/staleness_max": 1.0,
                                                     "async/dropped_stale": 4.0}


def _batch(n=2):
    return Rollouts(group_ids=torch.arange(n), action_mask=torch.ones(n, 1))


@pytest.mark.parametrize("k", [1, 2])
def test_the_thread_generates_ahead_and_publishes_after_the_batch_k_steps_on(k):
    """The order of events of a 5-step run: step s's batch is built from version batch_version(s, k),
    and the weights after step t are published once the batch of step t + k exists."""
    events, lock = [], threading.Lock()
    state = {"version": 0}

    def build(step):
        with lock:
            events.append(("build", step, state["version"]))
        return _batch(), {"step": float(step)}

    def publish():  # the engine now holds the weights of one more step
        with lock:
            state["version"] += 1
            events.append(("publish",))

    ahead = RolloutsAhead(build, publish, k, start=0, last=5)
    versions = []
    for step in range(1, 6):
        batch, metrics, version, _ = ahead.take(step)
        assert metrics == {"step": float(step)} and len(batch) == 2
        versions.append(int(version[0]))
        ahead.publish(step)
    ahead.close()
    assert versions == [batch_version(s, k) for s in range(1, 6)]
    # a build of step s never starts before the publish of version s - 1 - k ...
    built = [e for e in events if e[0] == "build"]
    assert [e[1] for e in built] == [1, 2, 3, 4, 5]
    assert [e[2] for e in built] == versions
    # ... and the publish of version t comes after the build of step t + k
    for t in range(1, 6):
        publish_at = [i for i, e in enumerate(events) if e[0] == "publish"][t - 1]
        build_at = next(i for i, e in enumerate(events) if e[0] == "build" and e[1] == min(t + k, 5))
        assert build_at < publish_at


def test_a_pause_waits_until_every_batch_the_published_weights_allow_is_built():
    """The training thread pauses the generator (to evaluate, to checkpoint) at the same point of
    the schedule on every rank: k=1, the initial weights allow steps 1 and 2; after the weights of
    step 1 are published, step 3. (Pausing in the middle of a batch could wait for it while its
    gathers wait for another rank's thread, itself paused.)"""
    import time

    def build(step):
        time.sleep(0.05)
        return _batch(), {}

    ahead = RolloutsAhead(build, lambda: None, 1, start=0, last=5)
    with ahead.paused():
        assert ahead.next == 3
    ahead.take(1)
    ahead.publish(1)
    with ahead.paused():
        assert ahead.next == 4
    ahead.close()


def test_a_failed_generation_reaches_the_training_thread():
    def build(step):
        raise ConnectionError("server http://127.0.0.1:1 refused")

    ahead = RolloutsAhead(build, lambda: None, 1, start=0, last=3)
    with pytest.raises(RuntimeError, match="rollout generation failed: server http://127.0.0.1:1 refused"):
        ahead.take(1)
    ahead.close()


# -- runs ------------------------------------------------------------------------------------------
def _run(out, steps, *extra):
    """The tiny default (the shipped warm-started model, whose rewards vary within a group), 3 prompts x 2."""
    import mmrl

    return mmrl.train(None, tiny_run_overrides("tiny", out, steps, "log.tensorboard=false", "eval.every=0",
                                               "train.learning_rate=5e-3",
                                               "rollout.max_completion_length=32", "rollout.num_generations=4",
                                               "train.lr_scheduler_type=constant", *extra)).run_dir


def _rows(run):
    import json

    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if "reward" in json.loads(line)]


def _weights(run, ckpt="step_00000004"):
    from safetensors.torch import load_file

    root = run / "checkpoints" / ckpt / "policy"
    weights = {k: v for f in sorted(root.rglob("*.safetensors")) for k, v in load_file(str(f)).items()}
    assert weights, f"no weights under {root}"
    return weights


ASYNC = ("rollout.engine=test_snapshot", "train.async_rollouts=true", "eval.every=2")  # an eval pauses the thread


@pytest.mark.slow
def test_engines_that_generate_from_the_trained_module_are_refused(tmp_path):
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match="train.async_rollouts=true needs a rollout engine that generates from its "
                                          "own copy of the weights.*rollout.engine=hf"):
        _run(tmp_path, 2, "train.async_rollouts=true")


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """4 steps of asynchronous training, k=1, a checkpoint at step 2."""
    out = tmp_path_factory.mktemp("async")
    return _run(out, 4, *ASYNC, "train.max_staleness=1")


@pytest.mark.slow
def test_max_staleness_0_is_the_on_policy_loop_bit_for_bit(async_run, tmp_path):
    plain = _run(tmp_path / "a", 2, "log.save_every=0")
    k0 = _run(tmp_path / "b", 2, "log.save_every=0", "train.async_rollouts=true", "train.max_staleness=0")
    for a, b in zip(_rows(plain), _rows(k0), strict=True):
        assert {k: v for k, v in a.items() if "time" not in k} == {k: v for k, v in b.items() if "time" not in k}
    wa, wb = _weights(plain, "step_00000002"), _weights(k0, "step_00000002")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # k=1's first step trains the same batch from the same weights: the on-policy step's numbers
    first = _rows(async_run)[0]
    assert all(first[key] == _rows(plain)[0][key] for key in ("reward", "loss", "grad_norm")), first


@pytest.mark.slow
def test_an_async_run_trains_one_step_stale_batches(async_run):
    rows = _rows(async_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # step s trains version s - 1 on the batch of version batch_version(s, 1): lags 0, 1, 1, 1
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["async/dropped_stale"] == 0.0 and r["rollout_wait_time"] >= 0.0 for r in rows)
    # the weights moved (the trained samples were not all masked out)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(async_run, "step_00000002").values(),
                                                    _weights(async_run).values()))


@pytest.mark.slow
def test_an_async_run_resumes_exactly_from_the_batches_its_checkpoint_holds(async_run, tmp_path):
    """The run's own step-2 checkpoint, the later steps removed as if killed there: resumed to 4, the
    same per-step numbers and the same weights bit for bit."""
    killed = tmp_path / "run"
    shutil.copytree(async_run, killed)
    shutil.rmtree(killed / "checkpoints" / "step_00000004")
    (killed / "summary.json").unlink()
    state = torch.load(killed / "checkpoints" / "step_00000002" / "trainer.pt", weights_only=False)
    assert sorted(state["async_pending"]) == [3, 4]  # generated ahead from versions 1 and 2
    assert [v[2] for _, v in sorted(state["async_pending"].items())] == [1, 2]
    resumed = _run(tmp_path, 4, *ASYNC, "train.max_staleness=1", "resume=true")
    a, b = _rows(async_run), _rows(resumed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a[2:], b[2:]):
        for key in ("reward", "loss", "grad_norm", "async/staleness"):
            assert ra[key] == rb[key], (ra["step"], key)
    wa, wb = _weights(async_run), _weights(resumed)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_a_resume_with_a_smaller_max_staleness_drops_the_older_batches(async_run, tmp_path, caplog):
    """Resumed with k=0 (on-policy): the two batches generated ahead are dropped with a warning."""
    killed = tmp_path / "run"
    shutil.copytree(async_run, killed)
    shutil.rmtree(killed / "checkpoints" / "step_00000004")
    (killed / "summary.json").unlink()
    with caplog.at_level("WARNING"):
        _run(tmp_path, 4, *ASYNC, "train.max_staleness=0", "resume=true", "allow_config_change=true")
    assert "holds 2 batch(es) generated ahead for steps 3, 4" in caplog.text
    assert "they are dropped and those steps roll out again" in caplog.text


@pytest.mark.slow
def test_batches_older_than_a_resumed_runs_max_staleness_are_dropped_and_counted(tmp_path):
    """Saved at step 2 with k=2, the checkpoint holds steps 3 and 4 from versions 0 and 1; resumed
    with k=1 the weights being trained are versions 2 and 3, so both batches are 2 versions old:
    each is dropped (3 prompts x 4 samples, counted) and the step rolls out on-policy instead."""
    run = _run(tmp_path / "a", 4, *ASYNC, "train.max_staleness=2")
    state = torch.load(run / "checkpoints" / "step_00000002" / "trainer.pt", weights_only=False)
    assert {s: v[2] for s, v in state["async_pending"].items()} == {3: 0, 4: 1}
    shutil.rmtree(run / "checkpoints" / "step_00000004")
    (run / "summary.json").unlink()
    resumed = _run(tmp_path / "a", 4, *ASYNC, "train.max_staleness=1", "resume=true", "allow_config_change=true")
    rows = _rows(resumed)
    assert [r["async/dropped_stale"] for r in rows] == [0.0, 0.0, 12.0, 12.0]
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.slow
def test_a_tool_task_runs_its_agent_loop_in_the_generator_thread(tmp_path):
    """The zoom tool recipe (two turns: a zoom_cell call, then the answer) trains asynchronously:
    every turn of the generator thread's trajectories goes through the engine's own weights."""
    import mmrl

    run = mmrl.train("vlm/zoom_qa_tiny", [
        *ASYNC, "train.max_staleness=1", "train.device=cpu", "train.steps=2", "train.prompts_per_step=2",
        "rollout.num_generations=2", "eval.num_examples=2", "eval.before=false", "eval.every=0",
        f"log.output_dir={tmp_path}", "log.run_name=run", "log.save_rollouts_every=0", "log.progress=false",
        "log.tensorboard=false"]).run_dir
    rows = _rows(run)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0]
    assert all(r["tool/calls"] > 0 and r["turns"] > 1.0 for r in rows), rows  # zoomed, then answered
