"""``jigsaw_position``: partial credit for a jigsaw answer, the fraction of tiles placed right.

How answers are read and scored is :mod:`mmrl.measures.jigsaw`; this module registers the reward.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.jigsaw import tile_score


@register_reward("jigsaw_position")
def jigsaw_position(completions, examples, require_permutation: bool = False) -> list:
    """Fraction of tiles whose predicted place equals the true one, from the ``<answer>`` block.

    ``score = #{p : pred[p] == truth[p]} / n`` over the n places, so "2 0 3 1" against truth
    "2 0 3 1" is 1.0, "2 0 1 3" is 0.5 and "0 1 2 3" is 0.0. None when there is no answer block,
    the answer does not hold exactly n numbers, or the example has no truth. A constant guess
    ("0 0 0 0") scores 1/n, the same as a random permutation in expectation;
    ``require_permutation=True`` scores answers that are not a permutation of 0..n-1 at 0.0.
    Never raises on any text; a batch length mismatch (a caller bug) does.
    """
    return score_each("jigsaw_position", completions, examples,
                      lambda c, ex: tile_score(c, ex, require_permutation))
