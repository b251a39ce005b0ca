"""The typed config schema. Key names follow TRL / verl where those exist.

A recipe YAML file sets any subset of these keys; dotted overrides on the command line
(``algo.epsilon_high=0.28``) go on top. ``mmrl.config`` loads, validates and saves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    # Module-name suffixes to adapt (peft's target_modules); None = the model family's default
    # (VLM: the language model's attention and MLP projections; generators: the transformer's attention).
    target_modules: Optional[list[str]] = None


@dataclass
class ModelConfig:
    # "tiny" = the built-in tiny Qwen2.5-VL in mmrl/assets; otherwise a local checkpoint directory or a
    # hub id (org/name: the Hugging Face cache, downloaded there unless HF_HUB_OFFLINE=1; docs/hub-ids.md).
    path: str = "tiny"
    # A hub id's branch, tag or commit (TRL's model_revision); None = main. A run's config.yaml records the
    # commit it loaded here, so a resume or `mmrl eval` loads the same weights.
    revision: Optional[str] = None
    # The compute dtype: float32 | bfloat16 | float16. Trained weights are kept in float32
    # (master weights) and forward passes run under autocast in this dtype, unless train.optim
    # keeps them in bfloat16.
    dtype: str = "float32"
    lora: LoraConfig = field(default_factory=LoraConfig)
    attn_implementation: Optional[str] = None  # e.g. "sdpa", "flash_attention_2"
    # A 4-bit base (QLoRA, TRL's ModelConfig names; bitsandbytes, the `fit` extra): the language model's Linear
    # layers stored 4-bit, computed in model.dtype; needs model.lora.enabled=true (mmrl/vlm/quantization.py).
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "nf4"  # nf4 (QLoRA's NormalFloat) | fp4
    use_bnb_nested_quant: bool = False  # QLoRA's double quantization: the block scales quantized too


@dataclass
class VLMConfig:
    """Vision-language policies (``mmrl train vlm``): what only a VLM reads."""

    # Qwen-VL image budget (pixels after resizing); None keeps the checkpoint's own.
    min_pixels: Optional[int] = None
    max_pixels: Optional[int] = None
    # Coordinate space of the model's box answers: pixel | resized | rel1000 | norm; None = the
    # model family's (Qwen2.5-VL resized pixels, Qwen2-VL / Qwen3-VL 0-1000).
    box_space: Optional[str] = None
    freeze_vision: bool = False  # the vision tower is not trained (stored in the compute dtype)
    # transformers' image-processor backend: auto (torchvision on a GPU training device, else pil) |
    # pil | torchvision (resize / normalise / patchify on the training device, from uint8 tensors)
    image_processor_backend: str = "auto"
    # Qwen-VL video budget per frame (pixels after resizing; Video-R1 trains 7B at 128*28*28);
    # None keeps transformers' defaults (128*28*28 to 768*28*28). Applied by the video processor in
    # training, eval and the demo alike; frame sampling is the task's (task.options.video).
    video_min_pixels: Optional[int] = None
    video_max_pixels: Optional[int] = None


@dataclass
class RolloutConfig:
    engine: str = "hf"  # a registered rollout engine: hf (transformers generate) | vllm (colocated vLLM) | vllm_server
    # -- rollout.engine=vllm_server (vLLM's own server, `mmrl rollout-server`; TRL's vllm_server_* in spirit) --
    server_urls: list[str] = field(default_factory=list)  # base URLs of the servers, e.g. ["http://127.0.0.1:8000"]
    server_timeout: float = 240.0  # seconds one request may take before it is retried (TRL's vllm_server_timeout)
    server_retries: int = 3  # failed requests retried on another server this many times, then the step fails
    weight_sync_dir: Optional[str] = None  # vllm_server's pushed weights go to a private dir made in here (None: the temp dir); the servers read it
    # -- rollout.engine=vllm (TRL's names; vLLM runs in the training process) ------------------------
    vllm_gpu_memory_utilization: float = 0.3  # share of GPU memory for vLLM's weights + KV cache
    vllm_max_model_length: Optional[int] = None  # prompt + completion tokens; None = the checkpoint's
    vllm_limit_images: int = 1  # images per prompt at most (vLLM's limit_mm_per_prompt, verl's name)
    vllm_enable_sleep_mode: bool = False  # release vLLM's GPU memory between rollouts (CUDA only)
    # Old log-probs from the engine's own sampling log-probs instead of a trainer forward (no
    # importance-sampling correction then): faster, slightly off-policy.
    use_engine_logprobs: bool = False
    num_generations: int = 8  # samples per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_completion_length: int = 32
    batch_size: int = 64  # sequences generated at once; 0 = as many as fit (all, unless out of memory)
    merge_lora_for_generation: bool = True  # hf engine + LoRA: adapters folded into weight copies to generate
    # hf engine: seconds one generate call may run (transformers' max_time); past it the call stops,
    # its unfinished completions end there (truncated) and are counted in rollout_timeouts. 0: no limit.
    max_time: float = 0.0
    # hf engine: generate's KV cache (TRL's cache_implementation): "dynamic" (grown token by token) |
    # "static" (allocated once per call for prompt + completion: fixed shapes, which transformers
    # compiles, see compile_decode) | None (the default): static on a CUDA/XPU device in one process,
    # dynamic elsewhere (measured: README "Speed against TRL"). A model transformers does not mark
    # compilable (_can_compile_fullgraph) keeps the dynamic cache (with a warning if static was asked).
    cache_implementation: Optional[str] = None
    # hf engine with the static cache: let transformers compile the decode step where it does so by
    # itself (torch.compile, mode reduce-overhead, on CUDA/XPU devices; a CPU decodes eagerly);
    # false = its disable_compile (the static cache, uncompiled).
    compile_decode: bool = True
    # A multi-turn trajectory's next turn starts from the keys/values its earlier turns computed (the
    # hf engine's turn cache, exact to float rounding; vLLM: its prefix caching); false = every turn
    # reads the whole conversation again.
    turn_cache: bool = True
    # hf engine: the samples of one prompt (a GRPO group) share its prefill: each distinct prompt runs
    # through the language model once a generate call, its keys/values copied to the
    # group (exact to float rounding; Qwen-VL families with the dynamic cache, no video); false =
    # every sample computes its prompt (transformers' own way). vLLM: its prefix caching does this.
    group_prefill: bool = True


@dataclass
class LossConfig:
    """The policy loss's settings (``algo.*``), declared once: the run's :class:`AlgoConfig` has them,
    and the core's ``ObjectiveConfig`` is built from exactly these fields (no copy to drift)."""

    # -- the surrogate ------------------------------------------------------------------------------
    loss_type: str = "clip"  # clip (PPO/GRPO/DAPO) | gspo | reg_grpo | cispo
    epsilon: float = 0.2  # lower clip range
    epsilon_high: Optional[float] = None  # upper clip range (DAPO clip-higher); None = epsilon
    clip_pos: Optional[list[float]] = None  # NGRPO asymmetric clip: [low, high] where A >= 0
    clip_neg: Optional[list[float]] = None  # ... and where A < 0
    dual_clip_c: Optional[float] = None  # dual-clip cap for negative advantages (e.g. 3.0)
    reg_scale: float = 10.0  # reg_grpo: target log-ratio = A / reg_scale
    loss_agg_mode: str = "token_mean"  # token_mean | seq_mean_token_sum | seq_mean_token_mean | seq_mean_token_sum_norm
    # -- KL to the reference ------------------------------------------------------------------------
    beta: float = 0.0  # KL weight (the peak of kl_schedule); 0 = no reference model is loaded
    kl_estimator: str = "k3"  # k1 | k2 | k3
    # -- entropy control ----------------------------------------------------------------------------
    entropy_coef: float = 0.0  # entropy bonus
    top_entropy_quantile: Optional[float] = None  # Beyond 80/20: gradient only on the top-q entropy tokens
    clip_cov_ratio: Optional[float] = None  # Clip-Cov: fraction of high-covariance tokens detached
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: Optional[float] = None  # KL-Cov: fraction of top-covariance tokens KL-penalised
    kl_cov_coef: float = 1.0
    kl_cov_clip: bool = False  # KL-Cov keeps the PPO clip too (default: the paper's unclipped -A * ratio)
    # -- off-policy rows and the rollout-engine mismatch (TRL's names) ------------------------------
    off_policy_gamma: float = 0.1  # LUFFY policy shaping f(p) = p / (p + gamma) on off-policy tokens
    # Truncated importance sampling ("Your Efficient RL Framework Secretly Brings You Off-Policy RL
    # Training"): weight each token's loss by min(pi_train_old / pi_engine, clip_max) when the rollout
    # engine reports its own log-probs.
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "token_truncate"  # token_truncate | token_mask | sequence_truncate | sequence_mask
    vllm_importance_sampling_clip_max: float = 2.0
    vllm_importance_sampling_clip_min: Optional[float] = None


@dataclass
class AlgoConfig(LossConfig):
    """``algo.*``: the loss's settings (:class:`LossConfig`) and everything else of the algorithm."""

    # -- advantages (see the README's algorithm table) -------------------------------------------
    advantage: str = "grpo"  # grpo | dr_grpo | rloo | reinforce_pp | ngrpo | bnpo | stratified_grpo | spo
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)  # estimator options, e.g. {alpha: 0.5}
    scale_rewards: bool = True  # grpo: divide by the group std
    reward_aggregation: str = "weighted_sum"  # weighted_sum | zscore | group_zscore (per reward, then weighted)
    num_iterations: int = 1  # optimisation epochs per rollout batch (GRPO's mu)
    # -- KL schedule and reference resets (the weight, beta, is a LossConfig field) ----------------
    kl_schedule: str = "constant"  # constant | linear_decay | grpo_d (OThink-MR1)
    kl_schedule_kwargs: dict[str, Any] = field(default_factory=dict)  # beta_end, beta_min, ramp_frac
    ref_reset_every: int = 0  # ProRL: copy the policy into the reference every N steps (0 = never)
    # -- length shaping (DAPO) ----------------------------------------------------------------------
    overlong_filter: bool = False  # truncated completions are left out of the loss
    soft_overlong_buffer: int = 0  # tokens before max_completion_length where the penalty ramps
    soft_overlong_penalty: float = 1.0
    # -- what the batch trains on (see the README's data-selection table) ---------------------------
    selection: str = "none"  # none | dynamic_sampling (DAPO: drop zero-variance groups, refill)
    max_num_gen_batches: int = 4  # dynamic_sampling: generation rounds per step at most (verl's name)
    scaffold: bool = False  # Scaf-GRPO: tiered hints for groups where no sample is solved
    scaffold_kwargs: dict[str, Any] = field(default_factory=dict)  # exempt_frac, solved_reward
    difficulty_augmentation: bool = False  # DeepVideo-R1: re-roll all-solved groups harder, all-failed easier
    difficulty_augmentation_kwargs: dict[str, Any] = field(default_factory=dict)  # noise_std, solved_reward
    off_policy_guidance: int = 0  # TempSamp-R1: reference completions injected per group (of num_generations)
    # T-GRPO (Video-R1): per clip question, samples on shuffled frames too; the correct ordered
    # answers of a group that beats its shuffled twin (p > mu * p~) get +alpha.
    temporal_grpo: bool = False
    temporal_grpo_kwargs: dict[str, Any] = field(default_factory=dict)  # alpha, mu, shuffled_generations, reward, comparison


@dataclass
class DataConfig:
    # Which train examples each step draws: uniform (seeded epochs) | variance (MMR1 variance-aware
    # sampling) | dump (DUMP: UCB bandit over the data sources of a task mixture).
    sampler: str = "uniform"  # | weighted (each source by its weight, sampler_kwargs.weights)
    sampler_kwargs: dict[str, Any] = field(default_factory=dict)
    # mmrl sft: the fraction of reference completions trained without their <think> block (Think
    # or Not?'s thought dropout)
    thought_dropout: float = 0.0
    # Vision Matters perturbations of training images (boxes follow): None | distractor | mixup |
    # rotation | random (one of the three per example); applied with probability perturbation_prob.
    perturbation: Optional[str] = None
    perturbation_prob: float = 0.5
    perturbation_kwargs: dict[str, Any] = field(default_factory=dict)  # max_angle, max_mix


@dataclass
class DiffusionConfig:
    """Generator RL (``mmrl train diffusion``): the stochastic sampler and which denoising steps
    are actions. See the README's diffusion table for the papers behind each key."""

    sampler: str = "flow_sde"  # flow_sde (Flow-GRPO) | cps (coefficients-preserving) | dance (DanceGRPO)
    noise_level: float = 0.7  # flow_sde: a in std = a*sqrt(sigma/(1-sigma)); cps: a; dance: eta
    num_steps: int = 10  # denoising steps of training rollouts
    eval_num_steps: int = 20  # denoising steps at eval (denoising reduction: train with fewer)
    guidance_scale: Optional[float] = None  # CFG in training rollouts and updates; None = the model's default, 1 = off
    eval_guidance_scale: Optional[float] = None  # None = guidance_scale
    height: Optional[int] = None  # None = the model's default size
    width: Optional[int] = None
    num_frames: Optional[int] = None  # video generators (Wan)
    shared_noise: bool = False  # one initial noise per group (DanceGRPO); False = per sample (Flow-GRPO)
    # SDE window (Flow-GRPO-Fast / MixGRPO): only sde_window_size consecutive steps are stochastic
    # and trained, ODE elsewhere; 0 = every step is stochastic.
    sde_window_size: int = 0
    sde_window_range: Optional[list[int]] = None  # [first, last] start step of the window; None = anywhere
    sde_window_mode: str = "random"  # random (a seeded start each RL step) | sliding (MixGRPO: moves forward)
    sde_window_shift_every: int = 10  # sliding: RL steps before the window moves one denoising step
    timestep_fraction: float = 1.0  # DanceGRPO: train a random fraction of the stochastic steps per sample
    train_steps_prefix: int = 0  # >0: train only the first k denoising steps (sampling unchanged)
    logp_reduction: str = "mean"  # mean over latent dims (Flow-GRPO) | sum (the exact density)
    grpo_guard: bool = False  # GRPO-Guard RatioNorm: per-step re-centred, re-scaled log-ratio
    adv_clip_max: float = 5.0  # advantages clipped to +-adv_clip_max (Flow-GRPO); DiffusionNFT's A_max
    nft_beta: float = 1.0  # DiffusionNFT: v+ = b v + (1-b) v_old, v- = (1+b) v_old - b v
    # A diffusers family's own options, passed to its adapter: Wan 2.2's guidance_scale_2 (the low-noise
    # expert's guidance), Z-Image's cfg_normalization / cfg_truncation (docs/generators.md)
    pipeline_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    steps: int = 100  # RL steps (one rollout batch each)
    prompts_per_step: int = 8
    mini_batch_size: int = 0  # samples per optimizer step; 0 = the whole rollout batch
    micro_batch_size: int = 16  # samples per forward/backward (gradient accumulation)
    # An out-of-memory error halves the samples per forward (and the sequences per generate call)
    # and redoes the work; the smaller size is kept, or doubled back after this many calls in a
    # row that fit (0: kept for the rest of the run).
    oom_grow_back_steps: int = 0
    # VLM: each distinct prompt of a micro-batch runs once, its samples' completions attend to its
    # cached keys/values (Prefix Grouper); exact. Shares most with micro_batch_size a multiple of
    # rollout.num_generations. Unset: on wherever it applies (every layer full attention, no
    # padding_free); the tiny default's GRPO run took 0.73x the time with it (README).
    shared_prefix: Optional[bool] = None
    # VLM: each micro-batch's samples packed into one row with per-sample positions, no padding
    # (transformers' packed sequences; flash_attention_2 runs it varlen); exact. mmrl/vlm/packing.py
    padding_free: bool = False
    # with padding_free: micro-batches formed by tokens (prompt + completion) instead of samples,
    # at most this many tokens and micro_batch_size samples each (0: micro_batch_size samples)
    micro_batch_tokens: int = 0
    # Activation checkpointing (TRL's names) of the VLM's language model and vision tower / the generator's
    # transformer: each layer's activations recomputed in the backward pass instead of stored; exact.
    gradient_checkpointing: bool = False
    # torch.utils.checkpoint options, e.g. {use_reentrant: false} (the default: non-reentrant, as TRL's)
    gradient_checkpointing_kwargs: dict[str, Any] = field(default_factory=dict)
    # VLM on CUDA: the LM head, log-probs and GRPO loss fused in Liger's LigerFusedLinearGRPOLoss (TRL's
    # former GRPOConfig name; needs liger-kernel, the clip loss, algo.beta=0; mmrl/vlm/liger.py)
    use_liger_loss: bool = False
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    # The optimizer (transformers' TrainingArguments.optim; `mmrl list` shows the registered ones):
    # adamw_torch (torch AdamW on float32 master weights: 16 bytes per trained parameter) |
    # adamw_bf16 (torch AdamW on bfloat16 weights, TRL's pure bf16: 8 bytes, loses small updates) |
    # adamw_kahan (optimi's AdamW with Kahan summation on bfloat16 weights: 10 bytes) |
    # adamw_bf16_sr (torchao's AdamW with stochastic rounding on bfloat16 weights: 8 bytes) |
    # adamw_bnb_8bit = adamw_8bit | paged_adamw_8bit (bitsandbytes' 8-bit AdamW on float32 masters: 10 bytes).
    # The bf16-weight ones need model.dtype=bfloat16 (see mmrl.core.optimizer).
    optim: str = "adamw_torch"
    max_grad_norm: float = 1.0
    # An update whose gradient is NaN / inf is skipped (logged in skipped_steps.jsonl); this many
    # steps in a row with a skipped update stop the run with a checkpoint of the last good weights
    # (0: never stop).
    max_consecutive_skipped_steps: int = 5
    # Asynchronous training: rollouts of the next steps are generated (by an engine holding its own
    # weights, rollout.engine=vllm_server) while a step trains; a batch is at most max_staleness policy
    # versions old (older samples are dropped and counted). false: the on-policy loop.
    async_rollouts: bool = False
    max_staleness: int = 1
    # any transformers scheduler name, or mmrl's linear_horizon (mmrl/core/optimizer.py)
    lr_scheduler_type: str = "constant_with_warmup"
    lr_scheduler_kwargs: dict[str, Any] = field(default_factory=dict)  # the schedule's own options
    warmup_steps: int = 0
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:1 ...
    # torch CPU threads (the command line applies it, mmrl/config/threads.py): auto = the cores other work
    # leaves free (OMP_NUM_THREADS if set) | a number | 0 = torch's default (one per core)
    threads: Any = "auto"
    # Several processes (accelerate launch / torchrun): seconds a collective may wait for the
    # other ranks before the run stops with a timeout error naming it.
    distributed_timeout: float = 1800.0


@dataclass
class TaskConfig:
    name: str = "counting"
    # Reward weights by registry name; empty = the task's defaults.
    rewards: dict[str, float] = field(default_factory=dict)
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # task-specific options


@dataclass
class EvalConfig:
    num_examples: int = 64
    every: int = 0  # eval every N steps during training (0 = only before and after)
    temperature: float = 0.0  # 0 = greedy decoding
    num_generations: int = 1
    pass_k: int = 0  # k samples per example at rollout.temperature for pass@1 and pass@k (0 = off)
    before: bool = True  # evaluate the starting model too (for the before/after table)


@dataclass
class LogConfig:
    output_dir: str = "runs"
    run_name: Optional[str] = None  # default: <task>-<timestamp>
    log_every: int = 1
    # Experiment trackers (transformers' / TRL's key; docs/trackers.md): tensorboard, wandb, mlflow or
    # another of accelerate's; "all" = every installed one; [] or [none] = none. metrics.jsonl is
    # always written. tensorboard=false (the older switch, kept for recipes) drops tensorboard from it.
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    tensorboard: bool = True
    save_rollouts_every: int = 10  # save a few rollouts (image, prompt, completion, rewards)
    num_rollouts_to_save: int = 4
    save_every: int = 50  # checkpoint every N steps (and at the end); 0 = only at the end
    save_total_limit: int = 2
    progress: bool = True


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    vlm: VLMConfig = field(default_factory=VLMConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    log: LogConfig = field(default_factory=LogConfig)
    resume: bool = False
    # A resume whose config differs from the run's prints the differences and stops unless this is
    # true (`--allow-config-change`); the model, task and group size can never change mid-run.
    allow_config_change: bool = False
    plugins: list[str] = field(default_factory=list)  # modules or .py files to import
