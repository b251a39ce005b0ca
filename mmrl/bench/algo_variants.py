"""The variants ``mmrl bench algos`` compares: each a name, its config overrides on top of a
common base (GRPO's advantage, symmetric clip, per-sequence token mean) and a one-line description;
a list of names is checked against them before anything trains. The table of variants and what
each stands for is in :mod:`mmrl.bench.algos`.
"""

from __future__ import annotations

from typing import Any, Sequence

# Applied to every variant first: GRPO's group mean/std advantage (the tiny recipe uses Dr. GRPO's),
# symmetric clipping (epsilon_high = epsilon; the tiny recipe sets DAPO's 0.28) and GRPO's
# per-sequence token mean, so that e.g. `grpo` and `dapo` differ as named.
BASE_OVERRIDES: tuple[str, ...] = ("algo.advantage=grpo", "algo.epsilon_high=null",
                                   "algo.loss_agg_mode=seq_mean_token_mean")

# ``{samples_per_step}`` is replaced by prompts_per_step x num_generations of the base config.
VARIANTS: dict[str, tuple[str, ...]] = {
    "grpo": (),
    "dr_grpo": ("algo.advantage=dr_grpo", "algo.loss_agg_mode=seq_mean_token_sum_norm"),
    "dapo": ("algo.epsilon_high=0.28", "algo.loss_agg_mode=token_mean", "algo.overlong_filter=true"),
    "gspo": ("algo.loss_type=gspo", "algo.epsilon=3e-4", "algo.epsilon_high=4e-4",
             "algo.loss_agg_mode=seq_mean_token_mean"),
    "spo": ("algo.advantage=spo", "rollout.num_generations=1", "train.prompts_per_step={samples_per_step}"),
    "ngrpo": ("algo.advantage=ngrpo",),
    "rloo": ("algo.advantage=rloo",),
    "reinforce_pp": ("algo.advantage=reinforce_pp",),
    "dapo_dynamic": ("algo.epsilon_high=0.28", "algo.loss_agg_mode=token_mean", "algo.overlong_filter=true",
                     "algo.selection=dynamic_sampling", "algo.max_num_gen_batches=3"),
    "variance_sampling": ("data.sampler=variance",),
    "scaf_grpo": ("algo.scaffold=true",),
    "tempsamp": ("algo.off_policy_guidance=1",),
}

DESCRIPTIONS: dict[str, str] = {
    "grpo": "group mean/std advantage, symmetric clip, per-sequence token mean",
    "dr_grpo": "no std division, seq_mean_token_sum_norm",
    "dapo": "clip-higher 0.28, token_mean, overlong filter",
    "gspo": "sequence-level ratio, clip 3e-4/4e-4",
    "spo": "per-prompt value tracker, 1 sample/prompt, same samples per step",
    "ngrpo": "virtual max-reward sample in the group stats",
    "rloo": "leave-one-out baseline",
    "reinforce_pp": "REINFORCE++ batch-normalised advantage",
    "dapo_dynamic": "dapo + dynamic sampling (zero-variance groups dropped, <= 3 generation rounds)",
    "variance_sampling": "MMR1 variance-aware prompt sampling (half of each batch by VPS)",
    "scaf_grpo": "Scaf-GRPO tiered hints for groups with no solved sample",
    "tempsamp": "TempSamp-R1: 1 reference completion per group, LUFFY-shaped off-policy weight",
}

DEFAULT_VARIANTS: tuple[str, ...] = ("grpo", "dr_grpo", "dapo", "gspo", "spo", "ngrpo")


class UnknownVariantError(ValueError):
    """A variant name that is not in :data:`VARIANTS`."""


def check_variants(variants: Sequence[str], table: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The variant names, checked against ``table`` (default: :data:`VARIANTS`)."""
    table = VARIANTS if table is None else table
    names = [v.strip() for v in variants if v.strip()]
    if not names:
        raise UnknownVariantError(f"no variants given (valid: {', '.join(table)})")
    bad = [v for v in names if v not in table]
    if bad:
        raise UnknownVariantError(
            f"unknown variant{'s' if len(bad) > 1 else ''} {', '.join(repr(b) for b in bad)} "
            f"(valid: {', '.join(table)})")
    dup = sorted({v for v in names if names.count(v) > 1})
    if dup:
        raise UnknownVariantError(f"variant listed twice: {', '.join(dup)}")
    return names


def variant_overrides(name: str, base_cfg: Any = None, table: dict[str, tuple[str, ...]] | None = None,
                      base: Sequence[str] | None = None) -> list[str]:
    """``base`` (default BASE_OVERRIDES) + the variant's overrides from ``table`` (default
    VARIANTS), with ``{samples_per_step}`` filled in from ``base_cfg`` (the recipe with the user's
    extra overrides)."""
    table = VARIANTS if table is None else table
    base = BASE_OVERRIDES if base is None else tuple(base)
    check_variants([name], table)
    samples = None
    if base_cfg is not None:
        samples = int(base_cfg.train.prompts_per_step) * int(base_cfg.rollout.num_generations)
    out: dict[str, str] = {}  # by key: a variant's setting replaces the base's
    for o in (*base, *table[name]):
        if "{samples_per_step}" in o:
            if samples is None:
                raise ValueError(f"variant {name!r} needs the base config to size its batch")
            o = o.replace("{samples_per_step}", str(samples))
        key = o.split("=", 1)[0]
        out.pop(key, None)
        out[key] = o
    return list(out.values())
