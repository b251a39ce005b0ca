"""The one base class of mmrl's lazily computed datasets (synthetic splits, file readers, views)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any


class LazySequence(Sequence):
    """A read-only sequence computed item by item. Subclasses define ``__len__`` and ``item(i)``
    for ``0 <= i < len``; negative indices, bounds and slices are handled here, once."""

    @abstractmethod
    def item(self, i: int) -> Any:
        """Item ``i``, with ``0 <= i < len(self)``."""

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.item(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self.item(i % n)
