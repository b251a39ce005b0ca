"""Loading rliable (``pip install 'mmrl[bench]'``), the library of 'Deep Reinforcement Learning at
the Edge of the Statistical Precipice' (Agarwal et al., NeurIPS 2021).

rliable 1.2.0 pins ``arch<8``, and arch 7 decorates one of its (unused here) plotting methods with
``pandas.util._decorators.deprecate_kwarg(old, new)``, a private pandas helper whose signature
pandas 3 changed to ``deprecate_kwarg(klass, old, new)``: with pandas 3, ``import arch`` (and so
``import rliable.library``) raises ``TypeError: deprecate_kwarg() missing 1 required positional
argument: 'new_arg_name'``. When, and only when, the plain import fails that way, :func:`load`
imports arch once more with the old call form translated to the new one (``FutureWarning``, the
class pandas 2 used), then puts pandas' function back. This is the one place mmrl knows about it;
``tests/test_bench_stats.py`` fails loudly if rliable stops loading through here.
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace

_PANDAS_3_ERROR = "deprecate_kwarg() missing 1 required positional argument"


class RliableMissingError(ImportError):
    """rliable is not installed (it comes with ``pip install 'mmrl[bench]'``)."""


def _import_arch_with_old_deprecate_kwarg() -> None:
    import pandas.util._decorators as decorators

    original = decorators.deprecate_kwarg

    @functools.wraps(original)
    def old_call_form(*args, **kwargs):
        if args and isinstance(args[0], str):  # deprecate_kwarg(old_arg_name, new_arg_name, ...): pandas 2's form
            return original(FutureWarning, *args, **kwargs)
        return original(*args, **kwargs)

    decorators.deprecate_kwarg = old_call_form
    try:
        importlib.import_module("arch")
    finally:
        decorators.deprecate_kwarg = original


def load() -> SimpleNamespace:
    """rliable's ``library``, ``metrics`` and ``plot_utils`` modules (as ``.library`` ...).

    Raises :class:`RliableMissingError` when rliable is not installed.
    """
    try:
        importlib.import_module("arch")
    except ModuleNotFoundError as exc:
        raise RliableMissingError("IQM, bootstrap intervals and performance profiles need rliable: "
                                  "pip install 'mmrl[bench]'") from exc
    except TypeError as exc:
        if _PANDAS_3_ERROR not in str(exc):
            raise
        _import_arch_with_old_deprecate_kwarg()
    try:
        library = importlib.import_module("rliable.library")
        metrics = importlib.import_module("rliable.metrics")
        plot_utils = importlib.import_module("rliable.plot_utils")
    except ModuleNotFoundError as exc:
        raise RliableMissingError("IQM, bootstrap intervals and performance profiles need rliable: "
                                  "pip install 'mmrl[bench]'") from exc
    return SimpleNamespace(library=library, metrics=metrics, plot_utils=plot_utils)
