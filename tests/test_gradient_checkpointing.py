"""train.gradient_checkpointing: the VLM's language model and vision tower (transformers) and the
generator's transformer (diffusers) recompute their layers in the backward pass. Float32, through
the policy's own training path (loss_terms, the module in training mode): the gradients equal the
un-checkpointed step to 1e-6 on the tiny Qwen2.5-VL (tower trained; LoRA; shared prefix, whose
cache must survive the recomputation; padding-free; reentrant), a tiny family model, the tiny
generator, and FSDP2 on two CPU processes (the VLM's step, the generator's run) against one
without checkpointing; the recomputation is counted (each attention runs twice) and the bytes kept
for the backward pass are measured (saved tensors and the checkpoints' own inputs, weights left
out), not assumed. Rollouts do not change."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.registry import TASKS
from mmrl.vlm.policy import VLMPolicy
from test_shared_prefix import _groups

GC_ON = ("train.gradient_checkpointing=true",)


# -- measuring tools ------------------------------------------------------------------------------
class Kept:
    """Bytes the autograd graph keeps for the backward pass while it is open: every tensor saved
    for backward outside a checkpoint (each storage once) plus the inputs each checkpoint holds to
    recompute from (the saved tensors inside a checkpoint are dropped and rebuilt, so only these
    stay); the parameters (:meth:`weights`) left out, they are kept anyway. ``checkpoint`` is
    installed where the library reads it (``monkeypatch``)."""

    def __init__(self):
        self.storages: dict[int, int] = {}
        self.checkpoints = 0
        self.parameters: set[int] = set()

    def weights(self, module) -> None:
        self.parameters |= {p.untyped_storage().data_ptr() for p in module.parameters()}

    def _add(self, t) -> None:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            if s.data_ptr() not in self.parameters:
                self.storages[s.data_ptr()] = s.nbytes()

    def pack(self, t):
        self._add(t)
        return t

    def wrap(self, checkpoint):
        def counted(function, *args, **kwargs):
            self.checkpoints += 1
            for a in args:
                self._add(a)
            return checkpoint(function, *args, **kwargs)
        return counted

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


def _attention_calls(module) -> list[int]:
    """A counter of the attention modules' forwards (recomputed ones included: a checkpointed layer
    wraps its ``forward``, so its submodules' hooks fire again in the backward pass)."""
    calls = [0]
    for name, m in module.named_modules():
        if name.endswith(("self_attn", ".attn")):
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


# -- the VLM --------------------------------------------------------------------------------------
def _vlm(path, *overrides) -> VLMPolicy:
    return VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", "rollout.temperature=0.7", *overrides))


def _scored(policy, batch):
    """``batch`` with old log-probs off the current ones (some ratios clipped) and advantages."""
    batch.off_policy = None
    noise = 0.25 * torch.randn(batch.action_mask.shape, generator=torch.Generator().manual_seed(0))
    batch.old_logps = policy.score(batch, reference=False) + noise
    batch.advantages = torch.linspace(-1.0, 1.0, len(batch))
    return batch


def _update_grads(policy, batch, kept: Kept | None = None, cfg: ObjectiveConfig | None = None):
    """The gradients of one update's loss terms (the policy's training path: loss_terms puts the
    module in training mode), and the loss; the objective ``cfg`` (default: the clip loss with an
    entropy bonus)."""
    policy.module.zero_grad(set_to_none=True)
    objective = Objective(cfg or ObjectiveConfig(entropy_coef=0.01))
    total = 0.0
    hooks = torch.autograd.graph.saved_tensors_hooks(kept.pack, lambda t: t) if kept else None
    terms = policy.loss_terms(batch, objective, float(batch.action_mask.sum()), float(len(batch)))
    while True:
        with policy.autocast():
            if hooks:
                with hooks:
                    term = next(terms, None)
            else:
                term = next(terms, None)
        if term is None:
            break
        term[0].backward()
        total += float(term[0].detach())
    return total, {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.grad is not None}


def _assert_same_update(a, b):
    assert a[0] == pytest.approx(b[0], rel=1e-6, abs=1e-7)
    assert a[1].keys() == b[1].keys() and a[1]
    for name, g in b[1].items():
        torch.testing.assert_close(a[1][name], g, rtol=1e-5, atol=1e-6, msg=name)


def _pair(path, *overrides, batch_of=_groups):
    """The same update without and with checkpointing (same weights, same batch): both results and
    the attention forwards counted in each."""
    out = []
    batch = None
    for gc in (False, True):
        policy = _vlm(path, *overrides, *(GC_ON if gc else ()))
        if batch is None:
            batch = _scored(policy, batch_of(policy))
        calls = _attention_calls(policy.module)
        result = _update_grads(policy, batch)
        out.append((result, calls[0]))
    (plain, plain_calls), (gc, gc_calls) = out
    _assert_same_update(gc, plain)
    return plain_calls, gc_calls


@pytest.mark.slow
def test_tiny_vlm_language_model_and_vision_tower(random_tiny_dir):
    """The tower trained, padded micro-batches of 3 (two forwards), no shared prefix: equal
    gradients, every parameter's; the checkpointed update ran each attention (the tower's blocks and
    the decoder layers) a second time, in the backward pass."""
    plain, gc = _pair(random_tiny_dir, "vlm.freeze_vision=false", "train.shared_prefix=false",
                      "train.micro_batch_size=3")
    assert plain > 0 and gc == 2 * plain


@pytest.mark.slow
def test_reentrant_checkpointing(random_tiny_dir):
    """train.gradient_checkpointing_kwargs.use_reentrant=true (transformers makes the embeddings'
    output require grad for it): the same gradients on the padded forward; with the shared prefix
    (its keys/values would carry no gradient out of a reentrant checkpoint) it is refused."""
    from mmrl.config import ConfigError

    reentrant = "train.gradient_checkpointing_kwargs.use_reentrant=true"
    plain, gc = _pair(random_tiny_dir, "vlm.freeze_vision=false", "train.shared_prefix=false", reentrant)
    assert gc == 2 * plain
    with pytest.raises(ConfigError, match="use_reentrant=true.*train.shared_prefix=false"):
        _vlm(random_tiny_dir, *GC_ON, reentrant)


@pytest.mark.slow
def test_lora(random_tiny_dir):
    """LoRA on a frozen base: the adapters' gradients equal, the layers recomputed."""
    plain, gc = _pair(random_tiny_dir, "model.lora.enabled=true", "model.lora.r=4", "train.shared_prefix=false")
    assert gc == 2 * plain


@pytest.mark.slow
def test_shared_prefix_keeps_its_cache(random_tiny_dir):
    """The prompt pass writes the cache, the completion pass reads it; both recomputed in the
    backward pass with the cache kept (transformers would drop it): the gradients of the plain
    shared-prefix update, which equals the per-sample one (tests/test_shared_prefix.py)."""
    plain, gc = _pair(random_tiny_dir, "vlm.freeze_vision=false", "train.shared_prefix=true")
    assert gc == 2 * plain
    per_sample = _vlm(random_tiny_dir, "vlm.freeze_vision=false", "train.shared_prefix=false", *GC_ON)
    shared = _vlm(random_tiny_dir, "vlm.freeze_vision=false", "train.shared_prefix=true", *GC_ON)
    batch = _scored(shared, _groups(shared))
    _assert_same_update(_update_grads(shared, batch), _update_grads(per_sample, batch))


@pytest.mark.slow
def test_padding_free(random_tiny_dir):
    plain, gc = _pair(random_tiny_dir, "vlm.freeze_vision=false", "train.padding_free=true")
    assert gc == 2 * plain


@pytest.mark.slow
def test_a_tiny_family_model(tmp_path):
    """Gemma 3 (SigLIP tower, sliding-window layers), built from its config."""
    from mmrl.registry import load_plugins
    from mmrl.vlm.tiny_builders import tokenizer_corpus
    from test_vlm_families import _counting
    from vlm_family_models import BUILDERS

    load_plugins()
    corpus = tokenizer_corpus([TASKS.get("counting")(), TASKS.get("grounding")()], per_task=100)
    path = BUILDERS["gemma3"](tmp_path / "gemma3", corpus)

    def batch_of(policy):
        exs, prompts = _counting(2)
        return policy.rollout_given(exs * 2, prompts * 2, ["<answer>3</answer>", "yes", "no", "<answer>12</answer>"],
                                    need_old_logps=False, need_ref_logps=False)

    plain, gc = _pair(path, "vlm.freeze_vision=false", "rollout.max_completion_length=8", batch_of=batch_of)
    assert plain > 0 and gc == 2 * plain


@pytest.mark.slow
def test_checkpointing_keeps_fewer_bytes_for_the_backward_pass(random_tiny_dir, monkeypatch):
    """Measured on the tiny model's update (tower trained, one forward of 6 samples): what the
    graph keeps with checkpointing is a fraction of what it keeps without."""
    import transformers.modeling_utils as modeling_utils

    kept = {}
    batch = None
    for gc in (False, True):
        meter = Kept()
        monkeypatch.setattr(modeling_utils, "checkpoint", meter.wrap(modeling_utils.checkpoint))
        policy = _vlm(random_tiny_dir, "vlm.freeze_vision=false", "train.shared_prefix=false", *(GC_ON if gc else ()))
        if batch is None:
            batch = _scored(policy, _groups(policy))
        meter.weights(policy.module)
        _update_grads(policy, batch, meter)
        kept[gc] = meter.bytes
        assert (meter.checkpoints > 0) == gc
    assert kept[True] < 0.5 * kept[False], kept


@pytest.mark.slow
def test_rollouts_do_not_change(random_tiny_dir):
    """Generation runs in eval mode without gradients: the same completions (sampled from one
    seed) and log-probs, the key/value cache used as without checkpointing."""
    from mmrl.core.seeding import seeded

    out = []
    for gc in (False, True):
        policy = _vlm(random_tiny_dir, "rollout.max_completion_length=8", *(GC_ON if gc else ()))
        task = TASKS.get("counting")()
        exs = [task.examples("train")[0]] * 2
        prompts = [task.prompt(exs[0])] * 2
        with seeded(3):
            batch = policy.rollout(exs, prompts, 2, "train", need_old_logps=True, need_ref_logps=False)
        out.append(batch)
    assert [c.tolist() for c in out[0].payload["completion_ids"]] == [c.tolist() for c in out[1].payload["completion_ids"]]
    torch.testing.assert_close(out[0].old_logps, out[1].old_logps)


# -- FSDP2 ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_fsdp2_on_two_processes_equals_one_process_without_it(kind, random_tiny_dir, tmp_path):
    """tests/dist_worker.py's step (gloo, 2 CPU processes, weights sharded layer by layer; FSDP2
    hooks stay outside the checkpoint, which wraps each layer's forward): with checkpointing, the
    loss, the whole gradients and the updated weights of one process without it."""
    from test_distributed import LAUNCH_ENV, LORA, launch_together

    extra = LORA if kind == "lora" else ()
    launch_together((1, ("step", random_tiny_dir, tmp_path / "one.pt", *extra), None),
                    (2, ("step", random_tiny_dir, tmp_path / "two.pt", *extra, *GC_ON), LAUNCH_ENV["FSDP2"]))
    one, two = (torch.load(tmp_path / f"{n}.pt", weights_only=False) for n in ("one", "two"))
    assert (one["world"], two["world"], two["backend"]) == (1, 2, "FSDP2")
    for key in ("loss", "pg_loss", "grad_norm", "ratio_mean"):
        assert abs(one["metrics"][key] - two["metrics"][key]) < 2e-6, key
    assert one["grads"].keys() == two["grads"].keys() and one["grads"]
    for name, g in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], g, rtol=1e-5, atol=1e-7, msg=name)
    for name, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w, rtol=0, atol=1e-5, msg=name)
    if kind == "full":  # the sharded update does call the checkpoint: an option it rejects when called fails it
        bad = "train.gradient_checkpointing_kwargs.determinism_check=bogus"
        out = launch_together((2, ("step", random_tiny_dir, tmp_path / "bad.pt", *GC_ON, bad), LAUNCH_ENV["FSDP2"]),
                              check=False)[0]
        assert out.returncode != 0 and "determinism_check" in out.stderr


@pytest.mark.slow
def test_fsdp2_generator_run_equals_one_process_without_it(tiny_flow_dir, tmp_path):
    """tests/dist_worker.py's generator run (2 steps, 2 iterations each) on 2 CPU processes under
    FSDP2 with checkpointing (diffusers checkpoints each block's call, FSDP2's hooks inside: the
    recomputation gathers the block's shards again) against one process without it: the same
    training rows and, to Adam's float-order noise as in tests/test_distributed.py, weights; the
    checkpoints are called (the negative control of the VLM case)."""
    from test_distributed import LAUNCH_ENV, assert_rows_close, launch_together, train_rows, weights

    one, two, bad = tmp_path / "one", tmp_path / "two", tmp_path / "bad"
    outs = launch_together((1, ("run", tiny_flow_dir, one, 2), None),
                           (2, ("run", tiny_flow_dir, two, 2, *GC_ON), LAUNCH_ENV["FSDP2"]),
                           (2, ("run", tiny_flow_dir, bad, 2, *GC_ON,
                                "train.gradient_checkpointing_kwargs.determinism_check=bogus"), LAUNCH_ENV["FSDP2"]),
                           check=False)
    assert outs[0].returncode == 0 and outs[1].returncode == 0, outs[1].stderr[-3000:]
    assert "FSDP2" in outs[1].stdout and outs[2].returncode != 0 and "determinism_check" in outs[2].stderr
    a, b = train_rows(one), train_rows(two)
    assert sorted(a) == sorted(b) == [1, 2]
    for step in a:
        assert_rows_close(a[step], b[step], 1e-4)
    wa, wb = weights(one), weights(two)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-3


# -- the generator --------------------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_generator(tmp_path, monkeypatch):
    """The tiny flow generator (diffusers' SD3 transformer): one update's gradients equal, and the
    checkpointed blocks keep fewer bytes for the backward pass."""
    import mmrl.core.activation_checkpointing as ac
    from mmrl.diffusion.tiny import new_tiny_models, save_tiny
    from test_diffusion_policy import EXAMPLES, PROMPTS, policy_for

    path = save_tiny(tmp_path / "gen", *new_tiny_models(seed=0, width=32, layers=2))
    results, kept, batch = {}, {}, None
    for gc in (False, True):
        meter = Kept()
        monkeypatch.setattr(ac, "checkpoint", meter.wrap(torch.utils.checkpoint.checkpoint))
        policy = policy_for(path, *(GC_ON if gc else ()))
        if batch is None:
            batch = policy.rollout(EXAMPLES, PROMPTS, 2, "train", need_old_logps=True, need_ref_logps=False)
            batch.advantages = torch.linspace(-1, 1, len(batch))
            batch.old_logps = batch.old_logps + 0.1 * torch.randn(batch.old_logps.shape,
                                                                  generator=torch.Generator().manual_seed(0))
        meter.weights(policy.module)
        results[gc] = _update_grads(policy, batch, meter, ObjectiveConfig.from_algo(policy.cfg.algo))
        kept[gc] = meter.bytes
        assert (meter.checkpoints > 0) == gc
    _assert_same_update(results[True], results[False])
    assert kept[True] < 0.5 * kept[False], kept


# -- setup ----------------------------------------------------------------------------------------
def test_options_are_checked_and_default_to_non_reentrant():
    from mmrl.core.activation_checkpointing import checkpoint_options

    assert checkpoint_options({}) == {"use_reentrant": False}
    assert checkpoint_options({"preserve_rng_state": False}) == {"use_reentrant": False, "preserve_rng_state": False}
    with pytest.raises(ValueError, match="train.gradient_checkpointing_kwargs.*use_reentrent"):
        checkpoint_options({"use_reentrent": False})


def test_a_policy_without_it_is_refused():
    from mmrl.core.policy import PolicyBase

    class Plain(PolicyBase):
        def __init__(self, cfg):
            super().__init__(cfg, torch.device("cpu"))
            self.module = torch.nn.Linear(2, 2)
            self.finish_setup()

    with pytest.raises(ValueError, match="train.gradient_checkpointing=true: Plain"):
        Plain(make_config(*GC_ON))
