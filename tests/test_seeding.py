"""Every random purpose has its own stream: named once in mmrl.core.seeding.STREAMS, with ranges
that never overlap (T-GRPO's frame shuffles and the image perturbations shared salt 300 + round)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mmrl.core.distributed import RANK_SALT
from mmrl.core.seeding import STREAMS, step_seed, stream_seed

MMRL = Path(__file__).resolve().parents[1] / "mmrl"


def test_no_two_streams_share_a_salt():
    taken: dict[int, str] = {}
    for name, (base, size) in STREAMS.items():
        for salt in range(base, base + size):
            assert salt not in taken, f"{name} and {taken[salt]} share salt {salt}"
            taken[salt] = name
    assert max(taken) < RANK_SALT  # a rank's offset lands above every range


def test_every_stream_used_in_the_code_is_declared_and_salts_are_not_written_by_hand():
    used, by_hand = set(), []
    for path in MMRL.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        used |= set(re.findall(r'stream_seed\([^)]*?"(\w+)"', text))
        if path.name != "seeding.py":
            by_hand += [f"{path.name}: {m}" for m in re.findall(r"step_seed\([^)]*salt=\d+[^)]*\)", text)]
    assert used and used <= set(STREAMS), used - set(STREAMS)
    assert {"temporal_shuffle", "perturbation", "minibatch_order", "step"} <= used
    assert not by_hand, by_hand


def test_stream_seeds_keep_the_values_runs_always_used():
    """Seeded runs reproduce: each stream's seeds are the old hand-written salts (T-GRPO aside)."""
    assert stream_seed(5, 3, "step") == step_seed(5, 3, 0)
    assert stream_seed(5, 3, "minibatch_order", 1) == step_seed(5, 3, 12)
    assert stream_seed(5, 3, "perturbation", 2, rank_salt=RANK_SALT) == step_seed(5, 3, 302 + RANK_SALT)
    assert stream_seed(5, 3, "temporal_shuffle", 2) != stream_seed(5, 3, "perturbation", 2)
    with pytest.raises(ValueError, match="minibatch_order.*20 sub-streams"):
        stream_seed(5, 3, "minibatch_order", 20)
