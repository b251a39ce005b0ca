"""The learning tests' runs as data: each a shipped recipe shortened by overrides, the held-out
metric it must raise and by how much. One table, read by the tests (tests/test_learning.py,
tests/test_gui_learning.py, tests/test_diffusion_learning.py) through the runner that makes each
run once a session (learning_runs.py: its own process, one torch thread, two runs at a time) and by
the campaign that measures the seed-to-seed spread the thresholds are set from
(tests/campaigns/seed_spread.py, the same runner): a threshold is at least twice the standard
deviation of the gain over seeds 0-2, and the tests' own seed (0) clears it. The gains stand beside
each case, seeds 0 / 1 / 2: the VLM cases' measured on 2026-11-28 at one thread on the tiny models
rebuilt by ``mmrl sft`` that day (the GUI cases' on 2026-11-27: their models were not rebuilt; see
docs/tiny-default.md), those of the earlier build in git history."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LearningCase:
    recipe: str
    overrides: tuple[str, ...]
    metric: str  # the held-out task metric that must rise (never the total reward)
    gain: float  # by at least this much (after - before), see the module docstring
    # the processor seconds of its run at one thread (measured 2026-12-07 on the 2-core CPU, in the runs' own
    # JSON, cpu_s): the pool starts the longest first, so the last two to finish are short ones
    seconds: float = 60


# These families train from the same warm start and are scored on the same 64 held-out scenes with
# the same seed (pass@k from a fixed seed in a forked random state), so their "before" is one
# evaluation: the first of them measures it, the others reuse it (learning_fixtures.py). GSPO is
# scored on 128 scenes: it measures its own.
SHARED_START = ("dapo", "grpo", "ngrpo", "spo")

FAMILY_RUN = ("train.steps=24", "train.prompts_per_step=16", "eval.num_examples=64")
# GSPO (off-policy, tiny clip range) and NGRPO move pass@1 less per step: in 24 steps (earlier build) their gains were
# within twice the seed spread (gspo +0.043 / +0.090 / +0.057, ngrpo +0.018 / +0.051 / +0.045), so
# they train longer, GSPO also on twice the scenes (48 steps on 64: +0.078 / +0.145 / +0.080).
LONG_FAMILY_RUN = ("train.steps=36", "train.prompts_per_step=16", "eval.num_examples=64")

GENERATOR_RUN = ("log.tensorboard=false", "eval.every=0", "train.lr_scheduler_type=constant_with_warmup")

CASES: dict[str, LearningCase] = {
    # The default recipe (Dr. GRPO) shortened to 28 steps: sampled accuracy (pass@1) rises.
    # +0.115 / +0.121 / +0.115: sd 0.004.
    "default": LearningCase("vlm/counting_tiny", ("train.steps=28", "eval.num_examples=100"), "pass@1", 0.05, seconds=285),
    # One switch per algorithm family from the default recipe, 24 steps of 16 prompts, pass@1 on 64
    # scenes (pass@k draws the same random numbers before and after: a run that changed nothing gains 0).
    "grpo": LearningCase("vlm/counting_tiny", (*FAMILY_RUN, "algo.advantage=grpo"), "pass@1", 0.035, seconds=108),  # +0.090 / +0.074 / +0.059: sd 0.016
    # On-policy GSPO takes exactly GRPO's step (every ratio is 1); two iterations over two mini-batches
    # make it act off-policy, where it differs. 36 steps: +0.159 / +0.138 / +0.121, sd 0.019.
    "gspo": LearningCase("vlm/counting_tiny", ("train.steps=36", "train.prompts_per_step=16", "eval.num_examples=128",
                                               "algo.loss_type=gspo", "algo.epsilon=3e-4",
                                               "algo.epsilon_high=4e-4", "algo.num_iterations=2",
                                               "train.mini_batch_size=64", "algo.loss_agg_mode=seq_mean_token_mean"),
                         "pass@1", 0.05, seconds=300),
    "spo": LearningCase("vlm/counting_tiny", (*FAMILY_RUN, "algo.advantage=spo", "rollout.num_generations=1",
                                              "train.prompts_per_step=128"), "pass@1", 0.065, seconds=250),  # +0.135 / +0.074 / +0.102: sd 0.030
    # NGRPO, 36 steps: +0.100 / +0.057 / +0.080, sd 0.022.
    "ngrpo": LearningCase("vlm/counting_tiny", (*LONG_FAMILY_RUN, "algo.advantage=ngrpo"), "pass@1", 0.045, seconds=180),
    # DAPO in full: clip-higher and token mean (the recipe's), the overlong filter and dynamic sampling.
    "dapo": LearningCase("vlm/counting_tiny", (*FAMILY_RUN, "algo.advantage=grpo", "algo.overlong_filter=true",
                                               "algo.selection=dynamic_sampling", "algo.max_num_gen_batches=3"),
                         "pass@1", 0.05, seconds=200),  # +0.062 / +0.109 / +0.096: sd 0.024
    # The other task the 1M-parameter model learns at this size, 16 steps of 8 prompts (chart QA,
    # which the README once listed as rising, measured +0.062 / 0.000 / -0.062: it does not).
    # +0.234 / +0.234 / +0.172: sd 0.036.
    "detection": LearningCase("vlm/detection_tiny", ("train.steps=16", "train.prompts_per_step=8",
                                                     "eval.num_examples=32", "eval.pass_k=0"), "ap50", 0.1, seconds=51),
    # The tiny video default, 20 steps of 16 prompts on 100 clips. +0.170 / +0.063 / +0.086: sd 0.056
    # (the earlier build: +0.129 / +0.062 / +0.065, sd 0.038, bar 0.08).
    "video": LearningCase("video/video_qa_tiny", ("train.steps=20", "eval.num_examples=100"), "pass@1", 0.115, seconds=215),
    # GUI: the multi-step recipe (GiGPO) shortened to 4 steps on 50 tasks (+0.34 / +0.18 / +0.36 at one
    # thread, 2026-11-27: sd 0.099, so the bar is 0.2; 6 steps gave +0.34 / +0.20 / +0.28, sd 0.070,
    # in 1.4x the time); the grounding recipe to 24 steps at its peak learning rate (+0.085 / +0.030 / +0.090:
    # sd 0.033, so 0.07, not the 0.05 it had).
    "gui_episodes": LearningCase("gui/synthetic_gui_tiny", ("train.steps=4", "eval.num_examples=50",
                                                           "log.save_rollouts_every=4"), "success", 0.2, seconds=185),
    "gui_grounding": LearningCase("gui/screen_grounding_tiny", ("train.steps=24", "train.lr_scheduler_type=constant",
                                                               "eval.pass_k=0"), "point_accuracy", 0.07, seconds=200),
    # Thinking with images: the tiny zoom default (model.path=tiny-zoom) at a constant learning rate for
    # 8 steps of 8 prompts: held-out greedy accuracy rises as trajectories learn to call zoom_cell (the
    # texture asked about cannot be seen without it). +0.68 / +0.68 / +0.68 (0.32 -> 1.00 on 50
    # held-out examples in every seed, the tool-use rate 0.00 -> 1.00: sd 0, saturated), 41-48 s;
    # on the earlier build the same, and 12 steps of 16 on 100 examples gave it in 147-153 s. The bar
    # is the 0.15 doubled.
    "zoom": LearningCase("vlm/zoom_qa_tiny", ("train.steps=8", "train.prompts_per_step=8",
                                              "train.lr_scheduler_type=constant_with_warmup", "eval.num_examples=50"),
                         "accuracy", 0.3, seconds=76),
    # Generators (tests/test_diffusion_learning.py), the held-out reward (the checkers' mean) at a
    # constant learning rate (the recipes decay theirs over 100 steps), no intermediate evals.
    # Gains at one thread, 2026-11-27, seeds 0 / 1 / 2.
    # The shipped tiny generator, AWM (the default recipe) on the composition reward, 15 steps of 8.
    # +0.150 / +0.175 / +0.213: sd 0.031.
    "composition": LearningCase("diffusion/composition_tiny", (*GENERATOR_RUN, "train.steps=15", "train.prompts_per_step=8",
                                                               "train.learning_rate=2e-4", "eval.num_examples=32"),
                                "reward", 0.1, seconds=115),
    # Flow-GRPO's clipped SDE log-prob surrogate on a weight-free darkness reward (brightness, target 0).
    # +0.170 / +0.150 / +0.100: sd 0.036.
    "darkness": LearningCase("diffusion/composition_tiny", (*GENERATOR_RUN, "algo.loss_type=clip", "train.steps=12",
                                                            "train.prompts_per_step=8", "train.learning_rate=2e-4",
                                                            "task.rewards.brightness=1.0",
                                                            "task.reward_kwargs.brightness.target=0.0",
                                                            "eval.num_examples=16", "log.save_rollouts_every=6"),
                             "reward", 0.1, seconds=82),
    # The tiny video generator on the whole-clip motion reward, 14 steps of 8 prompts x 8 clips.
    # +0.082 / +0.082 / +0.117 (2026-11-27): sd 0.020 (20 steps gave +0.094 / +0.078 / +0.102, sd 0.012).
    "motion": LearningCase("diffusion/motion_t2v_tiny", (*GENERATOR_RUN, "train.steps=14", "train.prompts_per_step=8",
                                                         "train.learning_rate=1e-4", "eval.num_examples=64"),
                           "reward", 0.05, seconds=150),
}
