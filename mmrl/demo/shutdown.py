"""How ``mmrl demo`` ends: on Ctrl-C, SIGTERM (``kill``, a service manager, a cluster's job end) or
SIGHUP (its terminal closed) it first stops the runs it launched, each with its process group,
then closes the server. Without this, SIGTERM's default action ended the demo at once and its runs
trained on with no one to stop them. ``kill -9`` cannot be caught: runs outlive that one.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from .launcher import Launcher

__all__ = ["Terminated", "serve_until_stopped"]


class Terminated(SystemExit):
    """SIGTERM or SIGHUP reached the demo: it ends like Ctrl-C, its runs stopped first."""


@contextmanager
def _signals_end_the_demo(*signals_: int):
    """While inside, each of ``signals_`` raises :class:`Terminated` in the main thread (once: a
    second one while the runs are being stopped does not cut that short). The default action
    of SIGTERM would end the process at once, leaving the runs it launched training on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum, _frame):
        if not received:
            received.append(signum)
            raise Terminated(128 + signum)
    previous = {s: signal.signal(s, handler) for s in signals_}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def serve_until_stopped(app, launcher: Launcher) -> None:
    """Block until Ctrl-C (Gradio's own handling), SIGTERM or SIGHUP, then stop every run this demo
    launched, each with everything it started, and close the server."""
    with _signals_end_the_demo(signal.SIGTERM, signal.SIGHUP):
        try:
            app.block_thread()
        finally:
            launcher.close()
            app.close()
