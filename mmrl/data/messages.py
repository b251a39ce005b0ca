"""Messages of bounded length about data: a value or a list of keys quoted in a skip reason or an
error is cut short, because datasets hold huge ones (a GQA question file is one object of 1.4
million keys, a record may hold a long list), and a message must stay one readable line."""

from __future__ import annotations

from typing import Iterable

MAX_MESSAGE = 400  # characters of one skip reason or error message


def shorten(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to at most ``limit`` characters, saying how many were left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    kept = max(0, limit - 40)  # room for the note, which is shorter than 40 characters
    return f"{text[:kept]} ... ({len(text) - kept:,} more characters)"


def listing(names: Iterable, most: int = 5) -> str:
    """``'a', 'b', 'c'`` for a few names; the first ``most`` and how many there are in all for
    more (``'a', 'b', ... (1,400,000 in all)``)."""
    shown, total = [], 0
    for name in names:
        if total < most:
            shown.append(shorten(repr(name), 60))
        total += 1
    return ", ".join(shown) + (f", ... ({total:,} in all)" if total > most else "")
