"""DAPO dynamic sampling, Scaf-GRPO hints and DeepVideo-R1 augmentation on hand-built batches."""

from __future__ import annotations

import pytest
import torch

from mmrl.core.batch.guidance import augment_flat_groups, scaffold
from mmrl.core.rollouts import Rollouts
from mmrl.core.batch.selection import dynamic_sampling, group_has_variance


def batch_of(rewards: list[list[float]], names: list[str] | None = None, width: int = 3) -> Rollouts:
    """Group g has len(rewards[g]) samples; sample completions are "<name>:<k>"."""
    names = names or [f"p{g}" for g in range(len(rewards))]
    gids, rs, comps, exs = [], [], [], []
    for g, group in enumerate(rewards):
        for k, r in enumerate(group):
            gids.append(g)
            rs.append(r)
            comps.append(f"{names[g]}:{k}")
            exs.append({"name": names[g]})
    n = len(rs)
    return Rollouts(group_ids=torch.tensor(gids), action_mask=torch.ones(n, width), rewards=torch.tensor(rs),
                    reward_components={"accuracy": torch.tensor(rs)}, completions=comps, examples=exs,
                    truncated=torch.zeros(n, dtype=torch.bool), payload={"ids": [torch.zeros(width)] * n})


def test_group_has_variance():
    b = batch_of([[1, 1], [0, 1], [0, 0], [0.5]])
    assert group_has_variance(b.rewards, b.group_ids) == {0: False, 1: True, 2: False, 3: False}


def test_dynamic_sampling_drops_flat_groups_and_refills_to_size():
    """Round 0: groups a(1,1) b(0,1) c(0,0) d(1,0) -> keep b, d; drop 2. Round 1: e(0,0) f(1,0)
    g(0,1) h(1,1) -> need 2 more: keep f, g; e and h dropped (4 in all). Stops after 2 rounds."""
    rounds = [batch_of([[1, 1], [0, 1], [0, 0], [1, 0]], list("abcd")),
              batch_of([[0, 0], [1, 0], [0, 1], [1, 1]], list("efgh")),
              batch_of([[0, 1]] * 4, list("ijkl"))]
    calls = []

    def generate(r):
        calls.append(r)
        return rounds[r]

    kept, generated, stats = dynamic_sampling(generate, target_groups=4, max_num_gen_batches=5)
    assert calls == [0, 1]
    assert [ex["name"] for ex in kept.examples] == list("bbddffgg")
    assert kept.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert stats == {"selection/dropped_groups": 4.0, "selection/kept_groups": 4.0,
                     "selection/gen_batches": 2.0, "selection/fallback": 0.0}
    assert len(generated) == 2


def test_dynamic_sampling_cap_and_fallback():
    flat = batch_of([[1, 1], [0, 0]])
    kept, generated, stats = dynamic_sampling(lambda r: flat, target_groups=2, max_num_gen_batches=3)
    assert stats["selection/gen_batches"] == 3 and stats["selection/dropped_groups"] == 6
    assert stats["selection/fallback"] == 1.0 and kept is flat
    # Under the cap with some signal: the batch is smaller than asked, not padded.
    kept, _, stats = dynamic_sampling(lambda r: batch_of([[1, 0], [1, 1]]), target_groups=4, max_num_gen_batches=2)
    assert stats["selection/kept_groups"] == 2 and len(kept) == 4 and kept.group_ids.tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="max_num_gen_batches"):
        dynamic_sampling(lambda r: flat, 2, 0)


def test_concat_pads_and_renumbers():
    a, b = batch_of([[1, 0]], width=2), batch_of([[0, 1], [1, 1]], width=4)
    c = Rollouts.concat([a, b])
    assert c.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert c.action_mask.shape == (6, 4) and c.action_mask[:2, 2:].sum() == 0
    assert len(c.payload["ids"]) == 6 and c.completions[2] == "p0:0"
    same = Rollouts.concat([a, a], renumber_groups=False)
    assert same.group_ids.tolist() == [0, 0, 0, 0]


def solved(r):
    return r >= 1.0


def test_scaffold_rescues_failing_groups_at_the_first_working_tier():
    """Groups: a (0, 1) has a solve -> untouched; b (0, 0) is solved under tier 2; c (0, 0) under
    tier 1; d (0, 0) has no hints. b's and c's last sample is replaced by the hinted solve."""
    batch = batch_of([[0, 1], [0, 0], [0, 0], [0, 0]], list("abcd"))
    hints = {"a": ["x"], "b": ["b1", "b2", "b3"], "c": ["c1", "c2"], "d": []}
    solves = {"b2", "c1"}  # which hints make the model succeed
    seen = []

    def regenerate(examples, n):
        seen.append([ex["hint"] for ex in examples])
        rs = [[1.0 if ex["hint"] in solves else 0.0] * n for ex in examples]
        out = batch_of(rs, [ex["hint"] for ex in examples])
        out.examples = [dict(ex) for ex in examples for _ in range(n)]
        return out

    out, stats = scaffold(batch, solved, lambda ex: hints[ex["name"]], regenerate, num_samples=2)
    assert seen == [["b1", "c1"], ["b2"]]
    assert stats["scaffold/failing_groups"] == 3 and stats["scaffold/rescued_groups"] == 2
    assert stats["scaffold/rescued_tier1"] == 1 and stats["scaffold/rescued_tier2"] == 1
    by_group = {}
    for g, c, r in zip(out.group_ids.tolist(), out.completions, out.rewards.tolist()):
        by_group.setdefault(g, []).append((c, r))
    assert by_group[0] == [("a:0", 0.0), ("a:1", 1.0)]
    assert by_group[1] == [("b:0", 0.0), ("b2:0", 1.0)]
    assert by_group[2] == [("c:0", 0.0), ("c1:0", 1.0)]
    assert by_group[3] == [("d:0", 0.0), ("d:1", 0.0)]
    assert out.examples[out.completions.index("b2:0")]["hint"] == "b2"


def test_augment_flat_groups_harder_and_easier():
    """a all solved -> harder; b all failed -> easier; c mixed -> untouched. The harder re-roll
    of a gets variance (replaces a); the easier re-roll of b stays flat (b kept)."""
    batch = batch_of([[1, 1], [0, 0], [0, 1]], list("abc"))
    asked = []

    def augment(ex, direction):
        asked.append((ex["name"], direction))
        return {**ex, "name": ex["name"] + "-" + direction}

    def regenerate(examples, n):
        rs = [[1.0, 0.0] if ex["name"].endswith("harder") else [0.0, 0.0] for ex in examples]
        return batch_of(rs, [ex["name"] for ex in examples])

    out, stats = augment_flat_groups(batch, solved, augment, regenerate, num_samples=2)
    assert asked == [("a", "harder"), ("b", "easier")]
    assert stats == {"augment/harder": 1.0, "augment/easier": 1.0, "augment/replaced_groups": 1.0}
    groups = {g: [c for c, gg in zip(out.completions, out.group_ids.tolist()) if gg == g] for g in range(3)}
    assert groups == {0: ["a-harder:0", "a-harder:1"], 1: ["b:0", "b:1"], 2: ["c:0", "c:1"]}
