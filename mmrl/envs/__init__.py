"""Environments for multi-step episodes: the plugin API (:mod:`.base`) and the built-in synthetic
GUI environment (:mod:`.synthetic_gui`); :mod:`.task` is the base class of episodic tasks. Importing this package registers the built-ins."""

from .base import Env, Observation, make_env, register_env, state_key_of
from .synthetic_gui import SyntheticGUI
from .task import EnvTask

__all__ = ["Env", "EnvTask", "Observation", "SyntheticGUI", "make_env", "register_env", "state_key_of"]
