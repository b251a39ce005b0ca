"""Mathematical answer equivalence: the checker behind the ``math_answer`` reward and the
``visual_math`` task's metrics.

**Math-Verify decides** (huggingface/Math-Verify, a base dependency: the answer checker of TRL's
and Open-R1's ``accuracy_reward`` and of verl's math rewards). The call is TRL's::

    verify(parse(gold, extraction_mode="first_match"), parse(pred, extraction_mode="first_match"))

with Math-Verify's default extraction (LaTeX, then plain expressions), gold first (``verify`` is not
symmetric). TRL parses a whole completion and reads the prediction only from ``\\boxed{}`` or a
"final answer is" anchor; here the prediction is already the ``<answer>`` block's content, so it is
parsed like the gold, and both sides are read as LaTeX (``$...$`` added to a text holding no
``$``, ``\\(`` or ``\\[``). Math-Verify's own rules therefore hold: 6-place rounding when a
decimal is involved ("0.333333" = 1/3, "0.333" != 1/3), percentages ("50%" = 0.5, and = 50),
intervals and tuples ("[1, 2]" != "(1, 2)": a closed and an open interval), sets, equations
("x = 5" = 5), units it knows ("30 cm" = 30), symbolic equality ("2(x+1)" = "2x+2").

**mmrl's rules**, each a documented improvement with its case in ``tests/test_math_answer.py``
(Math-Verify's own verdict written beside it); 3 and 4 are tried only when Math-Verify says no:

1. **Multiple choice.** A truth that is one capital letter (``"B"``, ``"(B)"``, ``"B."``) is a
   choice letter; a prediction names a letter as ``B``, ``(B)``, ``B.``, ``B) 12``, ``option B``,
   ``the answer is (B)`` (case-insensitive), and the letters must match. With ``options``
   (``{"A": "3", "B": "12"}``, or a list read as A, B, ...) an option's text answers for its letter
   and a letter for a truth that is an option's text. Math-Verify knows no options and reads
   "The answer is (B)" as a product of symbols (0).
2. **Final form.** A numeric truth is not matched by unevaluated arithmetic ("3 + 8" for 11, "4*2"
   for 8): a model must not score by copying the expression it was asked to evaluate (Math-Verify
   evaluates it: 1). Closed forms (``\\sqrt{121}``, ``2\\pi``) still go to Math-Verify.
3. **Number words** zero..ten answer a numeric truth ("two" for 2; Math-Verify: 0).
4. **Counted things.** A number followed only by words answers a numeric truth ("7 shapes" for
   7; Math-Verify reads "7 shapes" as 7·s·h·a·p·e·s: 0). Units Math-Verify knows agree anyway.
5. **Word answers.** A truth made of words ("yes", "red circle") is compared as text, case,
   spacing, wrappers and a final period aside ("Yes." = "yes"). Math-Verify reads words as
   products of single-letter symbols: "sey" equals "yes" there and "Yes." does not.
6. **Final period and degree sign**: "12." and "30°" read as 12 and 30° (Math-Verify: 0 for both).
7. **Bounded time.** An answer Math-Verify could spend seconds on is compared as text: over
   1,000 characters, a power tower (an exponent holding an exponent: ``9^9^9``, ``10^{10^{10}}``),
   an exponent of 7 or more digits, a bracketed sum with variables raised above 12
   (``(a+b+c)^{99}``), a factorial of a number of 5 or more digits, brackets nested more than 10
   deep. Math-Verify times out on many of these (after 5 s, scoring 0); on the others text
   equality can differ from it (``2^{2^{10}}`` equals ``2^{1024}`` there, not here). Outside the
   main thread Math-Verify's signal-based timeouts cannot run and are turned off; this bound is
   what keeps a call short there.

Nothing here raises: any failure reads as "not equal".
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Optional

from math_verify import parse, verify

MAX_LEN = 1000  # longer answers are compared as text (rule 7)
MAX_DEPTH = 10
MAX_POWER = 12
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
MATH_WORDS = {"pi", "infinity", "infty", "inf", "nan"}  # letters only, but read as math


# -- cleaning --------------------------------------------------------------------------------------
def _braced(text: str, start: int) -> Optional[tuple[str, int]]:
    """The content of the brace group opening at ``text[start] == '{'`` and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def _last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, or None."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*(?=\{)", text):
        group = _braced(text, m.end())
        if group is not None:
            best = group[0]
    return best


def _unwrap_commands(text: str, names: str) -> str:
    """``\\name{content}`` -> ``content`` for each command in ``names`` (regex alternation)."""
    out, pos = [], 0
    for m in re.finditer(rf"\\(?:{names})\s*(?=\{{)", text):
        if m.start() < pos:
            continue
        group = _braced(text, m.end())
        if group is None:
            continue
        out.append(text[pos : m.start()])
        out.append(group[0])
        pos = group[1]
    out.append(text[pos:])
    return "".join(out)


_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _strip_period(s: str) -> str:
    return s[:-1].rstrip() if len(s) > 1 and s.endswith(".") and not s.endswith("..") else s


def clean(text: str) -> str:
    """The answer with wrappers, LaTeX decoration and a leading ``x =`` removed: the content of the
    last ``\\boxed{}``/``\\fbox{}``, math delimiters, ``\\text{}``-like commands (content kept),
    ``\\left``/``\\right``, LaTeX spacing, degree marks, a final period. Used by the choice, word
    and number rules; Math-Verify reads the answer as written."""
    s = str(text).strip()
    boxed = _last_boxed(s)
    if boxed is not None:
        s = boxed.strip()
    for _ in range(3):
        s = _strip_period(s)
        for left, right in _DELIMS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
    s = _unwrap_commands(s, r"text|textbf|textrm|mathrm|mathbf|mbox|operatorname")
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[,;:! ]|~", " ", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree", "", s)
    s = s.replace("\\%", "%").replace("\\$", "$").replace("$", "")
    s = _strip_period(" ".join(s.split()))
    m = re.fullmatch(r"(?:[A-Za-z]\s*=|=)\s*(.+)", s)
    if m is not None and "=" not in m.group(1):
        s = m.group(1).strip()
    return s


def _string_key(s: str) -> str:
    return " ".join(s.casefold().split()).rstrip(".").strip()


# -- multiple choice (rule 1) ----------------------------------------------------------------------
_TRUTH_LETTER_RE = re.compile(r"\(?([A-Z])\)?\.?", re.ASCII)
_PRED_LETTER_RE = re.compile(
    r"(?:(?:the\s+)?(?:correct\s+)?(?:answer|option|choice)\s*(?:is\s*)?:?\s*)?"
    r"(?:\(([A-Za-z])\)(?:\s*.*)?|([A-Za-z])(?:[.:)]\s*.*)?)",
    re.ASCII | re.IGNORECASE | re.DOTALL,
)


def normalize_options(options) -> Optional[dict[str, str]]:
    """Options as ``{"A": text, ...}``: a dict with letter keys, or a list read as A, B, C...
    None for anything else (or no options)."""
    try:
        if isinstance(options, dict):
            out = {}
            for k, v in options.items():
                key = str(k).strip().strip("().").strip().upper()
                if len(key) == 1 and "A" <= key <= "Z" and v is not None:
                    out[key] = str(v)
            return out or None
        if isinstance(options, (list, tuple)) and 0 < len(options) <= 26:
            return {chr(ord("A") + i): str(v) for i, v in enumerate(options) if v is not None} or None
    except Exception:
        return None
    return None


def truth_letter(truth: str) -> Optional[str]:
    m = _TRUTH_LETTER_RE.fullmatch(truth.strip())
    return m.group(1) if m is not None else None


def choice_letter(pred: str) -> Optional[str]:
    """The option letter a prediction names ("B", "(B)", "B.", "B) 12", "option b"), or None."""
    m = _PRED_LETTER_RE.fullmatch(pred.strip())
    if m is None:
        return None
    return (m.group(1) or m.group(2)).upper()


# -- mmrl's rules 2-7 ------------------------------------------------------------------------------
_NUMERIC_RE = re.compile(
    r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)%?|[+-]?\d+\s*/\s*\d+|[+-]?\\[dt]?frac\{[+-]?\d+\}\{\d+\}",
    re.ASCII,
)
_COUNTED_RE = re.compile(r"([+-]?\d[\d,]*(?:\.\d+)?)\s*[A-Za-z]{2,}(?:\s+[A-Za-z]+)*", re.ASCII)
_WORDS_RE = re.compile(r"[^\W\d_]+(?:[\s'-]+[^\W\d_]+)*")
_FACTORIAL_RE = re.compile(r"\d{5,}\s*!")
_BIG_EXPONENT_RE = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*[+-]?\d{7,}")
_SUM_POWER_RE = re.compile(r"\)\s*(?:\^|\*\*)\s*\{?\s*(\d+)")


def is_numeric(text: str) -> bool:
    """Whether a cleaned answer is one plain number: 12, -3.5, 1,000, 50%, 3/4, \\frac{3}{4}."""
    return bool(_NUMERIC_RE.fullmatch(text))


def _is_bare_arithmetic(s: str) -> bool:
    """Digits and operators only, with an operator between two numbers ("3 + 8", "4*2") (rule 2)."""
    t = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", s)
    t = re.sub(r"\\(?:cdot|times)", "*", t).replace("\\div", "/").replace("×", "*").replace("÷", "/")
    return bool(re.fullmatch(r"[\d\s.,+\-*/^()xX]+", t)) and bool(re.search(r"[\d)]\s*[-+*/^xX]\s*[\d(]", t))


def _is_words(s: str) -> bool:
    """Letters in words, one of two letters or more, not a math name (rule 5)."""
    return (bool(_WORDS_RE.fullmatch(s)) and re.search(r"[^\W\d_]{2,}", s) is not None
            and s.casefold() not in MATH_WORDS)


def _exponent_end(text: str, i: int) -> int:
    """The index after the exponent starting at ``text[i]`` (a brace or bracket group, else a token)."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] in "{(":
        close, depth = {"{": "}", "(": ")"}[text[i]], 0
        for j in range(i, len(text)):
            depth += text[j] == text[i]
            depth -= text[j] == close
            if depth == 0:
                return j + 1
        return len(text)
    m = re.compile(r"[\w.]*").match(text, i)
    return m.end()


def too_costly(text: str) -> bool:
    """Whether Math-Verify could spend seconds on ``text`` (rule 7)."""
    if len(text) > MAX_LEN or _FACTORIAL_RE.search(text) or _BIG_EXPONENT_RE.search(text):
        return True
    depth = deepest = 0
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        return True
    for m in re.finditer(r"\^|\*\*", text):
        end = _exponent_end(text, m.end())
        exponent, rest = text[m.end() : end], text[end:].lstrip()
        if "^" in exponent or "**" in exponent or rest.startswith(("^", "**")):
            return True
    has_letters = re.search(r"(?<!\\)\b[A-Za-z]\b", text) is not None
    return has_letters and any(int(m.group(1)[:6]) > MAX_POWER for m in _SUM_POWER_RE.finditer(text))


# -- Math-Verify -----------------------------------------------------------------------------------
def _as_latex(text: str) -> str:
    """The answer as Math-Verify reads it here: "°" as ``^{\\circ}``, a final period dropped
    (rule 6), ``$...$`` around a text holding no math delimiters."""
    s = _strip_period(text.strip().replace("°", "^{\\circ}"))
    return s if "$" in s or "\\(" in s or "\\[" in s else f"${s}$"


@lru_cache(maxsize=8192)
def _parsed(latex: str, main_thread: bool):
    timeout = {} if main_thread else {"parsing_timeout": None}
    return tuple(parse(latex, extraction_mode="first_match", **timeout))


def math_verify_equal(pred: str, truth: str) -> bool:
    """``verify(parse(truth), parse(pred))`` as TRL calls it (module docstring); never raises."""
    try:
        main = threading.current_thread() is threading.main_thread()
        gold, answer = _parsed(_as_latex(truth), main), _parsed(_as_latex(pred), main)
        if not gold or not answer:
            return False
        timeout = {} if main else {"timeout_seconds": None}
        return bool(verify(list(gold), list(answer), **timeout))
    except Exception:
        return False


# -- the comparison --------------------------------------------------------------------------------
def _values_equal(pred: str, truth: str) -> tuple[bool, str]:
    """Rules 2-7 and Math-Verify on a (non-choice) prediction and truth, as written."""
    p, t = clean(pred), clean(truth)
    if _is_words(t):
        return _string_key(p) == _string_key(t), "words"
    if too_costly(pred) or too_costly(truth):
        return _string_key(p) == _string_key(t), "too_costly"
    numeric = is_numeric(t)
    if numeric and _is_bare_arithmetic(p) and not is_numeric(p):
        return False, "final_form"
    if math_verify_equal(pred, truth):
        return True, "math_verify"
    if numeric and p.casefold() in NUMBER_WORDS:
        return math_verify_equal(str(NUMBER_WORDS.index(p.casefold())), truth), "number_word"
    m = _COUNTED_RE.fullmatch(p) if numeric else None
    if m is not None and not re.search(r"(?i)\b(?:pi|sqrt)\b", p):
        return math_verify_equal(m.group(1), truth), "counted"
    return False, "math_verify"


def compare(pred, truth, options=None) -> tuple[bool, str]:
    """``(equal, rule)``: whether ``pred`` (an extracted answer) equals ``truth``, and what decided:
    "choice", "final_form", "number_word", "counted", "words", "too_costly", "math_verify"
    ("none" for a missing side, "error" when something unforeseen failed, read as not equal).
    Never raises."""
    try:
        if pred is None or truth is None:
            return False, "none"
        pred, truth = str(pred), str(truth)
        opts = normalize_options(options)
        if len(pred) <= MAX_LEN and len(truth) <= MAX_LEN:
            p, t = clean(pred), clean(truth)
            letter = truth_letter(t)
            if letter is not None and (opts is None or letter in opts):
                said = choice_letter(p)
                if said is not None:
                    return said == letter, "choice"
                if opts is not None:
                    return _values_equal(pred, opts[letter])[0], "choice"
                return _string_key(p) == _string_key(t), "choice"
            if opts is not None:
                said = choice_letter(p)
                if said is not None and said in opts:
                    return _values_equal(opts[said], truth)[0], "choice"
        return _values_equal(pred, truth)
    except Exception:
        return False, "error"


def math_equal(pred, truth, options=None) -> bool:
    """Whether ``pred`` equals ``truth`` under the rules of this module; never raises."""
    return compare(pred, truth, options)[0]
