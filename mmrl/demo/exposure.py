"""Who can reach the demo, and what serving it beyond this machine requires.

On the loopback address only this machine's users reach the demo. Bound to any other address
(``--host 0.0.0.0``) or shared through a public gradio.live link (``--share``), anyone who
reaches the port can run the models, read the runs directory and (Launch tab) start training
runs on this machine. So that is opt-in twice over: :func:`decide` refuses it without a password
(``--auth user:password`` or ``MMRL_DEMO_AUTH``, Gradio's login) unless ``--no-auth`` says so
explicitly, and without a password the Launch tab is left out of the app altogether (its
handlers are not registered, so no HTTP request can reach them).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Optional

__all__ = ["AUTH_ENV", "Exposure", "ExposureRefused", "decide", "is_loopback", "parse_auth"]

AUTH_ENV = "MMRL_DEMO_AUTH"


class ExposureRefused(ValueError):
    """Serving beyond loopback without a password, and without ``--no-auth``."""


@dataclass(frozen=True)
class Exposure:
    """How the demo is served: ``auth`` for Gradio's login (None: none), whether the Launch tab
    is on, and the warning to print (None on loopback)."""
    auth: Optional[tuple[str, str]]
    launch: bool
    warning: Optional[str]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) binds only this machine's loopback interface.
    A name counts when every address it resolves to is loopback; an unresolvable one does not."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if not host:
        return False
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def parse_auth(text: Optional[str]) -> Optional[tuple[str, str]]:
    """``"user:password"`` as Gradio's ``auth`` pair (None for None or ""); ValueError when either
    part is empty."""
    if not text:
        return None
    user, colon, password = text.partition(":")
    if not colon or not user or not password:
        raise ValueError(f"--auth / {AUTH_ENV} must be user:password (both non-empty)")
    return user, password


def decide(host: str, share: bool, auth: Optional[tuple[str, str]], no_auth: bool) -> Exposure:
    """The serving of a demo bound to ``host`` (and shared when ``share``): on loopback as asked;
    beyond it with a password, or with ``no_auth`` without one and without the Launch tab;
    :class:`ExposureRefused` otherwise."""
    where = " and ".join(w for w in ((f"every machine that can reach {host}" if not is_loopback(host) else ""),
                                     ("anyone with the public gradio.live link" if share else "")) if w)
    if not where:
        return Exposure(auth, True, None)
    if auth is not None:
        return Exposure(auth, True, f"the demo is reachable by {where}; it asks for the password of --auth. "
                                    "A user who logs in can run the models, read the runs directory and start "
                                    "training runs on this machine (shipped recipes, allow-listed overrides).")
    if not no_auth:
        raise ExposureRefused(
            f"--host {host}{' --share' if share else ''} would make the demo reachable by {where}. Give a "
            f"password with --auth user:password (or the {AUTH_ENV} environment variable, kept out of `ps`), "
            "or pass --no-auth to serve it without one (the Launch tab is then off).")
    return Exposure(None, False, f"the demo is reachable by {where} WITHOUT a password (--no-auth): anyone "
                                 "can run the models and read the runs directory. The Launch tab is off.")
