"""Off-policy guidance: reference completions injected into GRPO groups ("TempSamp-R1: Effective
Temporal Sampling with Reinforcement Fine-Tuning for Video LLMs"), weighted with the policy
shaping of "Learning to Reason under Off-Policy Guidance" (LUFFY). Hand-worked checks of
``off_policy_shaped_loss`` and ``policy_loss(off_policy=...)``, then ``VLMPolicy.rollout_given``
on a randomly initialised tiny Qwen2.5-VL."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import make_config, close, f64
from mmrl.core.losses import Objective, ObjectiveConfig, policy_loss
from mmrl.core.losses import off_policy_shaped_loss
from mmrl.core.rollouts import Rollouts

D = torch.float64
t = f64


# ---- the shaped loss -------------------------------------------------------------------------


def test_shaped_loss_value_and_gradient():
    """gamma = 0.1, A = 2, token probabilities p = [0.1, 0.5, 0.9]:
    f(p) = p / (p + 0.1) = [0.5, 0.8333333, 0.9] -> pg = -A * f = [-1.0, -1.6666667, -1.8].
    d pg / d logp = -A * gamma * p / (p + gamma)^2:
        p = 0.1: -2 * 0.1 * 0.1 / 0.04 = -0.5
        p = 0.5: -2 * 0.1 * 0.5 / 0.36 = -0.2777778
        p = 0.9: -2 * 0.1 * 0.9 / 1.00 = -0.18
    The unshaped weight p would give -A * p = [-0.2, -1.0, -1.8]: shaping turns the order around
    and pushes hardest on the improbable tokens of the guidance."""
    logps = t([[math.log(0.1), math.log(0.5), math.log(0.9)]]).requires_grad_(True)
    pg = off_policy_shaped_loss(logps, t([2.0]), 0.1)
    assert pg.shape == (1, 3)
    assert close(pg, [[-1.0, -5.0 / 3.0, -1.8]])
    pg.sum().backward()
    assert close(logps.grad, [[-0.5, -1.0 / 3.6, -0.18]])
    assert close(off_policy_shaped_loss(t([[math.log(0.5)]]), t([[2.0]]), 0.1), [[-1.6666667]])


# ---- policy_loss with off_policy ---------------------------------------------------------------


def _run(logps, old, adv, mask, cfg, **kw):
    x = t(logps).requires_grad_(True)
    loss, metrics = policy_loss(x, t(old), t(adv), t(mask), cfg, **kw)
    loss.backward()
    return loss, x.grad, metrics


# row 0 on-policy: A = +1, ratios [1.5, 0.9] (+1 padding slot); row 1 off-policy: A = -1, p = [0.5, 0.1, 0.9]
# with old log-probs log 2 above them (ratio 0.5: would be clipped low if it were on-policy).
MIXED = dict(
    logps=[[math.log(0.6), math.log(0.45), 0.0], [math.log(0.5), math.log(0.1), math.log(0.9)]],
    old=[[math.log(0.4), math.log(0.5), 0.0], [math.log(1.0), math.log(0.2), math.log(1.8)]],
    adv=[1.0, -1.0],
    mask=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]],
)


def test_mixed_batch_on_policy_rows_clip_off_policy_rows_are_shaped():
    """token_mean over 5 tokens, eps 0.2, gamma 0.1.
    Row 0 (on-policy, A = +1, ratios [1.5, 0.9]): clipped surrogate [-1.2, -0.9], grad [0, -0.9/5].
    Row 1 (off-policy, A = -1, p = [0.5, 0.1, 0.9]): pg = -f(p) * A = [0.8333333, 0.5, 0.9],
    grad = -A * 0.1 * p / (p + 0.1)^2 / 5 = [0.1388889, 0.25, 0.09] / 5
    = [0.0277778, 0.05, 0.018].
    loss = (-1.2 - 0.9 + 0.8333333 + 0.5 + 0.9) / 5 = 0.1333333 / 5 = 0.0266667.
    Metrics: off_policy_frac 3/5 = 0.6; clip_frac_high 1/5 = 0.2 (row 0, token 0); clip_frac_low 0
    (row 1's ratios 0.5 are not counted: off-policy tokens are never clipped). Without off_policy,
    row 1 is the surrogate, clipped at 0.8 (0.8 per token, no gradient; clip_frac_low 3/5) and
    row 0's loss terms and gradient are the same as above."""
    loss, grad, m = _run(**MIXED, cfg=ObjectiveConfig(), off_policy=torch.tensor([False, True]))
    assert close(loss, 0.1333333 / 5)
    assert close(grad, [[0.0, -0.18, 0.0], [0.1388889 / 5, 0.05, 0.018]])
    assert close(m["off_policy_frac"], 0.6) and close(m["clip_frac_high"], 0.2)
    assert m["clip_frac_low"] == 0.0 and close(m["pg_loss"], 0.1333333 / 5)

    plain_loss, plain_grad, pm = _run(**MIXED, cfg=ObjectiveConfig())
    assert close(plain_loss, (-1.2 - 0.9 + 3 * 0.8) / 5)
    assert torch.equal(plain_grad[0], grad[0]) and close(plain_grad[1], [0.0, 0.0, 0.0])
    assert close(pm["clip_frac_low"], 0.6) and "off_policy_frac" not in pm


def test_off_policy_gamma_is_configurable_and_validated():
    """gamma = 0.5, p = 0.5, A = 1: pg = -0.5 / 1.0 = -0.5 (one token, token_mean)."""
    assert ObjectiveConfig().off_policy_gamma == 0.1
    loss, grad, _ = _run([[math.log(0.5)]], [[0.0]], [1.0], [[1.0]], ObjectiveConfig(off_policy_gamma=0.5),
                         off_policy=torch.tensor([True]))
    assert close(loss, -0.5) and close(grad, [[-0.5 * 0.5 / 1.0]])
    for bad in (0.0, -0.1):
        with pytest.raises(ValueError, match="off_policy_gamma"):
            ObjectiveConfig(off_policy_gamma=bad)
    from mmrl.config.schema import AlgoConfig

    assert ObjectiveConfig.from_algo(AlgoConfig(off_policy_gamma=0.3)).off_policy_gamma == 0.3
    assert ObjectiveConfig.from_algo(AlgoConfig()).off_policy_gamma == 0.1
    with pytest.raises(AttributeError, match="off_policy_gamma"):  # one source of truth: no silent default
        ObjectiveConfig.from_algo(SimpleNamespace(**{k: v for k, v in vars(AlgoConfig()).items()
                                                     if k != "off_policy_gamma"}))
    with pytest.raises(ValueError, match="off_policy must have shape"):
        policy_loss(t([[0.0]]), None, t([1.0]), t([[1.0]]), ObjectiveConfig(), off_policy=torch.tensor([True, False]))


@pytest.mark.parametrize("cfg_kw", [
    dict(),
    dict(loss_type="gspo", loss_agg_mode="seq_mean_token_mean"),
    dict(loss_type="cispo", epsilon_high=0.28),
    dict(loss_type="reg_grpo", loss_agg_mode="seq_mean_token_mean"),
    dict(dual_clip_c=3.0, beta=0.04, kl_estimator="k2"),
    dict(entropy_coef=0.01, top_entropy_quantile=0.5, kl_cov_ratio=0.2),
    dict(clip_cov_ratio=0.2, clip_cov_lb=-10.0, clip_cov_ub=10.0, loss_agg_mode="seq_mean_token_sum_norm",
         max_completion_length=6),
])
def test_all_false_is_bit_identical(cfg_kw):
    """off_policy all False (or None) must not change one bit of the loss or its gradient, for
    every loss type and zoo option; the only new metric is off_policy_frac = 0."""
    g = torch.Generator().manual_seed(7)
    logps = -torch.rand(4, 6, generator=g, dtype=D) * 2
    old = logps + 0.3 * torch.randn(4, 6, generator=g, dtype=D)
    ref = logps + 0.2 * torch.randn(4, 6, generator=g, dtype=D)
    ent = torch.rand(4, 6, generator=g, dtype=D)
    adv = torch.randn(4, generator=g, dtype=D)
    mask = (torch.arange(6) < torch.tensor([6, 4, 1, 5])[:, None]).to(D)
    cfg = ObjectiveConfig(**cfg_kw)
    out = []
    for off in (None, torch.zeros(4, dtype=torch.bool)):
        x = logps.clone().requires_grad_(True)
        e = ent.clone().requires_grad_(True)
        loss, m = policy_loss(x, old, adv, mask, cfg, ref_logps=ref, entropies=e,
                              generator=torch.Generator().manual_seed(0), off_policy=off)
        loss.backward()
        out.append((loss, x.grad, e.grad, m))
    (l0, g0, e0, m0), (l1, g1, e1, m1) = out
    assert torch.equal(l0, l1) and torch.equal(g0, g1)
    assert (e0 is None and e1 is None) or torch.equal(e0, e1)
    assert m1.pop("off_policy_frac") == 0.0 and m0 == m1


# ---- VLMPolicy.rollout_given ---------------------------------------------------------------------


def _policy(path, *overrides):
    from mmrl.vlm.policy import VLMPolicy

    return VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", *overrides))


def _examples(n=2, task="counting"):
    from mmrl.registry import TASKS

    tk = TASKS.get(task)()
    exs = [tk.examples("train")[i] for i in range(n)]
    return exs, [tk.prompt(e) for e in exs], [tk.target(e) for e in exs]


def test_rollout_given_teacher_forces_the_completion(random_tiny_dir):
    """Each reference completion becomes one off-policy sample: its text tokens then <|im_end|>
    (the id a generated Qwen chat completion stops with), decoded back to the same text, with
    the prompt encoded as for generation and log-probs equal to a direct forward of the batch."""
    policy = _policy(random_tiny_dir, "train.micro_batch_size=1")
    exs, prompts, targets = _examples(3)
    batch = policy.rollout_given(exs, prompts, targets, need_old_logps=True, need_ref_logps=False)
    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in policy.eos_ids
    assert len(batch) == 3 and batch.group_ids.tolist() == [0, 1, 2]
    assert batch.off_policy.tolist() == [True] * 3 and batch.truncated.tolist() == [False] * 3
    assert batch.completions == targets and batch.examples == exs
    assert set(batch.payload) == {"prompt_ids", "completion_ids", "pixel_values", "image_grid_thw", "video"}
    assert batch.payload["video"] == [None] * len(batch)  # image prompts: no clip inputs
    enc, _ = policy.encode_prompts(prompts)
    for i, text in enumerate(targets):
        tokens = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = batch.payload["completion_ids"][i]
        assert ids[:-1].tolist() == tokens and ids[-1].item() == im_end
        assert batch.action_mask[i].sum().item() == len(tokens) + 1
        assert torch.equal(batch.payload["prompt_ids"][i], enc["input_ids"][i][enc["attention_mask"][i].bool()])
        assert batch.payload["pixel_values"][i] is not None
    assert batch.ref_logps is None and batch.old_logps.shape == batch.action_mask.shape
    real = batch.action_mask > 0
    assert torch.isfinite(batch.old_logps).all() and (batch.old_logps[real] < 0).all()
    assert (batch.old_logps[~real] == 0).all()
    with torch.no_grad():  # micro-batches of 1 (no padding) vs the whole padded batch at once
        direct = policy.completion_logps(policy.model.eval(), batch).cpu()
    assert torch.allclose(batch.old_logps, direct, atol=1e-5)


def test_rollout_given_truncates_at_the_length_limit(random_tiny_dir):
    """max_completion_length 5 < 17 tokens: the first 5 text tokens, no stop token, truncated;
    the completion text is the decoding of those ids. A 4-token text fits with its stop token
    (5 slots); a 5-token one does not (it fills the budget without stopping)."""
    policy = _policy(random_tiny_dir, "rollout.max_completion_length=5")
    exs, prompts, targets = _examples(1)
    tokens = policy.tokenizer(targets[0], add_special_tokens=False)["input_ids"]
    assert len(tokens) > 5
    four, five = policy.decode(torch.tensor(tokens[:4])), policy.decode(torch.tensor(tokens[:5]))
    batch = policy.rollout_given(exs * 3, prompts * 3, [targets[0], four, five],
                                 need_old_logps=False, need_ref_logps=False)
    ids = batch.payload["completion_ids"]
    assert ids[0].tolist() == tokens[:5] and ids[2].tolist() == tokens[:5]
    assert ids[1].tolist() == tokens[:4] + [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert batch.truncated.tolist() == [True, False, True]
    assert batch.action_mask.sum(1).tolist() == [5, 5, 5]
    assert batch.completions == [five, four, five]
    assert batch.old_logps is None and batch.ref_logps is None


@pytest.mark.slow
def test_mixed_batch_trains(random_tiny_dir):
    """A generated group per prompt plus one reference completion per prompt, concatenated, goes
    through train_step: the objective sees off_policy (off_policy_frac > 0) and the loss is finite."""
    policy = _policy(random_tiny_dir, "train.micro_batch_size=4", "train.learning_rate=1e-3")
    policy.configure_optimizer(policy.cfg.train, 10)
    exs, prompts, targets = _examples(2)
    torch.manual_seed(5)
    on = policy.rollout(exs, prompts, 2, "train", need_old_logps=True, need_ref_logps=False)
    off = policy.rollout_given(exs, prompts, targets, need_old_logps=True, need_ref_logps=False)
    batch = Rollouts.concat([on, off])
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 3]
    assert batch.off_policy.tolist() == [False] * 4 + [True] * 2
    batch.advantages = torch.tensor([1.0, -1.0, -0.5, 0.5, 1.0, 1.0])
    before = policy.model.lm_head.weight.detach().clone()
    obj = Objective(ObjectiveConfig())
    m = policy.train_step(batch, obj, num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    assert m["off_policy_frac"] > 0
    assert not torch.equal(before, policy.model.lm_head.weight)


def test_rollout_given_refuses_vision_placeholders(random_tiny_dir):
    """A completion with <|image_pad|> would break the re-scoring forward (image features and
    image tokens no longer match): refused up front, as generate suppresses it."""
    policy = _policy(random_tiny_dir)
    exs, prompts, _ = _examples(1)
    with pytest.raises(ValueError, match="vision placeholder"):
        policy.rollout_given(exs, prompts, ["<answer><|image_pad|></answer>"], False, False)
    with pytest.raises(ValueError, match="one of each"):
        policy.rollout_given(exs, prompts, ["a", "b"], False, False)
