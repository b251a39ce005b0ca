"""Perturbation sampling: which examples of a round are perturbed, how, and with which partner.

From "Vision Matters: Simple Visual Perturbations Can Boost Multimodal Math Reasoning" (Li et al.,
2025): training on perturbed inputs makes a model rely on what it sees rather than on text priors.
``data.perturbation`` names a registered perturbation (or ``random``: one of them drawn per
example), each example is perturbed with probability ``data.perturbation_prob``, and a
perturbation that mixes in another input (``needs_other``: distractor, mixup) gets another training
example as its partner. This stage only draws; the policy applies the draw to the inputs it reads
(``policy.perturb``), since only it knows where they are in an example.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

import numpy as np

from mmrl.registry import PERTURBATIONS

from mmrl.config.options import check_options


def check_perturbation(name: str | None, options: Mapping[str, Any], policy) -> None:
    """Setup-time check of ``data.perturbation`` / ``data.perturbation_kwargs``: a policy that reads
    images (capability ``image_inputs``), and options that the perturbation(s) take by name."""
    if name is None:
        if options:
            raise ValueError(f"data.perturbation_kwargs {dict(options)} set without a data.perturbation: "
                             "set one (e.g. rotation, random) or remove the kwargs")
        return
    if "image_inputs" not in policy.capabilities:
        raise ValueError(f"data.perturbation={name!r} perturbs input images; a {type(policy).__name__} reads none")
    fns = [PERTURBATIONS.get(k, "data.perturbation") for k in (PERTURBATIONS.names() if name == "random" else [name])]
    # A perturbation's inputs (what it perturbs, the rng, the partner) are its parameters without a
    # default; its options are the others.
    inputs = {n for fn in fns for n, p in inspect.signature(fn).parameters.items() if p.default is p.empty}
    check_options(fns, options, "data.perturbation_kwargs", f"the {name} perturbation", inputs)


def perturb_examples(examples: Sequence[dict], policy, name: str, prob: float, options: Mapping[str, Any],
                     partners: Sequence[dict], rng: np.random.Generator) -> list[dict]:
    """``examples`` with each one perturbed by ``policy.perturb`` with probability ``prob`` (the
    kind: ``name``, or for ``random`` one drawn uniformly; the partner, where the kind needs one: an
    example of ``partners`` drawn uniformly), every draw from ``rng``."""
    kinds = PERTURBATIONS.names()
    out = []
    for ex in examples:
        if rng.random() >= prob:
            out.append(ex)
            continue
        kind = str(rng.choice(kinds)) if name == "random" else name
        other = partners[int(rng.integers(len(partners)))] if PERTURBATIONS.get(kind).needs_other else None
        out.append(policy.perturb(ex, kind, rng, other, dict(options)))
    return out
