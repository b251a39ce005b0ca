"""Word-level text overlap: ROUGE-N and ROUGE-L F1, and the word error rate (WER).

The graded rewards of free-form and OCR answers in "Video-R1: Reinforcing Video Reasoning in MLLMs"
(Feng et al., 2025): free-form answers score the mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures,
OCR answers ``1 - WER`` clipped to [0, 1]. ROUGE is from "ROUGE: A Package for Automatic Evaluation
of Summaries" (Lin, 2004); the definitions follow Google's ``rouge_score`` package (which Video-R1
calls), written out here so that mmrl does not depend on it:

- tokens, two tokenizers: :func:`rouge_score_tokens` is ``rouge_score``'s with ``use_stemmer=True``
  (Video-R1's call: lower-cased, every run of characters other than ``a-z0-9`` a separator, tokens
  of more than 3 characters Porter-stemmed, :mod:`mmrl.measures.porter`); :func:`rouge_tokens`,
  the default here, keeps non-ASCII letters and digits (an answer in another script still scores)
  and stems nothing ("cats" and "cat" are different tokens);
- ROUGE-N: ``overlap = sum over n-grams of min(count in pred, count in ref)``,
  ``P = overlap / #pred n-grams``, ``R = overlap / #ref n-grams``, ``F1 = 2PR / (P + R)``;
- ROUGE-L: the same with ``overlap = LCS(pred, ref)`` (longest common token subsequence) and the
  token counts as denominators;
- an empty side (no n-grams) gives P or R = 0, hence F1 = 0, as in ``rouge_score``: a one-word
  answer has no bigram, so its ROUGE-2 is 0 even when it is right.

WER = word-level Levenshtein distance / number of reference words (at least 1), the reference and
hypothesis split on whitespace, case kept, as Video-R1's ``wer``. The distance is
:func:`mmrl.measures.text.levenshtein`, run on word lists instead of strings.

Like :mod:`mmrl.parsing`, nothing here raises on model output.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Sequence

from mmrl.measures.porter import stem
from mmrl.measures.text import levenshtein

_WORD_RE = re.compile(r"\w+")
_NON_ALNUM_RE = re.compile(r"[^a-z0-9]+")
Tokenizer = Callable[[str], list]


def rouge_tokens(text: str) -> list[str]:
    """The case-folded runs of word characters of ``text``: "The cat, sat!" -> [the, cat, sat]."""
    return _WORD_RE.findall(text.casefold()) if isinstance(text, str) else []


def rouge_score_tokens(text: str) -> list[str]:
    """``rouge_score``'s tokens with its Porter stemmer (``tokenize.tokenize``: ``text.lower()``,
    ``[^a-z0-9]+`` -> " ", split, ``stemmer.stem(x) if len(x) > 3 else x``):
    "The cats, running!" -> [the, cat, run]; "Café" -> [caf]."""
    if not isinstance(text, str):
        return []
    return [stem(t) if len(t) > 3 else t for t in _NON_ALNUM_RE.sub(" ", text.lower()).split()]


def _f1(overlap: int, n_pred: int, n_ref: int) -> float:
    precision = overlap / n_pred if n_pred else 0.0
    recall = overlap / n_ref if n_ref else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def rouge_n(pred: str, ref: str, n: int, tokenize: Tokenizer = rouge_tokens) -> float:
    """ROUGE-N F1 of ``pred`` against ``ref`` (clipped n-gram overlap, see the module docstring).

    >>> round(rouge_n("the cat sat on mat", "the cat lay on the mat", 1), 4)  # overlap 4: P 4/5, R 4/6
    0.7273
    """
    if n < 1:
        raise ValueError(f"rouge_n: n must be >= 1, got {n}")
    p, r = _ngrams(tokenize(pred), n), _ngrams(tokenize(ref), n)
    overlap = sum(min(count, r[gram]) for gram, count in p.items())
    return _f1(overlap, sum(p.values()), sum(r.values()))


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence of two sequences (O(len(a) * len(b)) time,
    O(min) memory).

    >>> lcs_length("the cat sat on mat".split(), "the cat lay on the mat".split())  # the cat on mat
    4
    """
    if len(a) < len(b):
        a, b = b, a  # b is the shorter: the rows are len(b) + 1 long
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def rouge_l(pred: str, ref: str, tokenize: Tokenizer = rouge_tokens) -> float:
    """ROUGE-L F1 of ``pred`` against ``ref``: ``P = LCS / #pred tokens``, ``R = LCS / #ref tokens``."""
    p, r = tokenize(pred), tokenize(ref)
    return _f1(lcs_length(p, r), len(p), len(r))


def rouge_mean(pred: str, ref: str, tokenize: Tokenizer = rouge_tokens) -> float:
    """The mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures, in [0, 1] (Video-R1's free-form
    reward with ``tokenize=rouge_score_tokens``)."""
    return (rouge_n(pred, ref, 1, tokenize) + rouge_n(pred, ref, 2, tokenize) + rouge_l(pred, ref, tokenize)) / 3.0


def word_error_rate(pred: str, ref: str) -> float:
    """Word-level Levenshtein distance of ``pred`` to ``ref`` over the number of reference words
    (at least 1), both split on whitespace, case kept. 0.0 for a perfect transcript; can exceed 1
    when the hypothesis has extra words.

    >>> word_error_rate("the cat sit", "the cat sat")  # one substitution over 3 reference words
    0.3333333333333333
    """
    hyp = pred.split() if isinstance(pred, str) else []
    words = ref.split() if isinstance(ref, str) else []
    return levenshtein(hyp, words) / max(1, len(words))
