"""What a registered function takes, so a config key it does not read stops the run at setup.

A ``**_`` in an estimator swallowed a typo in ``algo.advantage_kwargs`` and trained with the default.
verl's registered functions and transformers' configs reject what they do not know; so do mmrl's:
every registered estimator, loss, sampler, selection, schedule and perturbation has an explicit
signature (``tests/test_options.py`` checks that none takes ``**kwargs``), and the code that calls
one with config values checks those values here, once, against that signature.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Sequence

from mmrl.config import ConfigError

__all__ = ["keyword_options", "takes_any_keyword", "check_options", "check_names", "accepted"]

_NAMED = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def keyword_options(fn: Callable, supplied: Iterable[str] = ()) -> list[str]:
    """The parameters ``fn`` takes by name (a class: its constructor's), less ``supplied`` (what
    its caller always passes itself, such as an estimator's ``rewards``)."""
    skip = set(supplied)
    return [n for n, p in inspect.signature(fn).parameters.items() if p.kind in _NAMED and n not in skip]


def takes_any_keyword(fn: Callable) -> bool:
    """Whether ``fn`` has a ``**kwargs`` (which would take any key, typos included)."""
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


def check_options(fn: Callable | Sequence[Callable], given: Iterable[str], key: str, what: str,
                  supplied: Iterable[str] = ()) -> None:
    """A :class:`~mmrl.config.ConfigError` naming ``key`` when ``given`` (the option names a config
    hands to ``fn``) holds one that ``fn`` does not take, with the options it does take. ``fn`` may
    be several functions, one of which is chosen per call (any option of one of them is valid)."""
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    check_names(list(dict.fromkeys(o for f in fns for o in keyword_options(f, supplied))), given, key, what)


def check_names(options: Sequence[str], given: Iterable[str], key: str, what: str) -> None:
    """:func:`check_options` against declared option names (a registered reward's
    ``reward_options``) rather than a signature."""
    unknown = sorted(set(given) - set(options))
    if unknown:
        takes = ", ".join(options) if options else "no options"
        raise ConfigError(f"{key}: {what} takes no {', '.join(unknown)} (it takes: {takes})")


def accepted(fn: Callable, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that ``fn`` takes by name (run-wide settings that only some of the
    registered functions of a kind read, such as a perturbation's ``max_angle``)."""
    names = set(keyword_options(fn))
    return {k: v for k, v in values.items() if k in names}
