"""`mmrl demo` as a user runs it, in its own process: the runs it launched end with it, whether it
is stopped by Ctrl-C or by SIGTERM (a service manager, `kill`, a cluster's job end). Before issue
51 (item 5) a SIGTERM ended the demo at once and its runs trained on, orphaned."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("gradio", reason="the demo needs gradio: pip install -e '.[demo]'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def _start(url: str, recipe: str, overrides: str, name: str) -> str:
    """The Launch tab's Start over HTTP; the status line."""
    request = urllib.request.Request(f"{url}/gradio_api/call/launch_start", method="POST",
                                     data=json.dumps({"data": [recipe, overrides, name]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        event = json.load(r)["event_id"]
    with urllib.request.urlopen(f"{url}/gradio_api/call/launch_start/{event}", timeout=60) as r:
        lines = r.read().decode().splitlines()
    return json.loads(lines[lines.index("event: complete") + 1].removeprefix("data: "))[1]


def _processes_in(folder: Path) -> list[int]:
    """Live processes whose working directory is ``folder`` (a launched run starts in its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) == folder and _alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its exit status is left


LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/cwd").exists(),
                                reason="finds a run's processes through /proc (Linux)")


@pytest.mark.slow
@LINUX_PROC
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_serving_ends_on_a_signal_and_stops_the_runs_first(tmp_path, sig):
    """The serving loop of `mmrl demo`, in this process: a run (a stand-in that starts a child and
    waits, as a training run's data workers would) is gone, child included, once serving ends."""
    import threading

    from mmrl.demo.app import launch_app
    from mmrl.demo.shutdown import serve_until_stopped

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nsleep 60 &\nexec sleep 61\n")
    fake.chmod(0o755)
    port = _free_port()
    app, _play, launcher = launch_app(tmp_path / "runs", port=port, upload_dir=tmp_path / "uploads", block=False)
    launcher.python = str(fake)
    status = _start(f"http://127.0.0.1:{port}", "vlm/counting_tiny", "train.steps=1", "r")
    assert status.startswith("**r**"), status
    run_dir = (tmp_path / "runs" / "r").resolve()
    pids = _wait_until(lambda: len(_processes_in(run_dir)) == 2 and _processes_in(run_dir), 10, "the run and its child")
    before = signal.getsignal(sig)
    threading.Timer(0.5, os.kill, (os.getpid(), sig)).start()
    if sig == signal.SIGINT:  # Ctrl-C: Gradio's loop ends quietly
        serve_until_stopped(app, launcher)
    else:
        with pytest.raises(SystemExit) as ended:
            serve_until_stopped(app, launcher)
        assert ended.value.code == 128 + sig
    # the group got its signal before serving ended; a busy machine may take a moment to run the child's end
    _wait_until(lambda: not [p for p in pids if _alive(p)], 10, "the run and its child to end")
    assert launcher.running() == []
    assert signal.getsignal(sig) == before  # the handlers are the caller's again
    assert not _answers(f"http://127.0.0.1:{port}")  # the server is closed too


@LINUX_PROC
@pytest.mark.slow  # ~25 s: the demo's own start (gradio, torch) in a fresh interpreter
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_signal_to_the_demo_stops_the_runs_it_launched(tmp_path, sig):
    port, runs = _free_port(), tmp_path / "runs"
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "MMRL_DEMO_AUTH"}
    demo = subprocess.Popen([sys.executable, "-m", "mmrl", "demo", "--runs", str(runs), "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_until(lambda: _answers(url) or demo.poll() is not None, 90, "the demo to answer")
        assert demo.poll() is None, demo.communicate()[0]
        status = _start(url, "vlm/counting_tiny", "train.steps=1000 train.threads=1", "long")
        assert status.startswith("**long**"), status
        run_dir = (runs / "long").resolve()
        pids = _wait_until(lambda: _processes_in(run_dir), 30, "the run's process")
        demo.send_signal(sig)
        out, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 128 + sig, out
    assert not [p for p in pids if _alive(p)] and not _processes_in(run_dir), out
    assert "Traceback" not in out, out
