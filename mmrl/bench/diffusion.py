"""``mmrl bench diffusion``: generator RL variants on the tiny generator, same prompts and seed.

The question a Flow-GRPO user has: how much wall time per RL iteration does each way of choosing
the trained denoising steps save, and what does it cost in reward? Every variant is the tiny
recipe (``diffusion/composition_tiny``: Flow-GRPO SDE, 10 steps) with Flow-GRPO's clipped log-prob
loss (the recipe's own default is AWM, the ``awm`` variant) plus:

==================  ================================================================================
variant             changes
==================  ================================================================================
``full_sde``        nothing: every step stochastic and trained (Flow-GRPO)
``sde_window``      2 SDE steps at a random start in the first 5, ODE elsewhere, only they are
                    trained (Flow-GRPO-Fast)
``sliding_window``  4 SDE steps, the window moves forward every 10 RL steps (MixGRPO)
``subsample``       every step stochastic, a random half trained per sample (DanceGRPO)
``cps``             coefficients-preserving SDE instead of Flow-GRPO's
``nft``             DiffusionNFT's likelihood-free loss on the final images
``awm``             advantage-weighted flow matching on the final images
==================  ================================================================================

The table (from :func:`mmrl.bench.algos.run_algo_bench`) reports time per step (rollout + update)
and the held-out composition reward before/after, measured side by side in one process.
"""

from __future__ import annotations

VARIANTS: dict[str, tuple[str, ...]] = {
    "full_sde": (),
    "sde_window": ("diffusion.sde_window_size=2", "diffusion.sde_window_range=[0,3]"),
    "sliding_window": ("diffusion.sde_window_size=4", "diffusion.sde_window_mode=sliding",
                       "diffusion.sde_window_shift_every=10"),
    "subsample": ("diffusion.timestep_fraction=0.5",),
    "cps": ("diffusion.sampler=cps", "diffusion.noise_level=0.8"),
    "nft": ("algo.loss_type=nft",),
    "awm": ("algo.loss_type=awm",),
}
DEFAULT_VARIANTS = ("full_sde", "sde_window", "subsample")
DEFAULT_CONFIG = "diffusion/composition_tiny"
BASE_OVERRIDES: tuple[str, ...] = ("algo.loss_type=clip",)  # the default recipe is AWM; the step-choice variants are Flow-GRPO


def run_diffusion_bench(variants, steps: int, seed: int, out_dir, config: str = DEFAULT_CONFIG,
                        extra_overrides=(), console=None):
    from .algos import run_algo_bench

    return run_algo_bench(variants, steps=steps, seed=seed, out_dir=out_dir, config=config,
                          extra_overrides=extra_overrides, console=console, table=VARIANTS,
                          base=BASE_OVERRIDES, report_name="diffusion")
