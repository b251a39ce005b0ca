"""Shared fixtures: a randomly initialised tiny Qwen2.5-VL built locally (no downloads)."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

# Two cores: one process uses both (one while the learning runs work in the background:
# learning_fixtures.py); under pytest-xdist (the fast lane's `-n 2`) each worker uses one.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

# The tiny generators (sd3_dir, flux_dir, wan_dir, tiny_flow_dir ...), each built once a session; the
# learning runs (learning_results), made two at a time.
pytest_plugins = ["diffusion_fixtures", "learning_fixtures"]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where torch sees a CUDA device, tests marked ``vllm`` where vLLM is
    installed (its own environment: .ci/vllm_env.sh); elsewhere they are skipped with the reason
    (never faked). vLLM is looked up, not imported (importing it takes ~15 s)."""
    import importlib.util

    skips = {"gpu": None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device"),
             "vllm": None if importlib.util.find_spec("vllm") else pytest.mark.skip(reason="needs vLLM (.ci/vllm_env.sh)")}
    for item in items:
        for marker, skip in skips.items():
            if skip is not None and item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def random_tiny_dir(tmp_path_factory):
    """An untrained tiny Qwen2.5-VL checkpoint directory (tokenizer trained on task text)."""
    from mmrl.registry import TASKS, load_plugins
    from mmrl.vlm import tiny
    from mmrl.vlm.tiny_builders import tokenizer_corpus

    load_plugins()
    tasks = [TASKS.get("counting")(), TASKS.get("grounding")()]
    tok = tiny.build_tokenizer(tokenizer_corpus(tasks, per_task=200), vocab_size=512)
    path = tmp_path_factory.mktemp("tiny-random")
    tiny.save_tiny(tiny.build_model(tok, seed=0, hidden_size=64, layers=2), tiny.build_processor(tok), path)
    return path


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory):
    """A random tiny open_clip model registered as ``mmrl-test-tiny-clip``, saved to a local file:
    ``(model name, checkpoint path)`` (skips without open_clip)."""
    import json

    open_clip = pytest.importorskip("open_clip")
    folder = tmp_path_factory.mktemp("clip")
    cfg = {"embed_dim": 16,
           "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
           "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    (folder / "mmrl-test-tiny-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder / "mmrl-test-tiny-clip.json")
    torch.manual_seed(0)
    model = open_clip.create_model("mmrl-test-tiny-clip")
    torch.save(model.state_dict(), folder / "clip.pt")
    return "mmrl-test-tiny-clip", folder / "clip.pt"


# The settings of the short `mmrl train vlm` runs made in a subprocess (resume, Ctrl-C, the demo).
CLI_RUN = ["train.device=cpu", "train.prompts_per_step=2", "rollout.num_generations=2",
           "rollout.max_completion_length=6", "eval.num_examples=2", "eval.pass_k=0", "log.progress=false"]


def mmrl_in_process(*args, cwd=None) -> subprocess.CompletedProcess:
    """``mmrl ARGS`` by the command line's own code in this process (a subprocess would spend most of
    its time importing torch), in ``cwd`` (default: the current directory), as the completed process
    it stands for: exit code, stdout, stderr. Torch's thread count, which the command sets
    (train.threads), and the working directory are put back after it. The tests of the process
    boundary itself (signals, the ``python -m mmrl`` entry point, environment variables read at
    import) keep real subprocesses."""
    import traceback

    from typer.testing import CliRunner

    from mmrl.cli import app

    threads, here = torch.get_num_threads(), os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        r = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
    stderr = r.stderr
    if r.exc_info is not None and not isinstance(r.exception, SystemExit):  # a crash, shown as Python shows it
        stderr += "".join(traceback.format_exception(*r.exc_info))
    return subprocess.CompletedProcess(["mmrl", *map(str, args)], r.exit_code, r.stdout, stderr)


def mmrl_here(*args, cwd=None) -> subprocess.CompletedProcess:
    """:func:`mmrl_in_process` that must succeed."""
    r = mmrl_in_process(*args, cwd=cwd)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="session")
def finished_cli_run(random_tiny_dir, tmp_path_factory):
    """A finished 2-step run of the random tiny model made by `mmrl train vlm` (runs/exp), trained
    once a session by the command line's own code in this process: the resume tests and the demo's
    playground each work on a copy (the tests of the process boundary run their own commands)."""
    root = tmp_path_factory.mktemp("cli-run")
    mmrl_here("train", "vlm", f"model.path={random_tiny_dir}", *CLI_RUN, "train.steps=2", "log.run_name=exp", cwd=root)
    return root / "runs" / "exp"


def make_config(*overrides: str, path=None):
    from mmrl.config import load_config

    return load_config(path, list(overrides))


def f64(x):
    """A float64 tensor of hand-worked numbers."""
    return torch.tensor(x, dtype=torch.float64)


def close(a, b, tol=1e-6):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return torch.allclose(a, b, atol=tol, rtol=0)


def tiny_run_overrides(path, out, steps, *extra, micro_batch_size=3) -> list[str]:
    """The dotted overrides of :func:`tiny_run_config` (for ``mmrl.train`` in another process)."""
    return [
        f"model.path={path}", "train.device=cpu", f"train.steps={steps}", "train.prompts_per_step=3",
        "rollout.num_generations=2", "rollout.max_completion_length=8", f"train.micro_batch_size={micro_batch_size}",
        "train.learning_rate=1e-3", "eval.num_examples=2", "eval.before=false", f"log.output_dir={out}",
        "log.run_name=run", "log.save_every=2", "log.save_rollouts_every=0", "log.progress=false", *extra,
    ]


def tiny_run_config(path, out, steps, *extra, micro_batch_size=3):
    """A few-step run of the random tiny model on CPU: 3 prompts x 2 samples, 8 tokens."""
    return make_config(*tiny_run_overrides(path, out, steps, *extra, micro_batch_size=micro_batch_size))


def tiny_trainer(cfg):
    """A Trainer over a VLMPolicy for ``cfg``, optimizer ready (for rollout_step / update)."""
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy

    trainer = Trainer(cfg, VLMPolicy(cfg))
    trainer.policy.configure_optimizer(cfg.train, cfg.train.steps)
    return trainer


def capture_gradients(policy) -> dict:
    """The gradients the optimizer step sees, by parameter name (train_step frees them right
    after the step, so they are snapshotted inside it)."""
    grads = {}

    def snapshot(optimizer, args, kwargs):
        grads.update({n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None})

    # accelerate wraps the optimizer; the torch optimizer inside runs the step hooks
    getattr(policy.optimizer, "optimizer", policy.optimizer).register_step_pre_hook(snapshot)
    return grads
