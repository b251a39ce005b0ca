"""train.threads: auto uses the cores other work leaves free (OMP_NUM_THREADS if set), a number
wins, the command line applies it, says what it picked and records it for a resume."""

from __future__ import annotations

import pytest
import torch

from mmrl.config import ConfigError, builtin_config_path, load_config
from mmrl.config.threads import busy_cores, configure_threads, pick_threads


@pytest.fixture
def no_omp(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.parametrize("busy,cores,threads", [(0.0, 2, 2), (0.9, 2, 1), (1.2, 2, 1), (2.0, 2, 1), (0.4, 2, 2),
                                                (3.6, 16, 12), (0.0, 1, 1)])
def test_auto_uses_the_free_cores(no_omp, busy, cores, threads):
    choice = pick_threads("auto", busy=busy, cores=cores)
    assert choice.threads == threads and f"{cores} cores, {busy:.1f} busy" in choice.why


def test_a_number_wins_and_omp_num_threads_is_the_users_choice(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert pick_threads("auto", busy=0.0, cores=2).threads == 3
    assert pick_threads(5, busy=2.0, cores=2).threads == 5
    assert pick_threads(0).threads is None  # torch's default left alone


@pytest.mark.parametrize("bad", ["many", -1, 1.5, True])
def test_bad_values_are_refused_with_the_key(bad):
    with pytest.raises(ConfigError, match=r"train.threads=.*expected auto"):
        pick_threads(bad)


def test_busy_cores_reads_proc_stat():
    busy = busy_cores(interval=0.05)
    assert busy is None or 0.0 <= busy <= 64


def test_configure_threads_sets_torch_says_so_and_records_the_number(no_omp, monkeypatch):
    cfg = load_config(builtin_config_path("vlm/counting_tiny"), [])
    assert cfg.train.threads == "auto"
    monkeypatch.setattr("mmrl.config.threads.busy_cores", lambda interval=0.25: 0.0)
    monkeypatch.setattr("mmrl.config.threads.usable_cores", lambda: 1)
    lines: list[str] = []
    before = torch.get_num_threads()
    try:
        configure_threads(cfg, echo=lines.append)
        assert torch.get_num_threads() == 1 and cfg.train.threads == 1
        assert lines == ["torch CPU threads: 1 (train.threads=auto: 1 cores, 0.0 busy with other work)"]
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_the_cli_prints_the_pick_and_a_resume_reuses_the_recorded_count(tmp_path, no_omp, monkeypatch):
    """`mmrl train` says the picked count first and writes it into the run's config.yaml; a resume
    on a machine that is busier now keeps the recorded count."""
    from typer.testing import CliRunner

    from mmrl.cli import app

    before = torch.get_num_threads()
    monkeypatch.setattr("mmrl.config.threads.busy_cores", lambda interval=0.25: 0.0)
    args = ["train", "vlm", "train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=2",
            "eval.num_examples=2", "eval.pass_k=0", "eval.before=false", "log.progress=false", "log.tensorboard=false",
            f"log.output_dir={tmp_path}", "log.run_name=t", "log.save_every=1"]
    try:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        cores = len(__import__("os").sched_getaffinity(0))
        assert f"torch CPU threads: {cores} (train.threads=auto" in res.output.splitlines()[0]
        assert f"threads: {cores}" in (tmp_path / "t" / "config.yaml").read_text()
        monkeypatch.setattr("mmrl.config.threads.busy_cores", lambda interval=0.25: float(cores))  # every core busy now
        res = CliRunner().invoke(app, ["train", "vlm", "--resume", str(tmp_path / "t"), "--allow-config-change",
                                       "train.steps=2"])
        assert res.exit_code == 0, res.output
        assert f"torch CPU threads: {cores} (train.threads={cores})" in res.output
    finally:
        torch.set_num_threads(before)
