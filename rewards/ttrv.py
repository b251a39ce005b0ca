"""Label-free test-time rewards from a group's own answers, after "TTRV: Test-Time Reinforcement
Learning for Vision Language Models".

TTRV samples each test prompt several times and rewards (a) answers that are frequent in the
group (a frequency reward, a soft form of majority voting) and (b) groups whose answer
distribution has low entropy (diversity control). The exact formulas below are our reading of
the paper, not a copy of its code:

* ``ttrv_agreement``: sample i of a group of K samples scores ``c(a_i) / K``, where ``a_i`` is its
  answer and ``c(a)`` the number of samples of the group with answer ``a`` (i included). So a
  unanimous group scores 1.0 everywhere and a lone answer 1/K.
* ``ttrv_low_entropy``: every sample of the group scores ``1 - H(p) / log K`` with
  ``p(a) = c(a) / K`` and ``H(p) = -sum_a p(a) log p(a)``: 1.0 when all agree, 0.0 when all
  differ. A group of one scores 1.0 (0.0 if its answer is unparsable).

Answers are the last ``<answer>`` block (:func:`mmrl.parsing.extract_answer`), compared
after :func:`~mmrl.parsing.normalize`; a whole-number answer compares as a number ("2",
"2.0", "two" and "2." agree). An unparsable answer (no block, or an empty one) is not a vote:
it counts in K, adds to nobody's count, its own agreement is None (scored 0.0 by
:class:`mmrl.core.reward_computer.RewardComputer` and counted as unparsable), and for the entropy it is
its own singleton answer (many unparsable answers are maximal diversity, not agreement).

Groups come from ``group_ids`` (N,), the per-call context the trainer passes: sample i belongs to prompt
group ``group_ids[i]``. Without it the whole batch is one group.

Use on an unlabelled eval set (no task option is needed; any task whose examples lack answers
works, since these rewards never read ``ex["answer"]``)::

    task:
      rewards: {ttrv_agreement: 1.0, ttrv_low_entropy: 0.2}

Note: ``ttrv_low_entropy`` is the same for every sample of a group, so group-relative advantages
(grpo, dr_grpo, rloo, ...) cancel it; it shapes learning only with a batch-level baseline (e.g.
``reinforce_pp``) or a batch-level reward aggregation (``algo.reward_aggregation: zscore``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from typing import Optional

from mmrl import register_reward
from mmrl.measures.batch import check_batch
from mmrl.parsing import extract_answer, normalize, parse_exact_number


def answer_key(completion) -> Optional[Hashable]:
    """What a completion votes for: ``("number", value)`` for a whole-number answer, else
    ``("text", normalised answer)``; None when there is no (or an empty) answer block."""
    answer = extract_answer(completion)
    if answer is None:
        return None
    number = parse_exact_number(answer)
    if number is not None:
        return ("number", number + 0.0)  # -0.0 and 0.0 agree
    text = normalize(answer)
    return ("text", text) if text else None


def _groups(group_ids, n: int) -> list:
    """One hashable group id per sample; all 0 without ``group_ids``."""
    if group_ids is None:
        return [0] * n
    ids = group_ids.tolist() if hasattr(group_ids, "tolist") else group_ids
    if not isinstance(ids, (list, tuple)) or len(ids) != n:
        size = len(ids) if isinstance(ids, (list, tuple)) else "a scalar"
        raise ValueError(f"group_ids has {size} entries for {n} completions")
    return [tuple(g) if isinstance(g, list) else g for g in ids]


def _members(groups: list) -> dict:
    out: dict = {}
    for i, g in enumerate(groups):
        out.setdefault(g, []).append(i)
    return out


@register_reward("ttrv_agreement")
def ttrv_agreement(completions, examples, group_ids=None) -> list:
    """``c(a_i) / K``: the fraction of sample i's group (K samples) that gave its answer.

    Hand-worked, one group of 4 answering 2, 2.0, 3, (none): the 2s score 2/4 = 0.5 each, the 3
    scores 1/4, the unparsable one None. Never raises on any text; a batch length mismatch or
    ``group_ids`` of the wrong length (caller bugs) do.
    """
    check_batch("ttrv_agreement", completions, examples)
    keys = [answer_key(c) for c in completions]
    out: list = [None] * len(completions)
    for members in _members(_groups(group_ids, len(completions))).values():
        votes = Counter(keys[i] for i in members if keys[i] is not None)
        for i in members:
            if keys[i] is not None:
                out[i] = votes[keys[i]] / len(members)
    return out


@register_reward("ttrv_low_entropy")
def ttrv_low_entropy(completions, examples, group_ids=None) -> list[float]:
    """``1 - H(p) / log K`` of the group's answer distribution, the same for all its samples.

    Hand-worked, one group of 4 answering a, a, a, b: p = (3/4, 1/4), H = -(0.75 ln 0.75 +
    0.25 ln 0.25) = 0.5623, log 4 = 1.3863, score 1 - 0.4056 = 0.5944. Answers a, a, b, b:
    H = ln 2, score 1 - ln 2 / ln 4 = 0.5. Never None; never raises on any text.
    """
    check_batch("ttrv_low_entropy", completions, examples)
    keys = [answer_key(c) for c in completions]
    out: list[float] = [0.0] * len(completions)
    for members in _members(_groups(group_ids, len(completions))).values():
        k = len(members)
        # Each unparsable answer is its own singleton: it adds diversity, never agreement.
        counts = Counter(keys[i] if keys[i] is not None else ("unparsable", i) for i in members)
        if k == 1:
            score = 1.0 if keys[members[0]] is not None else 0.0
        else:
            entropy = -sum((c / k) * math.log(c / k) for c in counts.values())
            score = min(1.0, max(0.0, 1.0 - entropy / math.log(k)))
            score = 0.0 if score < 1e-12 else score  # all differ: exactly 0, not float noise
        for i in members:
            out[i] = score
    return out
