"""Two processes on this CPU (torchrun, gloo; accelerate's DDP, FSDP2 with the weights sharded,
with and without CPU offload, and DeepSpeed ZeRO-2 / ZeRO-3 on DeepSpeed's CPU accelerator)
against one, through tests/dist_worker.py:

- one optimizer step on the same global batch (a VLM, whole groups per rank, two loss terms per
  rank): the same loss, gradients and updated weights, with DDP, FSDP2 (also offloaded) and
  DeepSpeed (compared through the gradient norm: its gradients exist only inside its step); the
  checkpoint loads back and the step taken again from it is bit for bit; DeepSpeed's checkpoint
  and one process's cross both ways;
- a generator run (its noise is keyed by example index, so the 2-process run samples exactly what
  one process does): the same step metrics, eval metrics and weights, DDP, FSDP2 and ZeRO-3 with
  offload; the ranks' prompts and noise differ; per-rank seeds make the same prompt sample
  differently on each rank;
- a 2-process run killed (rank 1 exits abruptly at step 3) and resumed continues exactly (a
  generator under DDP, a VLM under FSDP2, whose checkpoint one unsharded process also resumes);
- a step of GUI episodes (scripted, so each rank acts as one process does): the same per-row
  GiGPO advantages and episode metrics, read from the episode keys gathered across ranks;
- a rank raising an error ends both processes with its message; a hung collective times out.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from fork_server import Child, ForkServer, rank_env
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("dist_worker.py")
pytestmark = pytest.mark.slow


def launch(nproc: int, *args, env: dict | None = None, check: bool = True, torchrun: bool = False) -> subprocess.CompletedProcess:
    """``dist_worker.py args`` in ``nproc`` processes (1: a plain process, no launcher)."""
    return launch_together((nproc, args, env), check=check, torchrun=torchrun)[0]


def launch_together(*launches: tuple[int, tuple, dict | None], check: bool = True, torchrun: bool = False,
                    module: str = "", cwd: str = "") -> list[subprocess.CompletedProcess]:
    """Independent :func:`launch` calls ``(nproc, args, env)`` run at the same time: every worker
    takes one thread (dist_worker.py), so a one-process run alone leaves a core idle. Each run's
    results are its own (no run reads another's files). The ranks are forked from the session's
    :class:`fork_server.ForkServer` with the environment torchrun gives them (a failed rank ends
    its peers, as torchrun's agent does); ``torchrun=True`` runs ``torch.distributed.run`` itself,
    for the tests of what its agent reports. ``module``: ``python -m module args`` instead of the
    worker script, in directory ``cwd``."""
    if torchrun:
        return _torchrun_together(launches, check)
    outs, children, groups = [], [], []
    logs = Path(tempfile.mkdtemp(prefix="mmrl-dist-"))
    try:
        for i, (nproc, args, env) in enumerate(launches):
            port = _free_port()
            ranks = []
            for rank in range(nproc):
                ranks.append(len(children))
                children.append(Child(str(WORKER), list(map(str, args)), str(logs / f"{i}-{rank}.out"),
                                      str(logs / f"{i}-{rank}.err"), {**os.environ, **(env or {}), **rank_env(rank, nproc, port)},
                                      group=i, module=module, cwd=str(cwd)))
            groups.append(ranks)
        codes = _server().run(children, timeout=300)
        for ranks, (nproc, args, _) in zip(groups, launches):
            code = next((codes[r] for r in ranks if codes[r] != 0), 0)
            read = lambda path: Path(path).read_text(errors="replace") if Path(path).exists() else ""  # noqa: E731
            stdout = "".join(read(children[r].log) for r in ranks)
            stderr = "".join(read(children[r].err) for r in ranks)
            out = subprocess.CompletedProcess([str(WORKER), *map(str, args)], code, stdout, stderr)
            if check:
                assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
            outs.append(out)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    return outs


_SERVER: list[ForkServer] = []  # the session's, started at the first launch


def _server() -> ForkServer:
    if not _SERVER or _SERVER[0].proc.poll() is not None:
        _SERVER[:] = [ForkServer()]
        atexit.register(_SERVER[0].kill)
    return _SERVER[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun_together(launches, check: bool) -> list[subprocess.CompletedProcess]:
    procs = []
    for nproc, args, env in launches:
        cmd = [sys.executable, str(WORKER), *map(str, args)]
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *cmd[1:]]
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            env={**os.environ, **(env or {})})))
    outs = []
    for cmd, proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for _, other in procs:
                other.kill()
            raise
        out = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
        if check:
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
        outs.append(out)
    return outs


def train_rows(run: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "reward" in r}


def eval_rows(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval/reward" in r]


def weights(run: Path, name: str = "latest") -> dict[str, torch.Tensor]:
    root = run / "checkpoints"
    name = (root / "latest").read_text().strip() if name == "latest" else name
    return load_file(str(next((root / name / "policy" / "transformer").glob("*.safetensors"))))


def assert_rows_close(a: dict, b: dict, tol: float) -> None:
    for key, value in a.items():
        if "time" in key or not isinstance(value, float):
            continue
        assert abs(value - b[key]) <= tol * max(1.0, abs(value)), (key, value, b[key])


# What ``accelerate launch --config_file configs/accelerate/fsdp2.yaml`` exports (fp32 here, so
# the sharded step can be compared with one process to float tolerance).
FSDP2 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
         "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}


# configs/accelerate/fsdp2_offload.yaml: the shards in CPU memory (FSDP2's CPUOffloadPolicy)
FSDP2_OFFLOAD = {**FSDP2, "FSDP_OFFLOAD_PARAMS": "true"}
LAUNCH_ENV = {"MULTI_CPU": None, "FSDP2": FSDP2, "FSDP2 (CPU offload)": FSDP2_OFFLOAD}

LORA = ("model.lora.enabled=true", "model.lora.dropout=0")  # no dropout: the ranks' draws differ from one process's


@pytest.fixture(scope="module")
def one_process_step(random_tiny_dir, tmp_path_factory):
    """One process's step, full fine-tuning and LoRA."""
    out = tmp_path_factory.mktemp("dist-step")
    launch_together((1, ("step", random_tiny_dir, out / "full.pt"), None),
                    (1, ("step", random_tiny_dir, out / "lora.pt", *LORA), None))
    return {kind: {**torch.load(out / f"{kind}.pt", weights_only=False), "checkpoint": out / f"{kind}.pt.checkpoint"}
            for kind in ("full", "lora")}


@pytest.mark.parametrize("backend, kind", [("MULTI_CPU", "full"), ("FSDP2", "full"), ("FSDP2", "lora"),
                                           ("FSDP2 (CPU offload)", "full")])
def test_two_process_step_equals_one_process(backend, kind, random_tiny_dir, one_process_step, tmp_path):
    """DDP (accelerate's MULTI_CPU on gloo), FSDP2 (weights sharded over the two ranks, gathered
    for the rollout; full fine-tuning and LoRA) and FSDP2 with its shards offloaded to CPU memory:
    one step on the same global batch as one process; its checkpoint, saved and loaded back after
    another step, restores the weights, and that step taken again from it (the optimizer state
    loaded too) gives the same weights bit for bit."""
    extra = LORA if kind == "lora" else ()
    launch(2, "step", random_tiny_dir, tmp_path / "two.pt", *extra, env=LAUNCH_ENV[backend])
    one, two = one_process_step[kind], torch.load(tmp_path / "two.pt", weights_only=False)
    assert (one["world"], two["world"], two["backend"]) == (1, 2, backend)
    for run in (one, two):
        assert any(not torch.equal(w, run["moved"][n]) for n, w in run["weights"].items())
        assert all(torch.equal(w, run["reloaded"][n]) for n, w in run["weights"].items())
        assert all(torch.equal(w, run["resumed"][n]) for n, w in run["moved"].items())
    for key in ("loss", "pg_loss", "grad_norm", "ratio_mean"):
        assert abs(one["metrics"][key] - two["metrics"][key]) < 2e-6, key
    assert one["grads"].keys() == two["grads"].keys() and one["grads"]
    for name, g in one["grads"].items():
        assert torch.allclose(g, two["grads"][name], atol=1e-7, rtol=1e-5), name
    for name, w in one["weights"].items():
        assert torch.allclose(w, two["weights"][name], atol=1e-5, rtol=0), name
    # per-rank seeds: the same prompt, sampled under each rank's seed, gives different completions
    rank0, rank1 = two["samples"]
    assert rank0 != rank1


# What ``accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml`` (zero2_offload.yaml)
# exports, in float32 here so the step can be compared with one process to float tolerance.
ZERO2 = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "ACCELERATE_MIXED_PRECISION": "no",
         "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "1", "ACCELERATE_GRADIENT_CLIPPING": "1.0",
         "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none"}
ZERO2_OFFLOAD = {**ZERO2, "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"}
# configs/accelerate/zero3_offload.yaml's settings (optimizer and parameters in CPU memory) as a
# DeepSpeed config file, with every parameter partitioned: the tiny model's are all smaller than
# DeepSpeed's default persistence threshold (1e5 elements), under which a parameter stays whole.
ZERO3_OFFLOAD = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                       "offload_param": {"device": "cpu"}, "stage3_param_persistence_threshold": 0},
                 "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "train_micro_batch_size_per_gpu": 1}


def zero_launch(backend: str, tmp_path: Path) -> dict:
    """The environment of a DeepSpeed launch named as its run banner names it."""
    if "ZeRO-3" not in backend:
        return ZERO2_OFFLOAD if "offload" in backend else ZERO2
    config = tmp_path / "zero3_offload.json"
    config.write_text(json.dumps(ZERO3_OFFLOAD))
    return {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(config),
            "ACCELERATE_MIXED_PRECISION": "no"}


@pytest.mark.parametrize("backend", ["DeepSpeed ZeRO-2", "DeepSpeed ZeRO-2 (optimizer offloaded to CPU)",
                                     "DeepSpeed ZeRO-3 (optimizer and parameters offloaded to CPU)"])
def test_deepspeed_step_equals_one_process_and_checkpoints_cross(backend, random_tiny_dir, one_process_step,
                                                                 tmp_path):
    """DeepSpeed on CPU (its CPU accelerator, gloo), mmrl's AdamW kept: ZeRO-2 with the optimizer
    state in the process or offloaded to CPU memory, and ZeRO-3 with the optimizer state and the
    weights offloaded (whole for the rollouts, partitioned for training). One step on the same
    global batch gives one process's loss, gradient norm and weights (DeepSpeed holds the gradients
    only inside its step, so they are compared through the norm and the update). Its checkpoint
    (float32 masters and optimizer state gathered by name) loads back; the step taken again from it
    is bit for bit; a fresh DeepSpeed run resumes one process's checkpoint (the state created, then
    written) and steps as that process did; one process loads the DeepSpeed checkpoint with the
    state it held."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the fit extra")
    env = zero_launch(backend, tmp_path)
    one = one_process_step["full"]
    launch_together((2, ("step", random_tiny_dir, tmp_path / "two.pt"), env),
                    (2, ("resume", random_tiny_dir, one["checkpoint"], tmp_path / "from_one.pt"), env))
    two = torch.load(tmp_path / "two.pt", weights_only=False)
    assert (two["world"], two["backend"]) == (2, backend)
    for key in ("loss", "pg_loss", "grad_norm", "ratio_mean"):
        assert abs(one["metrics"][key] - two["metrics"][key]) < 2e-6, key
    for name, w in one["weights"].items():
        assert torch.allclose(w, two["weights"][name], atol=1e-5, rtol=0), name
    assert any(not torch.equal(w, two["moved"][n]) for n, w in two["weights"].items())
    assert all(torch.equal(w, two["reloaded"][n]) for n, w in two["weights"].items())
    assert all(torch.equal(w, two["resumed"][n]) for n, w in two["moved"].items())
    rank0, rank1 = two["samples"]
    assert rank0 != rank1
    # a fresh DeepSpeed run from one process's checkpoint takes one process's second step
    from_one = torch.load(tmp_path / "from_one.pt", weights_only=False)
    assert from_one["backend"] == backend
    for name, w in one["moved"].items():
        assert torch.allclose(w, from_one["weights"][name], atol=1e-5, rtol=0), name
    # one process loads the DeepSpeed checkpoint: the weights and the optimizer state it held
    from mmrl.core import sharding

    checkpoint = tmp_path / "two.pt.checkpoint"
    saved = torch.load(checkpoint / "optimizer.pt", weights_only=False)
    assert saved["by_name"]
    policy = random_tiny_policy(random_tiny_dir)
    policy.load(checkpoint)
    assert all(torch.equal(p.detach(), two["weights"][n]) for n, p in policy.model.named_parameters())
    mine = sharding.full_optimizer_state(policy.module, policy.strategy.inner_optimizer)
    assert mine["state"].keys() == saved["optimizer"]["state"].keys() and mine["state"]
    for name, state in saved["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, mine["state"][name][key]), (name, key)


def test_a_nan_loss_on_one_rank_skips_the_zero2_update_as_one_process_skips_it(tmp_path):
    """Under ZeRO-2 the gradients live in DeepSpeed's partitions (``p.grad`` is None) and the
    engine's step judges them (mmrl/core/zero.py): a 2-step tiny VLM run whose last rank's loss is
    NaN at step 2 (tests/dist_worker.py's NAN_AT_STEP) records what one process's run with a NaN
    loss at step 2 records: ``skipped_update`` 0 then 1, the step in skipped_steps.jsonl with the
    loss named as its cause, and step 2's checkpoint holding step 1's weights."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the fit extra")
    one, two = tmp_path / "one", tmp_path / "two"
    out = launch_together((1, ("vlm_run", "tiny", one, 2), {"NAN_AT_STEP": "2"}),
                          (2, ("vlm_run", "tiny", two, 2), {**ZERO2, "NAN_AT_STEP": "2"}))[1]
    assert "mmrl: 2 processes, DeepSpeed ZeRO-2" in out.stdout
    records = []
    for run in (one, two):
        rows = train_rows(run)
        assert [rows[step]["skipped_update"] for step in (1, 2)] == [0.0, 1.0], run
        assert rows[1]["grad_norm"] > 0 and rows[2]["grad_norm"] is None, run  # NaN, written as null
        records.append([json.loads(line) for line in (run / "skipped_steps.jsonl").read_text().splitlines()])
        step1, step2 = (vlm_weights(run, f"step_{k:08d}") for k in (1, 2))
        assert step1.keys() == step2.keys() and all(torch.equal(w, step2[k]) for k, w in step1.items()), run
    assert records[0] == records[1] and [r["step"] for r in records[0]] == [2]
    assert set(records[0][0]["causes"]) == {"the loss is nan"}


def random_tiny_policy(vlm_dir: Path):
    """tests/dist_worker.py step's policy in this process (one process, optimizer configured)."""
    from mmrl.config import load_config
    from mmrl.vlm.policy import VLMPolicy

    cfg = load_config(None, [f"model.path={vlm_dir}", "train.device=cpu", "rollout.num_generations=2",
                             "rollout.max_completion_length=8", "train.micro_batch_size=1",
                             "train.learning_rate=1e-3", "rollout.temperature=1.0"])
    policy = VLMPolicy(cfg)
    policy.configure_optimizer(cfg.train, 10)
    return policy


def test_batch_wide_token_selections_are_those_of_the_global_mini_batch(random_tiny_dir, tmp_path):
    """Top-entropy tokens, Clip-Cov and KL-Cov chosen on the whole mini-batch across ranks: one
    DDP step with them equals one process (a per-rank choice would give each rank its own entropy
    threshold and covariance means, and another loss)."""
    extra = ("algo.top_entropy_quantile=0.3", "algo.kl_cov_ratio=0.2", "algo.kl_cov_coef=1.0",
             "algo.advantage=grpo")
    launch_together((1, ("step", random_tiny_dir, tmp_path / "one.pt", *extra), None),
                    (2, ("step", random_tiny_dir, tmp_path / "two.pt", *extra), None))
    one = torch.load(tmp_path / "one.pt", weights_only=False)
    two = torch.load(tmp_path / "two.pt", weights_only=False)
    for key in ("loss", "pg_loss", "grad_norm"):
        assert abs(one["metrics"][key] - two["metrics"][key]) < 1e-6, (key, one["metrics"][key], two["metrics"][key])
    for name, g in one["grads"].items():
        assert torch.allclose(g, two["grads"][name], atol=1e-7, rtol=1e-5), name


@pytest.fixture(scope="module")
def flow_dir(tiny_flow_dir):
    """The session's tiny generator (diffusion_fixtures.tiny_flow_dir), built once for every test
    that uses it."""
    return tiny_flow_dir


@pytest.fixture(scope="module")
def generator_runs(flow_dir, tmp_path_factory):
    """The same 4-step generator run on 1 and on 2 processes, made at the same time (reused by the
    equality and the resume tests)."""
    one, two = tmp_path_factory.mktemp("dist-runs") / "one", tmp_path_factory.mktemp("dist-runs") / "two"
    launch_together((1, ("run", flow_dir, one, 4), None), (2, ("run", flow_dir, two, 4), None))
    return {"one": one, "two": two}


@pytest.fixture(scope="module")
def two_process_run(generator_runs):
    """A 4-step generator run on 2 processes."""
    return generator_runs["two"]


@pytest.fixture(scope="module")
def one_process_run(generator_runs):
    return generator_runs["one"]


GENERATOR_ZERO3 = "DeepSpeed ZeRO-3 (optimizer and parameters offloaded to CPU)"


@pytest.mark.parametrize("backend", ["MULTI_CPU", "FSDP2", GENERATOR_ZERO3])
def test_generator_run_on_two_processes_equals_one(backend, flow_dir, two_process_run, one_process_run, tmp_path):
    """DDP, FSDP2 and ZeRO-3 with offload (its two phases: whole weights for the sampler's
    rollouts and evaluation, partitioned for the per-timestep backwards)."""
    one = one_process_run
    if backend != "MULTI_CPU":
        if backend == GENERATOR_ZERO3:
            pytest.importorskip("deepspeed", reason="DeepSpeed is in the fit extra")
        two_process_run = tmp_path / "sharded"
        env = FSDP2 if backend == "FSDP2" else zero_launch(backend, tmp_path)
        out = launch(2, "run", flow_dir, two_process_run, 4, env=env)
        assert f"mmrl: 2 processes, {backend}" in out.stdout
    a, b = train_rows(one), train_rows(two_process_run)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:  # rewards, reward std, advantages' effect (loss), grad norm, group stats
        assert_rows_close(a[step], b[step], 1e-4)
    for ra, rb in zip(eval_rows(one), eval_rows(two_process_run), strict=True):
        assert_rows_close(ra, rb, 1e-5)
    # Weights: equal up to Adam's normalisation of near-zero gradients (float-order noise in a
    # 1e-9 gradient can flip its step), so at most a few learning-rate units apart (lr 1e-3),
    # while training moved them by far more.
    wa, wb, w0 = weights(one), weights(two_process_run), weights(one, "step_00000002")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-3
    assert max((wa[k] - w0[k]).abs().max().item() for k in wa) > 1e-3
    # each rank rolled out its own prompts, with its own noise
    (idx0, noise0), (idx1, noise1) = torch.load(two_process_run / "step1_samples.pt", weights_only=False)
    assert not set(idx0) & set(idx1)
    assert (noise0[:, None] - noise1[None]).abs().flatten(2).amax(-1).min() > 0.1


def test_killed_two_process_run_resumes_exactly(flow_dir, two_process_run, tmp_path):
    run = tmp_path / "killed"
    out = launch(2, "run", flow_dir, run, 4, env={"DIE_AT_STEP": "3"}, check=False)
    assert out.returncode != 0
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    launch(2, "run", flow_dir, run, 4, "resume=true")
    a, b = train_rows(two_process_run), train_rows(run)
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "reward" in r] == [1, 2, 3, 4]
    for step in (3, 4):
        assert_rows_close(a[step], b[step], 0.0)  # bit for bit
    wa, wb = weights(two_process_run), weights(run)
    for name, w in wa.items():
        assert torch.equal(w, wb[name]), name


def test_killed_fsdp2_vlm_run_resumes_exactly_and_in_one_process(tmp_path):
    """FSDP2 checkpoints are consolidated (weights and optimizer state gathered, keyed by name):
    a sharded run killed at step 3 resumes from step 2 bit for bit, one unsharded process resumes
    the same checkpoint with the optimizer state it held, and a sharded run resumes the unsharded
    process's checkpoint."""
    full, killed = tmp_path / "full", tmp_path / "killed"
    out = launch(2, "vlm_run", "tiny", full, 4, env=FSDP2)
    assert "mmrl: 2 processes, FSDP2" in out.stdout
    rows = train_rows(full)
    assert sorted(rows) == [1, 2, 3, 4] and all(r["grad_norm"] > 0 for r in rows.values())
    assert launch(2, "vlm_run", "tiny", killed, 4, env={**FSDP2, "DIE_AT_STEP": "3"}, check=False).returncode
    assert (killed / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    single, step2 = tmp_path / "single", tmp_path / "step2"
    shutil.copytree(killed, single)
    shutil.copytree(killed / "checkpoints" / "step_00000002" / "policy", step2)  # runs keep their last two
    # the sharded resume, and one process (not sharded) resuming a copy, at the same time
    launch_together((2, ("vlm_run", "tiny", killed, 4, "resume=true"), FSDP2),
                    (1, ("vlm_run", "tiny", single, 4, "resume=true"), None))
    for step in (3, 4):
        assert_rows_close(rows[step], train_rows(killed)[step], 0.0)  # bit for bit
    wa, wb = vlm_weights(full), vlm_weights(killed)
    assert wa.keys() == wb.keys() and all(torch.equal(w, wb[k]) for k, w in wa.items())

    assert sorted(train_rows(single)) == [1, 2, 3, 4]
    # and back: the unsharded checkpoint (optimizer state numbered, not named) resumed sharded
    launch(2, "vlm_run", "tiny", single, 5, "resume=true", "allow_config_change=true", env=FSDP2)
    assert sorted(train_rows(single)) == [1, 2, 3, 4, 5]
    from mmrl.core import sharding

    saved = torch.load(step2 / "optimizer.pt", weights_only=False)
    assert saved["by_name"]
    policy = one_process_policy(step2)
    mine = sharding.full_optimizer_state(policy.module, policy.strategy.inner_optimizer)
    assert mine["state"].keys() == saved["optimizer"]["state"].keys()
    for name, state in saved["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, mine["state"][name][key]), (name, key)


def vlm_weights(run: Path, name: str = "latest") -> dict[str, torch.Tensor]:
    root = run / "checkpoints"
    name = (root / "latest").read_text().strip() if name == "latest" else name
    return load_file(str(root / name / "policy" / "model" / "model.safetensors"))


def one_process_policy(checkpoint: Path):
    """The counting recipe's policy in this process, its optimizer state read from ``checkpoint``."""
    from mmrl.config import builtin_config_path, load_config
    from mmrl.vlm.policy import VLMPolicy

    cfg = load_config(builtin_config_path("vlm/counting_tiny"), ["train.device=cpu"])
    policy = VLMPolicy(cfg)
    policy.configure_optimizer(cfg.train, 4)
    policy.load(checkpoint)
    return policy


def test_episode_advantages_and_metrics_on_two_processes_equal_one(tmp_path):
    """4 goals x 4 episodes of the toy buttons (tests/dist_worker.py episodes), GiGPO (episode
    ids, steps and anchor states: every episode input) through the batch builder: each of 2 ranks
    rolls out 2 goals and computes the advantages on the gathered batch, which must carry the
    episode keys. Every row's advantage (keyed by task, place in its group and turn) and every step
    metric equal one process's; before the episode keys crossed ranks, GiGPO stopped for want of
    them and ``episode_grpo`` fell back to per-row GRPO with no episode metrics."""
    launch_together((1, ("episodes", "gigpo", tmp_path / "one.pt"), None),
                    (2, ("episodes", "gigpo", tmp_path / "two.pt"), None))
    one, two = (torch.load(tmp_path / f"{n}.pt", weights_only=False) for n in ("one", "two"))
    assert (one["world"], two["world"]) == (1, 2)
    assert len(one["advantages"]) == 28  # 4 goals x (1 + 2 + 2 + 2 steps)
    assert one["advantages"].keys() == two["advantages"].keys()
    for row, value in one["advantages"].items():
        assert abs(value - two["advantages"][row]) < 1e-6, row
    assert len({round(v, 6) for v in one["advantages"].values()}) > 2  # not all alike
    assert one["metrics"]["episode/invalid_actions"] == 4 / 28 and one["metrics"]["episode/return"] == 0.375
    assert one["metrics"].keys() == two["metrics"].keys()
    for key, value in one["metrics"].items():
        if not key.endswith("_time"):  # wall times (reward_wait_time) differ by nature
            assert abs(value - two["metrics"][key]) < 1e-6, key


def test_a_rank_error_ends_every_process_with_its_message():
    t0 = time.monotonic()
    out = launch(2, "error", check=False, torchrun=True)
    assert out.returncode != 0
    # the launcher's report names the failing rank and shows its traceback
    report = (out.stdout + out.stderr).split("Root Cause")[-1]
    assert "rank      : 1" in report and "RuntimeError: boom from rank 1" in report
    assert time.monotonic() - t0 < 120  # rank 0, waiting in a barrier, was stopped by the launcher


def test_a_hung_collective_times_out_naming_the_rank_that_stalled():
    """After a barrier together, rank 1 never joins rank 0's gather (distributed_timeout 5 s here):
    half-way a warning, then an error on rank 0 naming rank 1 and where each of them is."""
    out = launch(2, "hang", check=False, torchrun=True)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert re.search(r"rank 0 has waited \d s in collective #2 \(gather at tests/dist_worker.py:\d+ \(hang\)\): "
                     r"rank 1 has not reached it", text)
    report = text.split("Root Cause")[-1]
    assert "rank      : 0" in report and "CollectiveTimeoutError" in report
    assert "collective #2 (gather at tests/dist_worker.py:" in report
    assert "rank 1 has not reached it (its last was collective #1 (barrier at tests/dist_worker.py:" in report
