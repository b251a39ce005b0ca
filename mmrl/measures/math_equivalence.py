"""Mathematical answer equivalence: the checker behind the ``math_answer`` reward and the
``visual_math`` task's metrics.

Two checkers, one interface (:func:`compare`, :func:`math_equal`):

- **Math-Verify** (huggingface/Math-Verify, ``pip install math-verify``): ``parse`` + ``verify``,
  used when the package is importable (:data:`MATH_VERIFY_AVAILABLE`) for answers the fast
  built-in rules below do not settle (symbolic expressions, sets, intervals, equations).
- **built-in** (this module, always available): the cases that make up almost every answer of a
  visual-math dataset, decided without Math-Verify (and without its per-call timeouts) so they stay
  fast in a training loop; sympy (when importable) for simple symbolic expressions when
  Math-Verify is absent.

Rules, applied in this order (the first that applies decides):

1. **Wrappers** are removed from both sides: the content of the last ``\\boxed{...}`` (or
   ``\\fbox{...}``), ``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``, ``\\text{...}`` /
   ``\\mathrm{...}`` / ``\\mbox{...}`` (content kept), ``\\left`` / ``\\right``, LaTeX spacing,
   degree marks (``30^\\circ`` and ``30°`` read as 30), a final period, and a leading ``x =``.
2. **Multiple choice.** A truth that is one capital letter (``"B"``, ``"(B)"``, ``"B."``) is a
   choice letter. A prediction names a letter as ``B``, ``(B)``, ``B.``, ``B)``, ``B:``,
   ``B) 12``, ``B. 12``, ``option B``, ``the answer is (B)`` (case-insensitive); the letters must
   match. With ``options`` (``{"A": "3", "B": "12"}``, or a list read as A, B, ...) a prediction
   that is not a letter matches when it equals the truth letter's option text ("12" matches
   "B"), and a letter prediction matches a truth that is an option text ("B" matches "12").
3. **Numbers**: integers, decimals, scientific notation, thousand separators (``1,000`` and
   ``1,234.5``; groups of exactly three digits), fractions ``a/b`` and ``\\frac{a}{b}`` (also
   ``\\dfrac``/``\\tfrac``, braces required), the number words zero..ten, and percentages.
   Values compare as exact rationals, so ``"1/2" == "0.5" == "\\frac{2}{4}"`` but
   ``"0.333" != "1/3"``; as in Math-Verify, when either side is written as a decimal both are
   also compared rounded to 6 decimal places (``"0.333333" == "1/3"``).
   *Percent rule*: a ``%`` on either side may be read as "/100" or as a unit, and the answers
   match if either reading does: ``"50%"`` equals ``"0.5"`` and ``"50"``, ``"0.5"`` equals
   ``"50%"``, but ``"50"`` never equals ``"0.5"``.
   *Units*: a numeric truth also accepts a number followed only by words (``"7 shapes"``,
   ``"30 cm"``).
4. **Final form**: a numeric truth is *not* matched by unevaluated arithmetic ("3 + 8" for 11,
   "4*2" for 8), so a model cannot score by copying the expression it was asked to evaluate;
   closed forms with ``\\sqrt`` or ``\\pi`` are still evaluated (next rule).
5. **Symbolic** (Math-Verify when available, else sympy): both sides parsed, equal when
   ``simplify(a - b) == 0`` (numerically, with the 6-place rounding, when a decimal is involved).
   The sympy parser only sees whitelisted input (ASCII digits, single-letter variables, ``sqrt``,
   ``pi``, ``+ - * / ^ ( ) .``, at most 80 characters, small integer exponents, no chained powers,
   at most 3 variables), evaluated with no Python builtins, so no input can run code or blow up.
   Comma-separated answers (``"(1, 2)"``) compare element by element, in order.
6. **Strings**: otherwise case-, whitespace- and final-period-insensitive equality ("Yes" ==
   "yes.").

Nothing here raises: any failure reads as "not equal".
"""

from __future__ import annotations

import importlib.util
import re
import threading
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple, Optional

from mmrl.parsing import parse_exact_number

MATH_VERIFY_AVAILABLE: bool = importlib.util.find_spec("math_verify") is not None
SYMPY_AVAILABLE: bool = importlib.util.find_spec("sympy") is not None
# Which checker settles answers the built-in numeric and choice rules do not: "math_verify",
# "sympy" (the built-in symbolic fallback) or "string" (neither package is installed).
CHECKER: str = "math_verify" if MATH_VERIFY_AVAILABLE else ("sympy" if SYMPY_AVAILABLE else "string")

MAX_LEN = 1000  # longer answers are compared as strings only
MAX_SYMPY_LEN = 80
ROUND_PLACES = 6  # Math-Verify's default float_rounding


class Num(NamedTuple):
    value: Fraction
    decimal: bool  # written with a decimal point or an exponent
    percent: bool


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


def _frac_to_slash(text: str) -> str:
    """``\\frac{a}{b}`` (and dfrac/tfrac) -> ``(a)/(b)``, innermost first; other forms untouched."""
    for _ in range(10):
        m = None
        for cand in re.finditer(r"\\[dt]?frac\s*(?=\{)", text):
            m = cand  # the last one is innermost or later; both are safe to rewrite
        if m is None:
            return text
        num = _braced(text, m.end())
        den = _braced(text, num[1]) if num is not None else None
        if num is None or den is None:
            return text
        text = f"{text[: m.start()]}({num[0]})/({den[0]}){text[den[1]:]}"
    return text


def _sqrt_to_call(text: str) -> str:
    r"""``\sqrt{a}`` -> ``sqrt(a)`` and ``\sqrt 2`` -> ``sqrt(2)``."""
    for _ in range(10):
        m = re.search(r"\\sqrt\s*(?=\{)", text)
        if m is None:
            break
        group = _braced(text, m.end())
        if group is None:
            break
        text = f"{text[: m.start()]}sqrt({group[0]}){text[group[1]:]}"
    return re.sub(r"\\sqrt\s*([0-9]+|[A-Za-z])", r"sqrt(\1)", text)


_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _strip_period(s: str) -> str:
    return s[:-1].rstrip() if len(s) > 1 and s.endswith(".") and not s.endswith("..") else s


def clean(text: str) -> str:
    """The answer with wrappers, LaTeX decoration and a leading ``x =`` removed (rule 1)."""
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


# -- numbers ---------------------------------------------------------------------------------------
_INT_RE = re.compile(r"[+-]?\d+", re.ASCII)
_DEC_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_PART = r"\(?\s*[+-]?(?:\d+\.?\d*|\.\d+)\s*\)?"
_FRACTION_RE = re.compile(rf"([+-]?)\s*({_PART})\s*/\s*({_PART})", re.ASCII)
# A number then words only: "7 shapes", "30 cm", "30cm" (a lone letter must be spaced off, so
# "2x" is not read as 2).
_UNIT_RE = re.compile(r"(.*?\d)(?:\s+[A-Za-z]+|[A-Za-z]{2,})(?:\s+[A-Za-z]+)*\.?", re.ASCII | re.DOTALL)


def _decimal(text: str) -> Optional[Fraction]:
    text = text.strip().strip("()").strip()
    if not _DEC_RE.fullmatch(text) or len(text) > 100:
        return None
    m = re.search(r"[eE]([+-]?\d+)$", text)
    if m is not None and abs(int(m.group(1))) > 300:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def parse_value(text: str) -> Optional[Num]:
    """An exact number from a cleaned answer (rule 3), or None."""
    s = _frac_to_slash(text.strip()) if "frac" in text else text.strip()
    percent = s.endswith("%")
    if percent:
        s = s[:-1].strip()
    s = re.sub(r"^([+-])\s+", r"\1", re.sub(r"\s*/\s*", "/", s))
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    value = _decimal(s)
    if value is not None:
        return Num(value, not _INT_RE.fullmatch(s.strip("()")), percent)
    m = _FRACTION_RE.fullmatch(s)
    if m is not None:
        num, den = _decimal(m.group(2)), _decimal(m.group(3))
        if num is not None and den:
            value = num / den
            decimal = "." in m.group(2) or "." in m.group(3)
            return Num(-value if m.group(1) == "-" else value, decimal, percent)
        return None
    if not percent:
        word = parse_exact_number(s)
        if word is not None and float(word).is_integer():
            return Num(Fraction(int(word)), False, False)
    return None


def _readings(n: Num) -> list[Fraction]:
    return [n.value / 100, n.value] if n.percent else [n.value]


def _round(x: Fraction) -> Fraction:
    return Fraction(round(x, ROUND_PLACES))


def numbers_equal(a: Num, b: Num) -> bool:
    """Exact equality of any percent reading; 6-place rounding when either side is a decimal."""
    rounded = a.decimal or b.decimal
    for x in _readings(a):
        for y in _readings(b):
            if x == y or (rounded and _round(x) == _round(y)):
                return True
    return False


# -- multiple choice -------------------------------------------------------------------------------
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


# -- symbolic --------------------------------------------------------------------------------------
_SAFE_CHARS_RE = re.compile(r"[0-9A-Za-z+\-*/^().\s]+", re.ASCII)
_NAMES = {"sqrt", "pi"}
_EXPONENT_RE = re.compile(r"\*\*\s*(\(\s*[+-]?\s*(?:\d{1,2}|[A-Za-z])\s*\)|[+-]?\s*(?:\d{1,2}|[A-Za-z]))", re.ASCII)


def _to_sympy_text(s: str) -> Optional[str]:
    """Whitelisted, sympy-parsable text from a cleaned answer, or None when it is not safe."""
    s = _sqrt_to_call(_frac_to_slash(s))
    s = re.sub(r"\\(?:cdot|times)", "*", s).replace("\\div", "/").replace("\\pi", " pi ")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if not s.strip() or len(s) > MAX_SYMPY_LEN or not _SAFE_CHARS_RE.fullmatch(s):
        return None
    if re.search(r"\d[eE]|\d{21}", s):
        return None  # scientific notation is the numeric rule's; huge literals are not needed
    names = re.findall(r"[A-Za-z]+", s)
    if any(len(n) > 1 and n not in _NAMES for n in names):
        return None
    variables = {n for n in names if len(n) == 1}
    if len(variables) > 3 or s.count("**") > 3:
        return None
    for m in re.finditer(r"\*\*", s):
        e = _EXPONENT_RE.match(s, m.start())
        if e is None or s[e.end() :].lstrip().startswith("**"):
            return None  # only small, simple exponents; no towers such as 9**9**9
        digits = re.search(r"\d+", e.group(1))
        if variables and digits is not None and int(digits.group()) > 6:
            return None  # (a+b+c)**99 would take long to expand
    return s


@lru_cache(maxsize=4096)
def _sympy_parse(s: str):
    import sympy
    from sympy.parsing.sympy_parser import auto_number, auto_symbol, implicit_multiplication, parse_expr

    names = {"__builtins__": {}, "Integer": sympy.Integer, "Float": sympy.Float, "Rational": sympy.Rational,
             "Symbol": sympy.Symbol, "sqrt": sympy.sqrt, "pi": sympy.pi}
    transformations = (auto_symbol, auto_number, implicit_multiplication)
    return parse_expr(s, local_dict={}, global_dict=names, transformations=transformations)


def sympy_equal(a: str, b: str) -> Optional[bool]:
    """Symbolic equality of two cleaned answers, or None when either is not safely parsable."""
    if not SYMPY_AVAILABLE:
        return None
    sa, sb = _to_sympy_text(a), _to_sympy_text(b)
    if sa is None or sb is None:
        return None
    try:
        import sympy

        x, y = _sympy_parse(sa), _sympy_parse(sb)
        if not (isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr)):
            return None
        if x.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo) or y.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
            return False
        diff = x - y
        if diff == 0:
            return True
        if not diff.free_symbols and ("." in sa or "." in sb):
            fx, fy = complex(x.evalf(30)), complex(y.evalf(30))
            if fx.imag or fy.imag:
                return False
            return round(fx.real, ROUND_PLACES) == round(fy.real, ROUND_PLACES)
        if sympy.expand(diff) == 0:
            return True
        if diff.is_rational_function():  # cancel is a canonical form there, and much cheaper
            return bool(sympy.cancel(diff) == 0)
        return bool(sympy.simplify(diff) == 0)
    except Exception:
        return None


# -- Math-Verify -------------------------------------------------------------------------------------
def math_verify_equal(pred: str, truth: str) -> Optional[bool]:
    """``math_verify.verify(parse(truth), parse(pred))``, or None when unavailable or failing.
    Outside the main thread Math-Verify's signal-based timeouts cannot run, so they are off."""
    if not MATH_VERIFY_AVAILABLE:
        return None
    try:
        from math_verify import parse, verify

        main = threading.current_thread() is threading.main_thread()
        wrap = lambda t: t if "$" in t or "\\(" in t or "\\[" in t else f"${t}$"  # noqa: E731
        if main:
            gold, answer = parse(wrap(truth)), parse(wrap(pred))
            return bool(gold and answer and verify(gold, answer))
        try:
            gold, answer = parse(wrap(truth), parsing_timeout=None), parse(wrap(pred), parsing_timeout=None)
            return bool(gold and answer and verify(gold, answer, timeout_seconds=None))
        except TypeError:  # an old Math-Verify without the timeout arguments
            return None
    except Exception:
        return None


# -- the comparison --------------------------------------------------------------------------------
def _string_key(s: str) -> str:
    return " ".join(s.casefold().split()).rstrip(".").strip()


def _split_list(s: str) -> Optional[list[str]]:
    """Top-level comma-separated parts of "(1, 2)" / "[1, 2]" / "1, 2", or None for one part."""
    if _THOUSANDS_RE.fullmatch(s.replace(" ", "")):
        return None
    inner = s[1:-1] if len(s) >= 2 and s[0] + s[-1] in ("()", "[]") else s
    parts, depth, cur = [], 0, []
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts if len(parts) > 1 and all(parts) else None


def _with_unit_removed(s: str) -> Optional[Num]:
    m = _UNIT_RE.fullmatch(s)
    if m is None or re.search(r"(?i)\b(?:pi|sqrt)\b", s[len(m.group(1)) :]):
        return None  # "2 pi" is a number times pi, not 2 in some unit
    return parse_value(m.group(1))


def _is_bare_arithmetic(s: str) -> bool:
    """Digits and operators only, with an operator between two numbers ("3 + 8", "4*2")."""
    t = _frac_to_slash(s) if "frac" in s else s
    t = re.sub(r"\\(?:cdot|times)", "*", t).replace("\\div", "/").replace("×", "*").replace("÷", "/")
    return bool(re.fullmatch(r"[\d\s.,+\-*/^()xX]+", t)) and bool(re.search(r"[\d)]\s*[-+*/^xX]\s*[\d(]", t))


def _compare_values(p: str, t: str, depth: int = 0) -> tuple[bool, str]:
    """Rules 3-6 on two cleaned answers."""
    tn = parse_value(t)
    if tn is not None:
        pn = parse_value(p)
        if pn is None:
            pn = _with_unit_removed(p)
        if pn is not None:
            return numbers_equal(pn, tn), "number"
        if _is_bare_arithmetic(p):
            return False, "final_form"
    same_text = _string_key(p) == _string_key(t)
    if depth == 0:
        tl, pl = _split_list(t), _split_list(p)
        if tl is not None and pl is not None:
            if len(tl) != len(pl):
                return False, "list"
            return all(_compare_values(clean(a), clean(b), 1)[0] for a, b in zip(pl, tl)), "list"
    if MATH_VERIFY_AVAILABLE:
        verdict = math_verify_equal(p, t)
        if verdict is not None:
            return (True, "math_verify") if verdict or same_text else (False, "math_verify")
    verdict = sympy_equal(p, t)
    if verdict is not None and not same_text:
        return verdict, "sympy"
    return same_text, "string"


def compare(pred, truth, options=None) -> tuple[bool, str]:
    """``(equal, checker)``: whether ``pred`` (an extracted answer) equals ``truth``, and which
    rule decided: "choice", "number", "final_form", "list", "math_verify", "sympy", "string"
    (or "error" when something unforeseen failed, read as not equal). Never raises."""
    try:
        if pred is None or truth is None:
            return False, "none"
        pred, truth = str(pred), str(truth)
        if len(pred) > MAX_LEN or len(truth) > MAX_LEN:
            return _string_key(pred) == _string_key(truth), "string"
        opts = normalize_options(options)
        p, t = clean(pred), clean(truth)
        letter = truth_letter(t)
        if letter is not None and (opts is None or letter in opts):
            said = choice_letter(p)
            if said is not None:
                return said == letter, "choice"
            if opts is not None:
                return _compare_values(p, clean(opts[letter]))[0], "choice"
            return _string_key(p) == _string_key(t), "choice"
        if opts is not None:
            said = choice_letter(p)
            if said is not None and said in opts:
                return _compare_values(clean(opts[said]), t)[0], "choice"
        return _compare_values(p, t)
    except Exception:
        return False, "error"


def math_equal(pred, truth, options=None) -> bool:
    """Whether ``pred`` equals ``truth`` under the rules of this module; never raises."""
    return compare(pred, truth, options)[0]
