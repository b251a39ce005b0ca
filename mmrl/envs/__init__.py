"""Environments for multi-step episodes: the plugin API (:mod:`.base`) and the built-in synthetic
GUI environment (:mod:`.synthetic_gui`). Importing this package registers the built-ins."""

from .base import Env, Observation, make_env, register_env, state_key_of

__all__ = ["Env", "Observation", "make_env", "register_env", "state_key_of"]
