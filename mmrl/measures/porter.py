"""The Porter stemmer as NLTK runs it by default (``PorterStemmer()``, mode ``NLTK_EXTENSIONS``): the
stemmer of Google's ``rouge_score`` with ``use_stemmer=True``, which Video-R1's free-form reward
turns on (:mod:`mmrl.measures.video_r1`).

"An algorithm for suffix stripping" (Porter, 1980), with Martin Porter's later changes and NLTK's
extensions: irregular forms (``skies`` -> ``sky``, ``dying`` -> ``die``, ``news``, ...), ``ies`` /
``ied`` of four letters -> ``ie``, ``y`` -> ``i`` only after a consonant that is not the first
letter, ``alli`` -> ``al`` before step 2, ``fulli`` -> ``ful`` and ``logi`` -> ``log``, and a
two-letter vowel-consonant stem counting as ``*o`` (cvc). Words of one or two letters are kept.

Terms as in the paper: a letter is a consonant unless it is a, e, i, o, u, or a ``y`` after a
consonant; ``m`` (the measure) is the number of vowel-consonant sequences ``VC`` in a stem. Each
step tries its rules in order and stops at the first whose suffix the word ends with, whether or not
that rule's condition holds. Written from the paper and NLTK's documented behaviour; checked against
NLTK 3.10 on a word list (``tests/test_video_rewards.py`` keeps hand-worked words).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

VOWELS = frozenset("aeiou")
IRREGULAR = {"skies": "sky", "sky": "sky", "dying": "die", "lying": "lie", "tying": "tie", "news": "news",
             "innings": "inning", "inning": "inning", "outings": "outing", "outing": "outing",
             "cannings": "canning", "canning": "canning", "howe": "howe", "proceed": "proceed",
             "exceed": "exceed", "succeed": "succeed"}

Rule = tuple[str, str, Optional[Callable[[str], bool]]]


def _consonants(word: str) -> list[bool]:
    flags: list[bool] = []
    for i, ch in enumerate(word):
        flags.append(ch not in VOWELS and (ch != "y" or i == 0 or not flags[i - 1]))
    return flags


def measure(stem: str) -> int:
    """The number of VC sequences: m("tr") = 0, m("trouble") = 1, m("troubles") = 2."""
    flags = _consonants(stem)
    return sum(1 for a, b in zip(flags, flags[1:]) if not a and b)


def _has_vowel(stem: str) -> bool:
    return not all(_consonants(stem))


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _consonants(word)[-1]


def _cvc(word: str) -> bool:
    """``*o``: consonant-vowel-consonant at the end, the last not w, x or y (NLTK: or a two-letter
    vowel-consonant word)."""
    c = _consonants(word)
    if len(word) >= 3:
        return c[-3] and not c[-2] and c[-1] and word[-1] not in "wxy"
    return len(word) == 2 and not c[0] and c[1]


def _m_above(n: int) -> Callable[[str], bool]:
    return lambda stem: measure(stem) > n


def _first_rule(word: str, rules: Sequence[Rule]) -> str:
    """The first rule whose suffix ends ``word`` decides: ``stem + replacement`` if its condition
    holds for the stem, else ``word`` unchanged."""
    for suffix, replacement, condition in rules:
        if word.endswith(suffix):
            stem = word[: len(word) - len(suffix)]
            return stem + replacement if condition is None or condition(stem) else word
    return word


def _step1a(w: str) -> str:
    if len(w) == 4 and w.endswith("ies"):
        return w[:-3] + "ie"
    return _first_rule(w, (("sses", "ss", None), ("ies", "i", None), ("ss", "ss", None), ("s", "", None)))


def _step1b(w: str) -> str:
    if w.endswith("ied"):
        return w[:-3] + ("ie" if len(w) == 4 else "i")
    if w.endswith("eed"):
        return w[:-1] if measure(w[:-3]) > 0 else w
    for suffix in ("ed", "ing"):
        if w.endswith(suffix) and _has_vowel(w[: -len(suffix)]):
            s = w[: -len(suffix)]
            break
    else:
        return w
    for suffix, replacement in (("at", "ate"), ("bl", "ble"), ("iz", "ize")):
        if s.endswith(suffix):
            return s[: -len(suffix)] + replacement
    if _double_consonant(s):
        return s[:-1] if s[-1] not in "lsz" else s
    return s + "e" if measure(s) == 1 and _cvc(s) else s


def _step1c(w: str) -> str:
    return w[:-1] + "i" if w.endswith("y") and len(w) > 2 and _consonants(w[:-1])[-1] else w


_STEP2: tuple[Rule, ...] = tuple((s, r, _m_above(0)) for s, r in (
    ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"), ("bli", "ble"),
    ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"), ("ization", "ize"), ("ation", "ate"),
    ("ator", "ate"), ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous"),
    ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("fulli", "ful"),
))


def _step2(w: str) -> str:
    if w.endswith("alli") and measure(w[:-4]) > 0:
        return _step2(w[:-4] + "al")
    rules = _STEP2 + (("logi", "log", lambda stem: measure(stem + "l") > 0),)
    return _first_rule(w, rules)


_STEP3: tuple[Rule, ...] = tuple((s, r, _m_above(0)) for s, r in (
    ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""), ("ness", ""),
))
_STEP4: tuple[Rule, ...] = tuple(
    (s, "", (lambda stem: measure(stem) > 1 and stem[-1:] in ("s", "t")) if s == "ion" else _m_above(1))
    for s in ("al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion", "ou",
              "ism", "ate", "iti", "ous", "ive", "ize")
)


def _step5(w: str) -> str:
    if w.endswith("e"):
        m = measure(w[:-1])
        if m > 1 or (m == 1 and not _cvc(w[:-1])):
            w = w[:-1]
    if w.endswith("ll") and measure(w[:-1]) > 1:
        w = w[:-1]
    return w


def stem(word: str) -> str:
    """The Porter stem of ``word`` (lower-cased first), as NLTK's default ``PorterStemmer().stem``:
    "running" -> "run", "cats" -> "cat", "generalization" -> "gener", "skies" -> "sky"."""
    w = word.lower()
    if w in IRREGULAR:
        return IRREGULAR[w]
    if len(w) <= 2:
        return w
    for step in (_step1a, _step1b, _step1c, _step2):
        w = step(w)
    w = _first_rule(_first_rule(w, _STEP3), _STEP4)
    return _step5(w)
