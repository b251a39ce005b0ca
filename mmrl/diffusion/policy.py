"""The generator policy: a diffusion / flow-matching model trained by the core objective.

A sample is an image (or clip); its actions are the stochastic denoising transitions
x_t -> x_{t+1}; the log-prob of an action is the Gaussian density of the SDE step
(:mod:`mmrl.diffusion.sde`). ``rollout`` samples groups and stores each trajectory; ``train_step``
recomputes the trained steps' log-probs with gradient, one denoising step at a time (per-timestep
backward: activation memory of one step, not of the whole chain) and calls the core's loss.

The policy computes what the loss declares (``register_loss(requires=)``, among ``loss_inputs``),
so a plugin loss gets what a built-in gets:

- ``logps``: the SDE step log-probs ("Flow-GRPO: Training Flow Matching Models via Online RL";
  "DanceGRPO: Unleashing GRPO on Visual Generation"; ``clip``), optionally with GRPO-Guard's
  RatioNorm (``diffusion.grpo_guard``); with ``algo.beta`` also the policy's and the reference's
  step means (:class:`~mmrl.core.losses.GaussianActions`), of which the objective computes the KL
  (the reference is the LoRA-disabled model, or a frozen copy).
- ``flow_matching_logps``: the flow-matching log-likelihood of the final sample, re-noised at the
  trained steps' noise levels, in place of ``logps`` ("Advantage Weighted Matching"; ``awm``).
- ``nft_errors``: likelihood-free, the implicit velocities' errors of "DiffusionNFT: Online
  Diffusion Reinforcement with Forward Process" (the ``nft`` loss of :mod:`mmrl.diffusion.losses`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.registry import LOSSES, SDE_SAMPLERS, register_policy

from ..core.activation_checkpointing import module_checkpoint
from ..core.losses import GaussianActions
from ..core.policy import PolicyBase
from ..core.rollouts import Rollouts
from ..core.seeding import seeded, step_seed
from .base import FlowPipeline
from .conditions import prompt_conditions, rows_of as _rows, to_pil
from .loading import export_generator, load_generator
from .losses import awm_log_likelihood, guard_log_ratio, nft_errors, noised
from .plan import SDE_WINDOW_MODES, step_plan, trained_steps
from .sde import StepOutput, ode_step, sde_step

# Aggregations that are sums over actions with fixed normalisers, so the per-timestep backward
# (one call per denoising step) adds up to exactly the loss of the whole batch.
LINEAR_AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")

# What a loss may require that is computed on the final sample re-noised (not along the SDE chain).
RENOISED_INPUTS = frozenset({"flow_matching_logps", "nft_errors"})


@register_policy("diffusion")
class DiffusionPolicy(PolicyBase):
    """The generator policy over a :class:`~mmrl.diffusion.base.FlowPipeline` (module docstring).
    The trained module is the pipeline's transformer (LoRA goes there)."""

    loss_inputs = frozenset({"logps", "flow_matching_logps", "nft_errors"})
    unused_config = ("vlm", "rollout.engine", "rollout.max_time", "rollout.temperature", "rollout.top_p", "rollout.top_k",
                     "rollout.max_completion_length", "rollout.cache_implementation", "rollout.compile_decode",
                     "eval.temperature", "data.perturbation", "train.shared_prefix", "train.padding_free", "train.micro_batch_tokens",
                     "model.load_in_4bit", "model.bnb_4bit_quant_type", "model.use_bnb_nested_quant")

    def __init__(self, cfg, pipeline: FlowPipeline | None = None, device: torch.device | None = None):
        super().__init__(cfg, device)
        self.d = cfg.diffusion
        self._check_config(cfg)
        self.pipe = pipeline or load_generator(cfg.model.path, self.device, self.compute_dtype, cfg.model.revision,
                                               self.d.pipeline_options)
        self.transformer = self.module = self.pipe.transformer
        if self.lora:
            self._apply_lora(cfg.model.lora)
        else:
            self.transformer.requires_grad_(True)
        self.finish_setup()  # trained weights to the trained dtype (train.optim); the reference copy
        self.rl_step = 0
        self._calls = 0

    @property
    def max_actions(self) -> int:
        return int(self.d.num_steps)

    @staticmethod
    def _check_config(cfg) -> None:
        d, algo = cfg.diffusion, cfg.algo
        SDE_SAMPLERS.get(d.sampler, "diffusion.sampler")  # an unknown name fails here, naming the valid ones
        if algo.loss_agg_mode not in LINEAR_AGG_MODES:
            raise ValueError(f"algo.loss_agg_mode={algo.loss_agg_mode!r}: a generator's loss is summed one "
                             f"denoising step at a time, which is exact for {', '.join(LINEAR_AGG_MODES)}")
        if d.sde_window_mode not in SDE_WINDOW_MODES:
            raise ValueError(f"unknown diffusion.sde_window_mode {d.sde_window_mode!r}; valid: {', '.join(SDE_WINDOW_MODES)}")
        if d.logp_reduction not in ("mean", "sum"):
            raise ValueError(f"diffusion.logp_reduction must be mean or sum, got {d.logp_reduction!r}")
        requires = set(LOSSES.get(algo.loss_type).loss_requires)
        if {"logps", "flow_matching_logps"} <= requires:
            raise ValueError(f"algo.loss_type={algo.loss_type!r} requires logps and flow_matching_logps: a "
                             "generator's loss takes one log-likelihood, the SDE step's or the flow-matching one")
        if d.grpo_guard and "logps" not in requires:
            raise ValueError("diffusion.grpo_guard corrects the SDE step ratio: it needs an algo.loss_type on the "
                             "SDE step log-probs (requires logps), e.g. clip")
        if d.grpo_guard and d.sampler == "cps":
            raise ValueError("diffusion.grpo_guard re-scales a Gaussian step log-ratio; the cps sampler's log-prob is "
                             "the authors' -mean((x - mu)^2), whose ratio is already on a per-step scale: use "
                             "sampler flow_sde or dance with grpo_guard")
        if algo.beta > 0 and "logps" not in requires:
            raise ValueError("algo.beta (KL on the step means) needs an algo.loss_type on the SDE step log-probs "
                             "(requires logps), e.g. clip")
        for name in ("entropy_coef", "top_entropy_quantile", "clip_cov_ratio", "kl_cov_ratio", "off_policy_guidance"):
            if getattr(algo, name, None):
                raise ValueError(f"algo.{name} has no meaning for a generator (no token distribution)")

    def _apply_lora(self, lora_cfg) -> None:
        """LoRA through diffusers' peft integration (``add_adapter``), as diffusers' own LoRA
        training scripts do: the transformer stays the same object and ``disable_adapters``
        gives the reference model for free."""
        from peft import LoraConfig

        self.transformer.requires_grad_(False)
        targets = list(lora_cfg.target_modules or self.pipe.lora_targets)
        config = LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                            init_lora_weights="gaussian", target_modules=targets)
        with seeded(self.cfg.train.seed):  # the adapters' initial weights: the same on every rank and run
            self.transformer.add_adapter(config)
        if not any(p.requires_grad for p in self.transformer.parameters()):
            raise ValueError(f"model.lora.target_modules={targets} matched no layer of the transformer")

    def enable_gradient_checkpointing(self, options: dict) -> None:
        """diffusers' checkpointing of the transformer's blocks (it checkpoints whenever autograd
        records, so sampling, which runs without, is unchanged)."""
        self.transformer.enable_gradient_checkpointing(module_checkpoint(options))

    @contextlib.contextmanager
    def adapters_disabled(self):
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self.transformer.enable_adapters()

    @contextlib.contextmanager
    def _reference_velocity(self):
        """The pipeline's velocity runs the reference transformer inside this context."""
        with self.reference() as ref:
            live = self.pipe.transformer
            self.pipe.transformer = ref
            try:
                yield
            finally:
                self.pipe.transformer = live

    # -- the Policy interface -----------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """The trainer's RL step: seeds the noise and places the SDE window."""
        super().begin_step(step)
        self.rl_step = int(step)
        self._calls = 0

    def guidance(self, eval_mode: bool) -> float:
        d = self.d
        scale = d.eval_guidance_scale if eval_mode and d.eval_guidance_scale is not None else d.guidance_scale
        return float(self.pipe.default_guidance_scale if scale is None else scale)

    def output_size(self) -> tuple[int, int]:
        """(height, width) of a generated image or frame."""
        return int(self.d.height or self.pipe.default_height), int(self.d.width or self.pipe.default_width)

    def latent_shape(self) -> tuple[int, ...]:
        return self.pipe.latent_shape(*self.output_size(), self.d.num_frames)

    def _seed(self, *parts: int) -> int:
        # Evaluation (call -1) uses the same noise at every RL step: before/after compare like with like.
        step = 0 if parts[1] == -1 else self.rl_step
        return step_seed(self.cfg.train.seed, step, salt=hash(parts) & 0x7FFFFFFF)

    def _generator(self, *parts: int) -> torch.Generator:
        return torch.Generator().manual_seed(self._seed(*parts))

    def _noise(self, shape, *parts: int) -> torch.Tensor:
        return torch.randn(shape, generator=self._generator(*parts))

    @torch.no_grad()
    def rollout(self, examples: Sequence[dict], prompts: Sequence[str], n: int, mode: str = "train",
                need_old_logps: bool = False, need_ref_logps: bool = False) -> Rollouts:
        """``n`` samples per prompt. All randomness (initial noise, SDE noise, trained-step
        choice) is seeded by (train.seed, RL step, example index, sample number, call number), not by
        batch position, so results do not depend on ``rollout.batch_size`` and distributed workers
        given different examples never draw the same noise."""
        eval_mode = mode != "train"  # "sample" (pass@k): eval sampler, k initial noises per prompt
        d, algo = self.d, self.cfg.algo
        call = -1 if eval_mode else self._calls
        self._calls += 0 if eval_mode else 1
        num_steps = d.eval_num_steps if eval_mode else d.num_steps
        guidance = self.guidance(eval_mode)
        shape = self.latent_shape()
        sigmas = self.pipe.sigmas(num_steps, shape)
        group_ids = torch.arange(len(prompts)).repeat_interleave(n)
        texts, images = prompt_conditions(prompts, self.pipe, self.output_size(), f"model.path={self.cfg.model.path}",
                                          f"task {self.cfg.task.name!r}")
        sample_prompts = [text for text in texts for _ in range(n)]
        sample_images = None if images is None else images.repeat_interleave(n, dim=0)
        sample_examples = [examples[i] for i in group_ids.tolist()]
        keys = [(int(ex.get("_index", i)) if isinstance(ex, dict) else i, j)
                for i, ex in enumerate(examples) for j in range(n)]
        x0 = torch.stack([self._noise(shape, 1, call, idx, 0 if d.shared_noise else j) for idx, j in keys])
        if eval_mode:
            plan_sde = torch.zeros(num_steps, dtype=torch.bool)
            train_mask = torch.zeros(len(keys), num_steps)
        else:
            plan = step_plan(num_steps, d.sde_window_size, d.sde_window_range, d.sde_window_mode, self.rl_step,
                             d.sde_window_shift_every, self._generator(2, call))
            plan_sde = plan.sde
            train_mask = trained_steps(plan_sde, len(keys), d.train_steps_prefix, d.timestep_fraction,
                                       [self._generator(3, call, idx, j) for idx, j in keys])
        N, T = len(keys), num_steps
        latents = torch.zeros((N, T + 1, *shape)) if not eval_mode else None
        old_logps = torch.zeros(N, T)
        std = torch.zeros(N, T)
        old_means = torch.zeros((N, T, *shape)) if (d.grpo_guard and need_old_logps) else None
        finals = []
        batch = max(1, int(self.cfg.rollout.batch_size or N))
        for start in range(0, N, batch):
            rows = slice(start, min(start + batch, N))
            x = x0[rows].to(self.device)
            sde_noise = torch.stack([self._noise((T, *shape), 4, call, idx, j) for idx, j in keys[rows]])
            if latents is not None:
                latents[rows, 0] = x.cpu()
            for t in range(T):
                s = torch.full((x.shape[0],), float(sigmas[t]))
                v = self.velocity(x, s.to(self.device), sample_prompts[rows], guidance, _rows(sample_images, rows))
                if plan_sde[t]:
                    out = self._step(v, x, sigmas, t, noise=sde_noise[:, t].to(self.device))
                else:
                    out = ode_step(v, x, float(sigmas[t]), float(sigmas[t + 1]))
                x = out.prev_sample
                old_logps[rows, t] = out.log_prob.cpu()
                std[rows, t] = out.std.cpu()
                if latents is not None:
                    latents[rows, t + 1] = x.cpu()
                if old_means is not None:
                    old_means[rows, t] = out.mean.cpu()
            # what the pipeline decodes (a given first frame put back); the stored trajectory stays as sampled
            finals.append(self.pipe.final_latents(x, _rows(sample_images, rows)).cpu())
        final = torch.cat(finals)
        pixels = torch.cat([self.pipe.decode(final[i:i + batch].to(self.device)).cpu() for i in range(0, N, batch)])
        completions = [to_pil(p) for p in pixels]
        # A step with std 0 (CPS's last step) carries no log-prob: never an action.
        action_mask = train_mask * (std > 0).float() if not eval_mode else train_mask
        payload: dict[str, Any] = {"prompts": sample_prompts, "sigmas": sigmas.expand(N, -1).clone()}
        if sample_images is not None:
            payload["condition_images"] = sample_images
        if latents is not None:
            payload["latents"] = latents
        if old_means is not None:
            payload["old_means"] = old_means
        requires = set(LOSSES.get(algo.loss_type).loss_requires)
        if not eval_mode and requires & RENOISED_INPUTS:
            payload.update(self._renoised_inputs(final, sample_prompts, sample_images, sigmas, action_mask, keys, call,
                                                 guidance, requires, need_old_logps))
            old_logps = payload.pop("flow_matching_old_logps", old_logps)  # AWM's likelihood replaces the SDE one
        return Rollouts(group_ids=group_ids, action_mask=action_mask, completions=completions,
                        old_logps=old_logps if need_old_logps and not eval_mode else None,
                        examples=list(sample_examples), payload=payload)

    def _step(self, v, x, sigmas, t: int, noise=None, prev_sample=None) -> StepOutput:
        d = self.d
        extra = {"sigma_max": float(sigmas[1])} if d.sampler == "flow_sde" else {}
        return sde_step(d.sampler, v, x, float(sigmas[t]), float(sigmas[t + 1]), d.noise_level, noise=noise,
                        prev_sample=prev_sample, reduction=d.logp_reduction, **extra)

    def _renoised_inputs(self, final, prompts, images, sigmas, mask, keys, call, guidance, requires, need_old) -> dict:
        """The losses on the final sample re-noised at the trained steps' sigmas (AWM's
        ``flow_matching_logps``, DiffusionNFT's ``nft_errors``): fresh noise per (sample, step), and
        the sampling policy's velocity there where the loss needs it (NFT's v_old; the old
        flow-matching log-likelihood, for more than one iteration)."""
        N, T = mask.shape
        nft = "nft_errors" in requires
        fm_old = "flow_matching_logps" in requires and need_old
        noise = torch.stack([self._noise((T, *final.shape[1:]), 5, call, idx, j) for idx, j in keys])
        out: dict[str, Any] = {"fm_noise": noise}
        if "flow_matching_logps" in requires:
            out["flow_matching_old_logps"] = torch.zeros(N, T)
        if nft:
            out["old_velocity"] = torch.zeros_like(noise)
        if not (nft or fm_old):
            return out
        for t in range(T):
            rows = mask[:, t].nonzero().flatten()
            if len(rows) == 0:
                continue
            s = float(sigmas[t])
            x_s = noised(final[rows], noise[rows, t], s).to(self.device)
            v = self.velocity(x_s, torch.full((len(rows),), s, device=self.device),
                              [prompts[i] for i in rows.tolist()], guidance, _rows(images, rows)).cpu()
            if nft:
                out["old_velocity"][rows, t] = v
            if fm_old:
                out["flow_matching_old_logps"][rows, t] = awm_log_likelihood(v, final[rows], noise[rows, t])
        return out

    def velocity(self, x, sigma, prompts, guidance: float, images: torch.Tensor | None = None):
        """The pipeline's velocity under the policy's autocast (float32 out, as the steps want)."""
        with self.autocast():
            return self.pipe.velocity(x, sigma, prompts, guidance, *self._images_arg(images)).float()

    def _images_arg(self, images: torch.Tensor | None) -> tuple:
        """``velocity``'s fifth argument, for a conditioned pipeline only (text-only adapters take four)."""
        return () if images is None else (images.to(self.device),)

    def loss_terms(self, batch: Rollouts, objective, num_tokens: float, num_seqs: float):
        """For every micro-batch and every trained denoising step, that step's loss with gradient
        (per-timestep backward: activation memory of one step). The losses of all terms add up to
        the mini-batch loss because the aggregation normalisers are the mini-batch totals."""
        d = self.d
        guidance = self.guidance(False)
        advantages = batch.advantages.clamp(-d.adv_clip_max, d.adv_clip_max)
        mb = self.micro_batch_size
        for start in range(0, len(batch), mb):
            for t in range(batch.action_mask.shape[1]):
                rows = torch.arange(start, min(start + mb, len(batch)))
                rows = rows[batch.action_mask[rows, t] > 0]
                if len(rows):
                    yield self._step_loss(batch, rows, t, advantages[rows], objective, guidance, num_tokens, num_seqs)

    def _step_loss(self, batch: Rollouts, rows: torch.Tensor, t: int, adv: torch.Tensor, objective,
                   guidance: float, num_tokens: float, num_seqs: float) -> tuple[torch.Tensor, dict]:
        """The objective at denoising step ``t`` for samples ``rows`` (one action per sample), handed
        what its loss requires (module docstring)."""
        requires = set(objective.cfg.requires)
        p = batch.payload
        prompts = [p["prompts"][i] for i in rows.tolist()]
        images = self._images_arg(_rows(p.get("condition_images"), rows))
        sigmas = p["sigmas"][int(rows[0])]
        dev = self.device
        old = None if batch.old_logps is None else batch.old_logps[rows, t].to(dev)
        logp, extra = None, {}
        if "logps" in requires:
            logp, extra = self._sde_logps(p, rows, t, sigmas, prompts, images, guidance, old,
                                          objective.cfg.needs_reference)
        if requires & RENOISED_INPUTS:
            x0 = p["latents"][rows, -1].to(dev)
            noise = p["fm_noise"][rows, t].to(dev)
            s = float(sigmas[t])
            v = self.forward(self.pipe.velocity, noised(x0, noise, s), torch.full((len(rows),), s, device=dev),
                             prompts, guidance, *images)
            if "flow_matching_logps" in requires:
                logp = awm_log_likelihood(v, x0, noise)
            if "nft_errors" in requires:
                positive, negative = nft_errors(v, p["old_velocity"][rows, t].to(dev), x0, noise, beta=self.d.nft_beta)
                extra["inputs"] = {"positive": positive[:, None], "negative": negative[:, None],
                                   "adv_max": self.d.adv_clip_max}
        old = None if logp is None or old is None else old[:, None]  # likelihood-free: no log-probs
        return objective(None if logp is None else logp[:, None], old, adv.to(dev),
                         torch.ones(len(rows), 1, device=dev), num_tokens=num_tokens, num_seqs=num_seqs, **extra)

    def _sde_logps(self, p: dict, rows, t: int, sigmas, prompts, images: tuple, guidance: float, old,
                   with_reference: bool):
        """``(logp, extra)``: the (B,) SDE step log-probs of the taken transitions x_t -> x_{t+1}
        recomputed with gradient (GRPO-Guard's RatioNorm applied when on) and, for the KL, the
        policy's and the reference's step Gaussians as ``extra["gaussians"]``."""
        dev = self.device
        x, x_next = p["latents"][rows, t].to(dev), p["latents"][rows, t + 1].to(dev)
        s = torch.full((len(rows),), float(sigmas[t]), device=dev)
        v = self.forward(self.pipe.velocity, x, s, prompts, guidance, *images)  # through the prepared module
        out = self._step(v, x, sigmas, t, prev_sample=x_next)
        logp = out.log_prob
        if self.d.grpo_guard:
            old_lp = logp.detach() if old is None else old
            old_mean = out.mean.detach() if "old_means" not in p else p["old_means"][rows, t].to(dev)
            logp = old_lp + guard_log_ratio(logp, old_lp, out.mean, old_mean, out.std)
        if not with_reference:
            return logp, {}
        with torch.no_grad(), self._reference_velocity():
            ref = self._step(self.pipe.velocity(x, s, prompts, guidance, *images), x, sigmas, t, prev_sample=x_next)
        return logp, {"gaussians": GaussianActions(out.mean[:, None], ref.mean[:, None], out.std[:, None])}

    # -- checkpoints (full fine-tuning; LoRA adapters are saved by the policy base) ---------------
    def save_weights(self, path: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """``path/transformer``, diffusers' own layout (``state``: weights gathered from shards,
        written through a copy of the transformer: diffusers saves a module, not a state dict)."""
        transformer = self.transformer
        if state is not None:
            transformer = type(transformer).from_config(transformer.config)
            transformer.load_state_dict(state)
        transformer.save_pretrained(Path(path) / "transformer")

    def load_weights(self, path: Path) -> None:
        saved = type(self.transformer).from_pretrained(Path(path) / "transformer", torch_dtype=torch.float32)
        self.load_module_state(saved.state_dict())
        del saved

    export_library = "diffusers"

    def export_pretrained(self, out: Path, adapters: bool = False) -> None:
        export_generator(self, out, adapters)

