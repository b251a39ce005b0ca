"""train.shared_prefix: each distinct prompt of a micro-batch runs once and the completions attend
to its cached keys/values. Log-probs, entropies and every gradient equal the per-sample forward
for Qwen2-VL, Qwen2.5-VL and Qwen3-VL (mRoPE positions after the vision block), with LoRA and
the reference model too, and a whole train_step reports the same loss and gradient norm."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.registry import TASKS
from mmrl.vlm.logprobs import split_head
from mmrl.vlm.policy import VLMPolicy
from mmrl.vlm.shared_prefix import check_supported, prompt_groups, uses_shared_prefix
from test_vision_once import family_dirs  # noqa: F401  (the tiny Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoints)

# Completions of 8, 3 and 14 tokens (with the stop token): different lengths, right-padded.
COMPLETIONS = ["<answer>3</answer>", "yes", "<think>two and one</think><answer>12</answer>"]


def _groups(policy, copies=3):
    """2 prompts of different lengths (counting, grounding) x ``copies`` teacher-forced completions."""
    exs = [TASKS.get(name)().examples("train")[0] for name in ("counting", "grounding")]
    prompts = [TASKS.get(name)().prompt(ex) for name, ex in zip(("counting", "grounding"), exs)]
    rep = [i for i in range(2) for _ in range(copies)]
    batch = policy.rollout_given([exs[i] for i in rep], [prompts[i] for i in rep],
                                 [COMPLETIONS[k % 3] for k in range(len(rep))], need_old_logps=False,
                                 need_ref_logps=False)
    assert len({len(p) for p in batch.payload["prompt_ids"]}) == 2  # prompts left-padded in the plain batch
    assert len({len(c) for c in batch.payload["completion_ids"]}) == 3
    return batch


def _forward(policy, batch, shared=False, padding_free=False):
    """Log-probs, entropies and the gradients of a loss on both: plain, shared-prefix or packed."""
    policy.shared_prefix, policy.cfg.train.padding_free = shared, padding_free
    policy.module.zero_grad(set_to_none=True)
    with policy.autocast():
        logps, entropy = policy.completion_logps(policy.module, batch, with_entropy=True)
    (logps.sum() * 0.1 + entropy.sum() * 0.05).backward()
    grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.grad is not None}
    return logps.detach(), entropy.detach(), grads


def _assert_equal(shared, plain):
    torch.testing.assert_close(shared[0], plain[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(shared[1], plain[1], rtol=1e-4, atol=1e-5)
    assert shared[2].keys() == plain[2].keys()
    for name, g in plain[2].items():
        torch.testing.assert_close(shared[2][name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_equal_to_the_per_sample_forward(family, family_dirs):  # noqa: F811
    """Vision tower trained, temperature 0.7: values and all gradients as the plain forward, and
    each prompt's image is encoded once per forward (2 images, not 6)."""
    policy = VLMPolicy(make_config(f"model.path={family_dirs[family]}", "train.device=cpu",
                                   "vlm.freeze_vision=false", "rollout.temperature=0.7"))
    batch = _groups(policy)
    plain = _forward(policy, batch, shared=False)
    encoder = policy.image_encoders[0]
    seen = encoder.images_seen
    shared = _forward(policy, batch, shared=True)
    assert encoder.images_seen - seen == 2  # only the 2 distinct prompts ran with their images
    assert any("visual" in n for n in shared[2]) and any("lm_head" in n or "embed" in n for n in shared[2])
    _assert_equal(shared, plain)


@pytest.mark.slow
def test_lora_reference_and_split_groups(random_tiny_dir):
    """LoRA (frozen base) with micro-batches of 4 that cut a group in two (a prompt of one sample
    next to a shared one): training gradients and the reference model's scores as plain."""
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "model.lora.enabled=true",
                                   "model.lora.r=4", "train.micro_batch_size=4"))
    batch = _groups(policy)
    _assert_equal(_forward(policy, batch, shared=True), _forward(policy, batch, shared=False))
    assert all("lora" in n for n in _forward(policy, batch, shared=True)[2])
    scores = {}
    for shared in (False, True):
        policy.shared_prefix = shared
        scores[shared] = (policy.score(batch, reference=False), policy.score(batch, reference=True))
    for a, b in zip(scores[True], scores[False]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_train_step_metrics_equal(random_tiny_dir):
    """A whole train_step (clipped loss, KL to the reference, entropy bonus) with and without
    train.shared_prefix, from the same weights: the same loss, KL, entropy and gradient norm."""
    metrics, batch = {}, None
    for shared in (False, True):
        policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "vlm.freeze_vision=false",
                                       f"train.shared_prefix={str(shared).lower()}", "algo.beta=0.04"))
        if batch is None:  # one batch, old and reference log-probs of the plain forward, for both runs
            batch = _groups(policy)
            batch.off_policy = None  # scored as sampled completions (the clipped ratio), not as guidance
            noise = 0.25 * torch.randn(batch.action_mask.shape, generator=torch.Generator().manual_seed(0))
            batch.old_logps = policy.score(batch, reference=False) + noise  # ratios off 1: some tokens clipped
            batch.ref_logps = policy.score(batch, reference=True) + 0.02
            batch.advantages = torch.tensor([1.0, -0.5, -0.5, 0.8, 0.2, -1.0])
        policy.configure_optimizer(policy.cfg.train, 2)
        objective = Objective(ObjectiveConfig(beta=0.04, entropy_coef=0.01))
        metrics[shared] = policy.train_step(batch, objective, float(batch.action_mask.sum()), 6.0)
    assert metrics[True].keys() == metrics[False].keys() and metrics[False]["grad_norm"] > 0
    assert metrics[False]["clip_frac_low"] > 0 and metrics[False]["clip_frac_high"] > 0
    # Tight: the tiny random model is nearly position-blind; completions shifted by one position
    # (a wrong rope offset) move the policy loss by about 5e-5, relatively.
    for key, value in metrics[False].items():
        assert metrics[True][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_prompts_are_shared_only_when_ids_and_pixels_are_equal():
    ids, other = torch.tensor([1, 2, 3]), torch.tensor([1, 3, 2])  # same length and sum, other order
    img, grid = torch.ones(4, 6), torch.tensor([[1, 2, 2]])
    reps, index = prompt_groups([ids, ids, other, ids], [img, img, img, img * 2], [grid] * 4)
    assert reps == [0, 2, 3] and index.tolist() == [0, 0, 1, 2]  # row 3: same text, another image
    assert prompt_groups([ids, other], [None, None], [None, None]) is None  # nothing to share: plain forward


def test_sliding_window_models_are_refused(random_tiny_dir):
    """A cache that keeps only the window would show the completions less of the prompt: set,
    the key is refused; unset, such a model runs the plain forward."""
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu"))
    backbone = split_head(policy.module)[0]
    check_supported(backbone)
    backbone.config.text_config.use_sliding_window = True
    with pytest.raises(ValueError, match="train.shared_prefix=false"):
        check_supported(backbone)
    with pytest.raises(ValueError, match="sliding-window"):
        uses_shared_prefix(True, False, backbone)
    assert uses_shared_prefix(None, False, backbone) is False


def test_unset_it_is_on_wherever_it_applies(random_tiny_dir):
    """The default: on for a full-attention model (what the policy scores with), off beside
    train.padding_free (which packs instead), and an explicit false is kept."""
    assert VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu")).shared_prefix is True
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "train.padding_free=true"))
    assert policy.shared_prefix is False
    backbone = split_head(policy.module)[0]
    assert uses_shared_prefix(False, False, backbone) is False
    assert uses_shared_prefix(None, True, backbone) is False and uses_shared_prefix(None, False, backbone) is True


def test_text_only_prompts(random_tiny_dir):
    """Prompts without images (1D positions): the same values and gradients as plain."""
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu"))
    prompts = [[{"role": "user", "content": "Count the shapes."}],
               [{"role": "user", "content": "Where is it? Answer."}]]
    rep = [prompts[i] for i in range(2) for _ in range(3)]
    batch = policy.rollout_given([{}] * 6, rep, [COMPLETIONS[k % 3] for k in range(6)], need_old_logps=False,
                                 need_ref_logps=False)
    assert all(p is None for p in batch.payload["pixel_values"])
    _assert_equal(_forward(policy, batch, shared=True), _forward(policy, batch, shared=False))


def test_a_generator_run_refuses_the_key():
    """Generators have no prompt tokens to share: the key set there stops the run at setup."""
    from mmrl.config import ConfigError, check_unused_keys
    from mmrl.diffusion.policy import DiffusionPolicy

    with pytest.raises(ConfigError, match="train.shared_prefix"):
        check_unused_keys(make_config("train.shared_prefix=true"), DiffusionPolicy.unused_config, "a DiffusionPolicy")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl"])  # Qwen3-VL videos are refused (processing.py)
def test_video_prompts(family, family_dirs):  # noqa: F811
    """Video prompts (video QA and temporal grounding, 3 samples each, the tower trained): values
    and all gradients as the plain forward, each distinct video encoded once per forward."""
    from test_static_cache import VIDEO_BUDGET, _prompts

    policy = VLMPolicy(make_config(f"model.path={family_dirs[family]}", "train.device=cpu", "vlm.freeze_vision=false",
                                   *VIDEO_BUDGET))
    examples, prompts = _prompts("video")
    rep = [0, 0, 0, 2, 2, 2]  # one video QA and one temporal grounding prompt, 3 samples each
    batch = policy.rollout_given([examples[i] for i in rep], [prompts[i] for i in rep],
                                 [COMPLETIONS[k % 3] for k in range(6)], need_old_logps=False, need_ref_logps=False)
    assert all(v is not None for v in batch.payload["video"])
    assert prompt_groups(batch.payload["prompt_ids"], batch.payload["pixel_values"], batch.payload["image_grid_thw"],
                         batch.payload["video"])[1].tolist() == [0, 0, 0, 1, 1, 1]
    plain = _forward(policy, batch, shared=False)
    [encoder] = policy.video_encoders
    seen = encoder.images_seen
    shared = _forward(policy, batch, shared=True)
    assert encoder.images_seen - seen == 2
    assert any("visual" in n for n in shared[2])
    _assert_equal(shared, plain)


def test_the_cache_goes_by_the_name_the_model_declares(random_tiny_dir):
    """transformers renamed ``past_key_values`` to ``cache`` in 5.24 (the old name warns on every forward
    until 5.40); the vLLM environment pins transformers < 5.20, which knows only the old one. A class
    that declares neither would drop an unknown keyword into ``**kwargs`` and run without the cache:
    refused. The shared pass itself prints no warning of either name (transformers' logger included)."""
    import logging
    import warnings

    from mmrl.vlm.kv_cache import cache_keyword

    class Current:
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    class Before524:
        def forward(self, input_ids=None, past_key_values=None, **kwargs): ...

    class Neither:
        def forward(self, input_ids=None, **kwargs): ...

    assert cache_keyword(Current()) == "cache" and cache_keyword(Before524()) == "past_key_values"
    with pytest.raises(TypeError, match="Neither.forward takes neither `cache` nor `past_key_values`"):
        cache_keyword(Neither())

    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu"))
    batch = _groups(policy)
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    hf_logger = logging.getLogger("transformers")
    level = hf_logger.level
    hf_logger.addHandler(handler)
    hf_logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _forward(policy, batch, shared=True)
    finally:
        hf_logger.removeHandler(handler)
        hf_logger.setLevel(level)
    said = [str(w.message) for w in seen] + logged
    assert not [m for m in said if "past_key_values" in m or "cache" in m], said
