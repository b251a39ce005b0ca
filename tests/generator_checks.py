"""What every generator family's tests check the same way (tests/test_*_generator.py,
test_diffusion_pipelines.py, test_diffusion_policy.py), written once: mmrl's Euler loop, which each
family compares with its pipeline's ``__call__``; the diffusion policy over a tiny pipeline; a training
rollout; and the check that the log-probs the training step re-scores from the stored latents equal
the ones sampling recorded."""

from __future__ import annotations

import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.policy import DiffusionPolicy


def latent_noise(shape, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(seed))


def euler(adapter, start: torch.Tensor, prompts, guidance: float, images=None, steps: int = 3):
    """The deterministic flow sampler, x <- x + (sigma_next - sigma) v(x, sigma), then decode:
    (pixels, sigmas). ``images``: a conditioned pipeline's condition images (B, 3, H, W)."""
    sigmas = adapter.sigmas(steps, tuple(start.shape[1:]))
    extra = () if images is None else (images,)
    x = start.clone()
    with torch.no_grad():
        for i in range(steps):
            x = x + (sigmas[i + 1] - sigmas[i]) * adapter.velocity(x, sigmas[i].expand(len(x)), prompts, guidance,
                                                                   *extra)
        return adapter.decode(x), sigmas


def policy_for(path, *overrides: str, task: str = "composition") -> DiffusionPolicy:
    """A diffusion policy on ``path`` (3 sampling steps of a 16 x 16 output on the CPU; ``overrides`` win),
    its optimizer made and RL step 1 begun."""
    cfg = make_config(f"model.path={path}", "train.device=cpu", f"task.name={task}", "diffusion.num_steps=3",
                      "diffusion.eval_num_steps=2", "diffusion.height=16", "diffusion.width=16",
                      "rollout.batch_size=64", "train.learning_rate=1e-3", *overrides)
    policy = DiffusionPolicy(cfg)
    policy.configure_optimizer(cfg.train, 10)
    policy.begin_step(1)
    return policy


def train_rollout(policy, prompts, n: int = 2, examples=None):
    """``n`` training samples per prompt (old log-probs, no reference), advantages spread over [-1, 1]."""
    examples = examples or [{"prompt": str(p), "_index": i} for i, p in enumerate(prompts)]
    batch = policy.rollout(examples, list(prompts), n, "train", need_old_logps=True, need_ref_logps=False)
    batch.advantages = torch.linspace(-1, 1, len(batch))
    return batch


class Spy:
    """The core objective, remembering what it was given: ``(logps, old_logps, inputs)`` per call."""

    def __init__(self, policy):
        self.cfg = ObjectiveConfig.from_algo(policy.cfg.algo)
        self.calls = []

    def __call__(self, logps, old_logps, *args, **kwargs):
        self.calls.append((None if logps is None else logps.detach().clone(),
                           None if old_logps is None else old_logps.clone(), kwargs.get("inputs")))
        return Objective(self.cfg)(logps, old_logps, *args, **kwargs)


def assert_rescored(policy, batch, steps: int, atol: float = 1e-5) -> Spy:
    """One training step: the objective is called once per denoising step, with log-probs re-scored from
    the stored latents equal to the sampled ones."""
    assert torch.isfinite(batch.old_logps).all()
    spy = Spy(policy)
    policy.train_step(batch, spy, num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))
    assert len(spy.calls) == steps  # one per denoising step (the per-timestep backward)
    for logps, old, _ in spy.calls:
        assert torch.allclose(logps, old, atol=atol, rtol=0), (logps - old).abs().max()
    return spy
