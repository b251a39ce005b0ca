"""The one base class of mmrl's lazily computed datasets (synthetic splits, file readers, views),
and the base of the readers whose examples can prove unusable only when read."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Optional


class LazySequence(Sequence):
    """A read-only sequence computed item by item. Subclasses define ``__len__`` and ``item(i)``
    for ``0 <= i < len``; negative indices, bounds and slices are handled here, once."""

    @abstractmethod
    def item(self, i: int) -> Any:
        """Item ``i``, with ``0 <= i < len(self)``."""

    def usable(self, i: int) -> Optional[Any]:
        """Item ``i`` itself, or None when it proves unusable as it is read (counted by the reader,
        see :class:`SkippingSequence`). Here every item is usable: ``item(i)``. A view of another
        sequence passes its ``usable`` through."""
        return self.item(i)

    def stats(self) -> dict[str, Any]:
        """What the sequence holds and what it left out, by kind. Here ``examples``; a reader of
        files adds ``skipped_lines`` (records left out when the file was read), ``bad_images``
        (images or clips that would not open) and ``bad_targets`` (boxes, clicks, segments that
        cannot be trained on), counted as they are met; a reader that looks for each image file as
        it reads (ScreenSpot, GUI episodes) adds ``missing_images``, the entries it left out because
        their image is absent (also in ``bad_images``)."""
        return {"examples": len(self)}

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.item(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self.item(i % n)


class SkippingSequence(LazySequence):
    """A dataset some of whose examples prove unusable only when read: an image that does not
    open, a box off its image once its size is known. Subclasses define ``usable(i)``, which
    counts why example ``i`` cannot be used and returns None. Indexing (``item``, for training)
    returns the next usable example instead, deterministically, so that it never raises for bad
    data (only when no example at all can be used: ``nothing_usable``); evaluation takes each usable
    example once (:func:`usable_item`)."""

    @abstractmethod
    def usable(self, i: int) -> Optional[Any]:
        """Example ``i``, or None once it is counted as unusable."""

    def nothing_usable(self) -> str:
        """The error message when no example can be used."""
        return f"{type(self).__name__}: no example could be used"

    def item(self, i: int) -> Any:
        n = len(self)
        for k in range(n):
            ex = self.usable((i + k) % n)
            if ex is not None:
                return ex
        raise ValueError(self.nothing_usable())


def usable_item(examples: Sequence, i: int) -> Optional[Any]:
    """Example ``i`` of any task's examples, or None when it cannot be used (a plain list's items
    always can)."""
    return examples.usable(i) if isinstance(examples, LazySequence) else examples[i]


def split_stats(examples: Sequence) -> dict[str, Any]:
    """``examples.stats()`` (:meth:`LazySequence.stats`), or the size of a plain sequence."""
    return examples.stats() if isinstance(examples, LazySequence) else {"examples": len(examples)}


def left_out_when_read(examples: Sequence) -> int:
    """How many entries of a split's files were left out as they were read (:meth:`LazySequence.stats`):
    malformed records (``skipped_lines``) and entries whose image file is absent (``missing_images``)."""
    stats = split_stats(examples)
    return int(stats.get("skipped_lines", 0)) + int(stats.get("missing_images", 0))
