"""The batch pipeline's stages one by one, with stand-in policies and tasks: each stage calls the hook
its policy or task declares, and the VLM policy's hooks do the modality's part."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.core.batch.estimation import ESTIMATOR_INPUTS, RunFacts, check_estimator_inputs
from mmrl.core.batch.perturbation import perturb_examples
from mmrl.core.batch.temporal import temporal_contrast
from mmrl.core.episodes import EpisodicTask, is_episodic, rollout_task
from mmrl.core.rollouts import Rollouts
from mmrl.media.frame_order import shuffle_frames
from mmrl.media.video import Clip
from mmrl.registry import ADVANTAGES, PERTURBATIONS
from mmrl.vlm.policy import VLMPolicy


class Recorder:
    """A policy stand-in that records the hook calls and answers them with marked copies."""

    capabilities = frozenset({"image_inputs", "video_inputs"})

    def __init__(self, twins=()):
        self.calls, self.twins = [], set(twins)

    def perturb(self, ex, kind, rng, other, options):
        self.calls.append((ex["id"], kind, None if other is None else other["id"], dict(options)))
        return {**ex, "perturbed": kind}

    def temporally_shuffled(self, ex, rng):
        return {**ex, "shuffled": True} if ex["id"] in self.twins else None

    def rollout(self, examples, prompts, n, mode, need_old_logps, need_ref_logps):
        self.calls.append(("rollout", [ex["id"] for ex in examples], n))
        m = len(examples) * n
        return Rollouts(group_ids=torch.arange(len(examples)).repeat_interleave(n), action_mask=torch.ones(m, 1),
                        completions=["x"] * m, examples=[ex for ex in examples for _ in range(n)])


class ShuffledAllWrong:
    """A reward computer stand-in: every answer on shuffled frames scores 0."""

    weights = {"format": 0.5, "accuracy": 1.0}

    def __call__(self, completions, examples, group_ids):
        return None, {"accuracy": torch.zeros(len(completions))}, {}


def _batch(groups: list[int], correct: list[float], ids: list[str]) -> Rollouts:
    batch = Rollouts(group_ids=torch.tensor(groups), action_mask=torch.ones(len(groups), 1),
                     completions=["x"] * len(groups), examples=[{"id": ids[g]} for g in groups])
    batch.rewards = torch.tensor(correct)
    batch.reward_components = {"accuracy": torch.tensor(correct)}
    return batch


def test_perturbation_sampling_draws_kind_and_partner_and_the_policy_applies_them():
    examples = [{"id": f"e{i}"} for i in range(4)]
    partners = [{"id": "p0"}, {"id": "p1"}]
    policy = Recorder()
    assert perturb_examples(examples, policy, "rotation", 0.0, {}, partners, np.random.default_rng(0)) == examples
    assert policy.calls == []  # probability 0: no example perturbed, the policy never asked
    out = perturb_examples(examples, policy, "random", 1.0, {"max_angle": 5.0}, partners, np.random.default_rng(0))
    assert [ex["perturbed"] for ex in out] == [c[1] for c in policy.calls] and len(out) == 4
    for _, kind, other, options in policy.calls:
        assert kind in PERTURBATIONS.names() and options == {"max_angle": 5.0}
        assert (other is not None) == PERTURBATIONS.get(kind).needs_other  # a partner only where needed


def test_temporal_contrast_asks_the_policy_for_twins_and_contrasts_only_those_groups():
    # group 0 (a clip): ordered [1, 1, 0, 1], p = 0.75; its 2 shuffled answers score [0, 0]: 0.75 > 0.8 * 0
    # so its three right answers get 0.3. Group 1 (no twin: an image question) is not contrasted.
    batch = _batch([0, 0, 0, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0, 0, 0], ["clip", "image"])
    policy = Recorder(twins={"clip"})
    task = SimpleNamespace(build_prompt=lambda ex: ex["id"])
    rewards = ShuffledAllWrong()
    metrics = temporal_contrast(batch, policy, task, rewards, {}, np.random.default_rng(0))
    assert policy.calls == [("rollout", ["clip"], 2)]  # half the group of 4, for the one twin
    assert torch.allclose(batch.reward_components["temporal_bonus"], torch.tensor([0.3, 0.3, 0, 0.3, 0, 0, 0, 0]))
    assert torch.allclose(batch.rewards, torch.tensor([1.3, 1.3, 0, 1.3, 1, 0, 0, 0]))
    assert metrics == {"temporal/ordered_acc": 0.75, "temporal/shuffled_acc": 0.0, "temporal/bonus_groups": 1.0}


def _clip(frames: int) -> Clip:
    return Clip(frames=torch.arange(frames, dtype=torch.uint8).view(frames, 1, 1, 1).expand(frames, 3, 2, 2).clone(),
                timestamps=[float(t) for t in range(frames)], sample_fps=1.0, indices=list(range(frames)),
                source_fps=1.0, duration=float(frames))


def test_the_vlm_policy_shuffles_the_frames_of_its_clips():
    policy = object.__new__(VLMPolicy)  # the hook reads no model state
    ex = {"video": _clip(3), "question": "what happens first?"}
    twin = policy.temporally_shuffled(ex, np.random.default_rng(7))
    expected = shuffle_frames(ex["video"].frames, np.random.default_rng(7))
    assert torch.equal(twin["video"].frames, expected) and not torch.equal(expected, ex["video"].frames)
    assert twin["question"] == ex["question"] and twin["video"].timestamps == ex["video"].timestamps
    assert torch.equal(ex["video"].frames[:, 0, 0, 0], torch.arange(3, dtype=torch.uint8))  # the original kept
    for no_clip in ({"video": _clip(1)}, {"image": Image.new("RGB", (4, 4))}, "text"):
        assert policy.temporally_shuffled(no_clip, np.random.default_rng(0)) is None


def test_the_vlm_policy_perturbs_its_image_and_boxes_with_the_partners_image():
    policy = object.__new__(VLMPolicy)
    ex = {"image": Image.new("RGB", (20, 10)), "image_size": (20, 10), "box": [2.0, 2.0, 6.0, 6.0]}
    other = {"image": Image.new("RGB", (30, 10), (255, 0, 0))}
    rng = np.random.default_rng(2)  # its first draw, 0.26 < 0.5, puts the distractor on the left
    out = policy.perturb(ex, "distractor", rng, other, {})
    assert out["image"].size == (50, 10)  # side by side, the partner at the same height
    assert tuple(out["box"]) == (32.0, 2.0, 36.0, 6.0)  # moved right by the distractor's 30 px
    assert policy.perturb({"question": "no image"}, "rotation", rng, None, {}) == {"question": "no image"}


def test_the_estimator_inputs_are_a_table_that_covers_every_registered_estimator():
    declared = {name for est in ADVANTAGES.names() for name in ADVANTAGES.get(est).estimator_inputs}
    assert declared <= set(ESTIMATOR_INPUTS)
    facts = RunFacts({"format": 0.5, "accuracy": 1.0, "penalty": -0.2}, {"counting": 0, "grounding": 1})
    batch = _batch([0, 0, 1], [1.0, 0.0, 1.0], ["a", "b"])
    batch.action_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    batch.examples = [{"_index": 4, "source": "grounding"}, {"_index": 4, "source": "grounding"},
                      {"_index": 9, "source": "counting"}]
    assert ESTIMATOR_INPUTS["lengths"](batch, facts).tolist() == [2.0, 1.0, 3.0]
    assert ESTIMATOR_INPUTS["prompt_keys"](batch, facts) == ["4", "4", "9"]
    assert ESTIMATOR_INPUTS["task_ids"](batch, facts).tolist() == [1, 1, 0]
    assert ESTIMATOR_INPUTS["r_max"](batch, facts) == 1.5  # 0.5 + 1.0, the negative weight left out
    assert ESTIMATOR_INPUTS["episode_ids"](batch, facts) is None  # not an environment task's rows
    check_estimator_inputs("grpo", ["lengths"], {})
    with pytest.raises(ValueError, match=r"needs input\(s\) \['lenghts'\], which the trainer does not provide"):
        check_estimator_inputs("mine", ["lenghts"], {})


def test_an_episodic_task_runs_its_own_episodes():
    class Toy(EpisodicTask):
        def run_episodes(self, policy, examples, n, mode, need_old_logps=False, need_ref_logps=False):
            return ("episodes", list(examples), n, mode, need_old_logps, need_ref_logps)

    assert is_episodic(Toy()) and not is_episodic(SimpleNamespace())
    assert rollout_task(None, Toy(), [{"task": 1}], 3, "eval", need_ref_logps=True) == \
        ("episodes", [{"task": 1}], 3, "eval", False, True)
