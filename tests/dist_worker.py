"""One process of the multi-process tests (tests/test_distributed.py): run as a plain script (one
process) or under ``torchrun --nproc_per_node 2`` (gloo on CPU); rank 0 writes what it measured.

    python dist_worker.py step   VLM_DIR OUT.pt [overrides...]   one train_step on a fixed global batch
    python dist_worker.py resume VLM_DIR CHECKPOINT OUT.pt [overrides...]   a fresh policy loads step's
                                 checkpoint (another launch's) and takes step's second step
    python dist_worker.py run    FLOW_DIR RUN_DIR STEPS [overrides...]   a tiny generator run
                                 (DIE_AT_STEP=k: rank 1 exits abruptly at step k)
    python dist_worker.py vlm_run VLM_DIR RUN_DIR STEPS [overrides...]   a tiny VLM run
                                 (DIE_AT_STEP=k as above; NAN_AT_STEP=k: the last rank's loss
                                 is NaN at step k)
    python dist_worker.py episodes ADVANTAGE OUT.pt   one step's batch of scripted GUI episodes (the
                                 batch builder: rollout, rewards, gather, advantages, metrics)
    python dist_worker.py error                    rank 1 raises while rank 0 waits in a barrier
    python dist_worker.py hang                     after one barrier together, rank 1 never joins
                                                   rank 0's gather (5 s timeout)
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.distributed.elastic.multiprocessing.errors import record

torch.set_num_threads(1)


def fixed_batch(vlm_dir: str, *extra: str):
    """The policy (optimizer configured for the launch) and the same global batch on every rank
    (4 prompts x 2 samples, rolled out identically), of which this rank trains on its whole groups:
    ``(policy, task, examples, local batch, objective, num_tokens, num_seqs)``."""
    from mmrl.config import load_config
    from mmrl.core import distributed as dist
    from mmrl.core.advantages import grpo
    from mmrl.core.losses import Objective, ObjectiveConfig, count_sequences
    from mmrl.core.seeding import seed_everything
    from mmrl.registry import TASKS, load_plugins
    from mmrl.vlm.policy import VLMPolicy

    cfg = load_config(None, [f"model.path={vlm_dir}", "train.device=cpu", "rollout.num_generations=2",
                             "rollout.max_completion_length=8", "train.micro_batch_size=1",
                             "train.learning_rate=1e-3", "rollout.temperature=1.0", *extra])
    load_plugins()
    task = TASKS.get("counting")()
    policy = VLMPolicy(cfg)
    policy.configure_optimizer(cfg.train, 10)
    examples = policy.prepare_examples([{**task.examples("train")[i], "_index": i} for i in range(4)])
    seed_everything(123)  # the same global batch on every rank
    batch = policy.rollout(examples, [task.build_prompt(ex) for ex in examples], 2, "train",
                           need_old_logps=True, need_ref_logps=False)
    batch.rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.2, 0.9])
    batch.advantages = grpo(batch.rewards, batch.group_ids)
    num_tokens, num_seqs = float(batch.action_mask.sum()), count_sequences(batch.action_mask)
    start, stop = dist.shard_bounds(4)  # this rank's groups, each of 2 samples
    local = batch.select(list(range(2 * start, 2 * stop)))
    objective = Objective(ObjectiveConfig.from_algo(cfg.algo, max_completion_length=8))
    return policy, task, examples, local, objective, num_tokens, num_seqs


def step(vlm_dir: str, out: str, *extra: str) -> None:
    """:func:`fixed_batch`'s step: loss, gradients and updated weights as rank 0 sees them,
    the weights after a save, another step and a load of that checkpoint, and after that step again
    from the loaded checkpoint (its optimizer state included).
    ``extra``: config overrides (e.g. a batch-wide token selection)."""
    from mmrl.core import distributed as dist
    from mmrl.core import sharding
    from mmrl.core.seeding import seed_everything, step_seed

    policy, task, examples, local, objective, num_tokens, num_seqs = fixed_batch(vlm_dir, *extra)
    cfg = policy.cfg
    grads = {}
    inner = policy.strategy.inner_optimizer  # the torch optimizer (DeepSpeed: its flat partitions)

    def keep_first_gradients(*_):  # the first step's whole gradients (FSDP2: gathered on every rank);
        if not grads:             # DeepSpeed's exist only inside its step, reduced into partitions
            grads.update({n: sharding.full_tensor(p.grad).clone() for n, p in policy.model.named_parameters()
                          if p.grad is not None})

    inner.register_step_pre_hook(keep_first_gradients)
    metrics = policy.train_step(local, objective, num_tokens=num_tokens, num_seqs=num_seqs)
    # Per-rank seeds: the same prompts sampled on each rank under the trainer's seeding differ.
    seed_everything(step_seed(cfg.train.seed, 1, salt=dist.rank_salt()))
    again = policy.rollout(examples[:1], [task.build_prompt(examples[0])], 4, "train", False, False)
    samples = dist.gather([c.tolist() for c in again.payload["completion_ids"]])
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}  # whole (gathered) weights
    # A checkpoint round trip: saved, moved away by another step, loaded back.
    checkpoint = f"{out}.checkpoint"
    policy.save(checkpoint)
    policy.train_step(local, objective, num_tokens=num_tokens, num_seqs=num_seqs)
    moved = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    policy.load(checkpoint)
    reloaded = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    # Resumed: the same second step from the loaded checkpoint (its optimizer state too)
    policy.train_step(local, objective, num_tokens=num_tokens, num_seqs=num_seqs)
    resumed = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    if dist.is_main():
        torch.save({"metrics": metrics, "grads": grads, "samples": samples, "world": dist.world_size(),
                    "backend": policy.distributed_backend, "weights": weights, "moved": moved,
                    "reloaded": reloaded, "resumed": resumed}, out)


def resume(vlm_dir: str, checkpoint: str, out: str, *extra: str) -> None:
    """A fresh policy (no optimizer state yet) loads ``checkpoint``, written by :func:`step` in
    another launch after its first step, and takes :func:`step`'s second step: rank 0 writes the
    weights, to compare with that launch's ``moved``."""
    from mmrl.core import distributed as dist

    policy, _, _, local, objective, num_tokens, num_seqs = fixed_batch(vlm_dir, *extra)
    policy.load(checkpoint)
    policy.train_step(local, objective, num_tokens=num_tokens, num_seqs=num_seqs)
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    if dist.is_main():
        torch.save({"weights": weights, "backend": policy.distributed_backend}, out)


def run(flow_dir: str, run_dir: str, steps: str, *extra: str) -> None:
    """A tiny generator run; rank 0 also records each rank's step-1 prompts and initial noise."""
    from pathlib import Path

    import mmrl
    from mmrl.core import distributed as dist
    from mmrl.core.trainer import Trainer

    seen = {}
    original = Trainer.rollout_step

    die_at = int(os.environ.get("DIE_AT_STEP", "0"))  # rank 1 dies abruptly there: a killed run

    def spy(self, step):
        if step == die_at and dist.rank() == int(os.environ.get("DIE_RANK", "1")):
            os._exit(9)
        batch, metrics = original(self, step)
        if step == 1:
            seen["mine"] = ([ex["_index"] for ex in batch.examples], batch.payload["latents"][:, 0].clone())
        return batch, metrics

    Trainer.rollout_step = spy
    path = Path(run_dir)
    prompts = path.parent / "prompts.txt"
    if dist.is_main():
        path.parent.mkdir(parents=True, exist_ok=True)
        prompts.write_text("a red cat\ntwo dogs on grass\nblue sky at night\na green cube\na yellow sun\n"
                           "three stars\na white boat\na dark forest\n")
    dist.init("cpu")
    dist.barrier()
    mmrl.train("diffusion/composition_tiny", [
        f"model.path={flow_dir}", "task.name=t2i_prompts", f"task.options.train_path={prompts}",
        "task.rewards.brightness=1.0", "task.rewards.jpeg_compressibility=0.1", "algo.loss_type=clip", f"train.steps={steps}", "train.prompts_per_step=4",
        "rollout.num_generations=2", "train.micro_batch_size=2", "algo.num_iterations=2", "diffusion.num_steps=3",
        "diffusion.eval_num_steps=2", "eval.num_examples=2", "eval.every=0", "train.learning_rate=1e-3",
        f"log.output_dir={path.parent}", f"log.run_name={path.name}", "log.save_every=2",
        "log.save_rollouts_every=0", "log.progress=false", "log.tensorboard=false", *extra])
    ranks = dist.gather(seen.get("mine"))
    if dist.is_main() and ranks[0] is not None:
        torch.save(ranks, path / "step1_samples.pt")


def vlm_run(vlm_dir: str, run_dir: str, steps: str, *extra: str) -> None:
    """A tiny VLM run (the counting recipe, 4 prompts x 4 samples per step, a checkpoint every step);
    DIE_AT_STEP=k: rank 1 exits abruptly at step k; NAN_AT_STEP=k: the last rank's loss terms at
    step k are NaN (one process: its own), as tests/test_reliability.py injects a non-finite loss."""
    from pathlib import Path

    import mmrl
    from mmrl.core import distributed as dist
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy

    die_at, nan_at = (int(os.environ.get(key, "0")) for key in ("DIE_AT_STEP", "NAN_AT_STEP"))
    original, terms, poisoned = Trainer.train_step, VLMPolicy.loss_terms, [False]

    def spy(self, step):
        if step == die_at and dist.rank() == 1:
            os._exit(9)
        poisoned[0] = step == nan_at and dist.rank() == dist.world_size() - 1
        return original(self, step)

    def loss_terms(self, *args, **kwargs):
        for loss, metrics in terms(self, *args, **kwargs):
            yield (loss * float("nan"), {**metrics, "loss": float("nan")}) if poisoned[0] else (loss, metrics)

    Trainer.train_step, VLMPolicy.loss_terms = spy, loss_terms  # the step's start, on-policy or asynchronous
    path = Path(run_dir)
    mmrl.train("vlm/counting_tiny", [
        f"model.path={vlm_dir}", "train.device=cpu", f"train.steps={steps}", "train.prompts_per_step=4",
        "rollout.num_generations=4", "train.micro_batch_size=4", "eval.num_examples=4", "eval.every=0", "eval.pass_k=0",
        f"log.output_dir={path.parent}", f"log.run_name={path.name}", "log.save_every=1",
        "log.save_rollouts_every=0", "log.progress=false", "log.tensorboard=false", *extra])


def episodes(advantage: str, out: str) -> None:
    """One step's batch of the toy button episodes of tests/test_episodes.py through the batch
    builder, 4 prompts (goals) x 4 episodes, at most 2 steps each, a scripted policy whose action
    depends only on the episode's goal, its place k in its group and its turn (so every rank acts
    as one process does): at turn 0 episode k = 0 presses the goal (solved, return 1), k = 1 and 2
    miss and then miss again (return 0), k = 3 writes no action (invalid, -0.5) and then presses
    the goal (return 0.5). Rank 0 writes every row's advantage, keyed by (task index, k, turn), and
    the step's metrics."""
    import torch

    from mmrl.config import load_config
    from mmrl.core import distributed as dist
    from mmrl.core.batch.pipeline import BatchBuilder
    from mmrl.core.reward_computer import RewardComputer
    from test_episodes import ScriptedPolicy, ToyTask, click, goal_of

    dist.init("cpu")
    seen: dict[tuple[int, str], int] = {}

    def answer(prompt: str, call: int) -> str:
        goal = goal_of(prompt)
        if call > 0:
            return click(goal) if "invalid" in prompt else click((goal + 3) % 4)
        k = seen[call, prompt] = seen.get((call, prompt), -1) + 1  # the k-th episode of this goal
        return "I am not sure" if k == 3 else click((goal + k) % 4)

    class Policy(ScriptedPolicy):
        max_actions = 2

    cfg = load_config(None, ["train.device=cpu", "train.prompts_per_step=4", "rollout.num_generations=4",
                             f"algo.advantage={advantage}"])
    task = ToyTask(env_options={"penalty": 0.5}, max_steps=2)
    batch, metrics = BatchBuilder(cfg, task, Policy(answer), RewardComputer({"env_reward": 1.0})).build(1)
    rows = dist.gather([((ex["_index"], ex["episode_id"] % 4, ex["step_index"]), float(a))
                        for ex, a in zip(batch.examples, batch.advantages)])
    if dist.is_main():
        torch.save({"world": dist.world_size(), "metrics": metrics,
                    "advantages": dict(row for part in rows for row in part)}, out)


def error() -> None:
    from mmrl.core import distributed as dist

    dist.init("cpu", timeout_s=60)
    if dist.rank() == 1:
        raise RuntimeError("boom from rank 1")
    dist.barrier()  # rank 0 would wait here for ever, were the launcher not to stop it


def hang() -> None:
    from mmrl.core import distributed as dist

    dist.init("cpu", timeout_s=5)
    dist.barrier()
    if dist.rank() == 1:
        time.sleep(120)  # never joins: rank 0's collective must time out, not wait for ever
    dist.gather(dist.rank())


@record
def main() -> None:
    mode, *args = sys.argv[1:]
    {"step": step, "resume": resume, "run": run, "vlm_run": vlm_run, "episodes": episodes, "error": error, "hang": hang}[mode](*args)
    from mmrl.core import distributed as dist

    if dist.active():  # leave together: a rank exiting while its peer still tears down can abort it
        dist.barrier()
        torch.distributed.destroy_process_group()
        # Skip the interpreter's teardown: there gloo's threads sometimes abort the process
        # ("terminate called without an active exception", no Python frame; seen twice in CI)
        # after every result was written. The work is done and flushed; exit as it succeeded.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
