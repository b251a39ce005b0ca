"""mmrl.runs.checkpoint: a checkpoint is either complete or absent, and RNG state round-trips."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from mmrl.runs.checkpoint import CheckpointManager, rng_state, set_rng_state


def writer(payload: str):
    def write(d):
        (d / "model.txt").write_text(payload)
        (d / "sub").mkdir()
        (d / "sub" / "opt.txt").write_text(payload + "-opt")

    return write


def test_save_and_latest(tmp_path):
    m = CheckpointManager(tmp_path / "ckpt", keep=3)
    assert m.latest() is None and m.steps() == []
    p = m.save(10, writer("a"))
    assert p == tmp_path / "ckpt" / "step_00000010"
    assert m.latest() == p and (p / "model.txt").read_text() == "a"
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_00000010"
    m.save(20, writer("b"))
    assert m.steps() == [10, 20] and m.latest().name == "step_00000020"


def test_save_same_step_replaces(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(5, writer("old"))
    p = m.save(5, writer("new"))
    assert (p / "model.txt").read_text() == "new"
    assert m.steps() == [5]
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".tmp-")]


def test_failed_write_leaves_previous_latest(tmp_path):
    m = CheckpointManager(tmp_path)
    good = m.save(1, writer("good"))

    def broken(d):
        (d / "model.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        m.save(2, broken)
    assert m.latest() == good and (good / "model.txt").read_text() == "good"
    assert m.steps() == [1]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["latest", "step_00000001"]


def test_leftover_tmp_ignored_then_cleaned(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(1, writer("a"))
    # A save killed mid-write (by a process that no longer exists) leaves a temp dir behind.
    stale = tmp_path / ".tmp-step_00000002-999999999"
    stale.mkdir()
    (stale / "model.txt").write_text("partial")
    assert m.latest().name == "step_00000001" and m.steps() == [1]
    m.save(3, writer("c"))
    assert not stale.exists()
    assert m.latest().name == "step_00000003"


def test_latest_falls_back_when_pointer_missing_or_stale(tmp_path):
    m = CheckpointManager(tmp_path, keep=0)
    m.save(1, writer("a"))
    m.save(2, writer("b"))
    (tmp_path / "latest").write_text("step_00000099\n")
    assert m.latest().name == "step_00000002"
    (tmp_path / "latest").unlink()
    assert m.latest().name == "step_00000002"


def test_prune_keeps_newest(tmp_path):
    m = CheckpointManager(tmp_path, keep=2)
    for s in (1, 2, 3, 4):
        m.save(s, writer(str(s)))
    assert m.steps() == [3, 4]
    # Re-saving an older step makes it latest; pruning must never delete the latest.
    m.save(2, writer("again"))
    assert m.latest().name == "step_00000002"
    assert m.steps() == [2, 4]  # the latest plus the newest other: still `keep` in all


def draws():
    return (
        [random.random() for _ in range(3)],
        np.random.rand(3).tolist(),
        torch.rand(3).tolist(),
    )


def test_rng_round_trip_through_torch_save(tmp_path):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    draws()
    path = tmp_path / "rng.pt"
    torch.save(rng_state(), path)
    expected = draws()
    draws()  # move every generator on
    set_rng_state(torch.load(path, weights_only=False))
    assert draws() == expected
    assert os.path.getsize(path) > 0
