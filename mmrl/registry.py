"""Name -> object registries for every named choice of a config: tasks, rewards, advantage
estimators, losses, prompt samplers, SDE samplers, batch selections, KL schedules, image
perturbations, rollout engines, environments and policies (one per task modality).

This module is a leaf: it imports nothing of mmrl, so any module can register into it. The
built-ins register when their modules are imported; :mod:`mmrl.plugins` imports them (and the
installed and configured plugins) on the first lookup.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A registry lookup failed; the message names the closest known names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class Registry(Generic[T]):
    """Named objects of one ``kind``. ``modules``: where built-ins that are costly to import register
    themselves (the policies, which import transformers / diffusers models); they are imported at
    this registry's first lookup rather than with every plugin, so a lookup elsewhere stays cheap."""

    def __init__(self, kind: str, modules: tuple[str, ...] = ()):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._modules = modules

    def _load(self) -> None:
        load_plugins()
        while self._modules:
            module, self._modules = self._modules[0], self._modules[1:]
            importlib.import_module(module)

    def register(self, name: str, obj: T, override: bool = False) -> T:
        """Register ``obj`` as ``name``. A name taken by another object is an error unless
        ``override=True``: a user's ``@register_reward("iou")`` must not silently replace the
        built-in. The same definition registered again (a plugin file imported twice) is harmless."""
        existing = self._items.get(name)
        if existing is not None and existing is not obj and not override and _origin(existing) != _origin(obj):
            raise ValueError(f"{self.kind} {name!r} is already registered by {_origin(existing)}; register "
                             f"{_origin(obj)} under another name, or pass override=True to replace it")
        self._items[name] = obj
        return obj

    def get(self, name: str, key: str | None = None) -> T:
        """The object registered as ``name``; an unknown name raises :class:`UnknownNameError`
        naming the closest known name, all known names and, when given, the config ``key``."""
        self._load()
        if name not in self._items:
            close = difflib.get_close_matches(str(name), self._items, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            where = f" for {key}" if key else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{where}{hint} (known: {', '.join(sorted(self._items))})"
            )
        return self._items[name]

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs, by name."""
        self._load()
        return sorted(self._items.items())

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._items


def _origin(obj: Any) -> str:
    """Where ``obj`` was defined: ``module.qualname`` (the same for a module imported twice)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


TASKS: Registry[type] = Registry("task")
REWARDS: Registry[Callable[..., Any]] = Registry("reward")


def registered_reward(name: str) -> str:
    """The registered reward a ``task.rewards`` name calls: ``http@ocr`` -> ``http`` (a label after ``@``
    tells two uses of one reward apart, :mod:`mmrl.core.reward_computer`); a plain name is itself."""
    return name.split("@", 1)[0]


ADVANTAGES: Registry[Callable[..., Any]] = Registry("advantage estimator")
PROMPT_SAMPLERS: Registry[type] = Registry("data sampler")  # data.sampler: which prompts a step draws
REWARD_MEDIA = ("any", "image", "video")  # register_reward(media=...): what a reward scores
# What the caller of the reward computer supplies per call (never a config option): ``group_ids``,
# the group of each sample, for rewards that compare a group's samples (test-time agreement).
REWARD_CONTEXT = ("group_ids",)


def register_task(name: str, override: bool = False):
    """Class decorator: ``@register_task("counting")`` makes the task available by name
    (``override=True`` replaces a task registered under that name)."""

    def wrap(cls):
        cls.name = name
        return TASKS.register(name, cls, override)

    return wrap


def register_reward(name: str, minimum: float = 0.0, check: Callable[..., None] | None = None,
                    media: str = "any", override: bool = False, maximum: float = 1.0,
                    options: Iterable[str] | None = None):
    """Function decorator for a batched reward ``fn(completions, examples, <its options>) -> list``.

    Its options (what ``task.reward_kwargs.<name>`` may set) are the parameters it names after
    ``completions, examples``, less the per-call context :data:`REWARD_CONTEXT` (``group_ids``),
    which the reward computer passes to a reward that names it or takes ``**kwargs``. A config key
    that is not an option stops the run at setup, naming the options, as the estimators do; a
    ``**kwargs`` therefore receives the context only. A reward that reads options through
    ``**kwargs`` (it forwards them to a library, say) declares them: ``options=("a", "b")``.

    A reward returns one float per completion, or ``None`` where the text cannot be parsed;
    ``None`` scores ``minimum`` and is counted in the run's metrics. Scores lie in ``[minimum,
    maximum]`` (default [0, 1]; a paper's reward with another range declares it, e.g. DeepEyes'
    [-0.2, 2.0]; the reward fuzz tests check it). ``check(**reward_kwargs)``
    (optional) validates the reward's configuration (e.g. that a weights path exists) when the
    run is set up, so a misconfigured reward stops the run before training instead of scoring
    every batch at its minimum.

    ``media="image"`` declares a reward that scores images: a video completion (a list of
    frames) is then scored frame by frame and reduced per clip by the reward kwarg ``frames``
    (``mean`` | ``min``), see :mod:`mmrl.media.clips`. ``media="video"`` declares a reward that
    scores whole clips (a list of frames; a still image is a 1-frame clip): it is called with the
    completions as they come, like ``"any"``, and handles clips itself (e.g. motion checks across
    frames). ``"any"``: completions as they come.
    """
    if media not in REWARD_MEDIA:
        raise ValueError(f"register_reward({name!r}): media must be one of {', '.join(REWARD_MEDIA)}, got {media!r}")

    def wrap(fn):
        declared, context = _reward_parameters(name, fn, options)
        if media == "image":  # imported here: this module imports nothing of mmrl at load time
            from mmrl.media.clips import per_frame

            fn, checked = per_frame(fn, name, check)
            declared += ("frames",)  # per_frame's reduction of a clip's frame scores
        else:
            checked = check
        fn.reward_options = declared
        fn.reward_context = context
        fn.reward_name = name
        fn.reward_minimum = minimum
        fn.reward_maximum = maximum
        fn.reward_check = checked
        fn.reward_media = media
        return REWARDS.register(name, fn, override)

    return wrap


def _reward_parameters(name: str, fn: Callable, options: Iterable[str] | None) -> tuple[tuple, tuple]:
    """``(options, context)`` of the reward ``fn``: the option names it takes (``options`` where
    declared, else the parameters it names after its two positional ones, less the context) and
    the per-call context names it receives (those it names; all with ``**kwargs``)."""
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:2]
    named = [p.name for p in params if p not in positional and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    open_ = any(p.kind is p.VAR_KEYWORD for p in params)
    context = tuple(c for c in REWARD_CONTEXT if open_ or c in named)
    if options is None:
        return tuple(n for n in named if n not in REWARD_CONTEXT), context
    declared = (options,) if isinstance(options, str) else tuple(options)
    wrong = [o for o in declared if o in REWARD_CONTEXT or not (open_ or o in named)]
    if wrong:
        raise ValueError(f"register_reward({name!r}, options=...): {', '.join(wrong)} cannot be an option (the "
                         f"context {', '.join(REWARD_CONTEXT)} is passed per call; a declared option is a "
                         f"parameter of the reward or read through its **kwargs)")
    return declared, context


def register_advantage(name: str, inputs: tuple[str, ...] = (), override: bool = False,
                       make_state: Callable[[], Any] | None = None):
    """Function decorator for an advantage estimator (see :mod:`mmrl.core.advantages`).

    ``inputs`` names the per-batch values the estimator needs beyond rewards and group ids, which
    the trainer supplies as keyword arguments: ``lengths`` (actions per sample), ``prompt_keys``
    (a stable id per sample's prompt), ``task_ids`` (the data source of each sample), ``r_max``
    (the best reachable total reward), ``policy_kl`` (KL(pi_old || pi_new) of the last update),
    and, supplied for environment tasks by the episode runner (one row per step): ``episode_ids``
    (the episode each step belongs to), ``step_indices`` (the step's position t = 0, 1, ... in its
    episode) and ``anchor_keys`` (a string identifying the state the step acted from).

    ``make_state``: for a stateful estimator, the zero-argument factory of the state it keeps
    across steps (see :mod:`mmrl.core.advantages.base`); None for a stateless one.
    """

    def wrap(fn):
        fn.estimator_name = name
        fn.estimator_inputs = tuple(inputs)
        fn.make_state = make_state
        return ADVANTAGES.register(name, fn, override)

    return wrap


def register_sampler(name: str, override: bool = False):
    """Class decorator for a prompt sampler (``data.sampler``; see :mod:`mmrl.core.batch.prompts`)."""

    def wrap(cls):
        cls.name = name
        return PROMPT_SAMPLERS.register(name, cls, override)

    return wrap


# -- the other named choices of a config: each a registry, so `mmrl list` shows them all ---------------

LOSSES: Registry[Callable[..., Any]] = Registry("loss")
SDE_SAMPLERS: Registry[Callable[..., Any]] = Registry("SDE sampler")
SELECTIONS: Registry[Callable[..., Any]] = Registry("batch selection")
KL_SCHEDULES: Registry[Callable[..., Any]] = Registry("KL schedule")
PERTURBATIONS: Registry[Callable[..., Any]] = Registry("image perturbation")
ENGINES: Registry[type] = Registry("rollout engine")
ENVS: Registry[type] = Registry("environment")  # multi-step environments (mmrl.envs)
# tools a VLM calls inside a completion (zoom_in, crop, rotate ...; mmrl.tools)
TOOLS: Registry[type] = Registry("tool", modules=("mmrl.tools.builtin",))
# by task modality: the policy that trains a task of it
POLICIES: Registry[type] = Registry("policy", modules=("mmrl.vlm.policy", "mmrl.diffusion.policy"))
# train.optim: the optimizer of the trained parameters (the built-ins register in mmrl.core.optimizer)
OPTIMIZERS: Registry[Callable[..., Any]] = Registry("optimizer", modules=("mmrl.core.optimizer",))


def register_loss(name: str, requires: tuple[str, ...] = ("logps",), override: bool = False):
    """Function decorator for a policy loss (``algo.loss_type``; see :mod:`mmrl.core.losses`).

    ``requires`` names what the policy must compute for it: ``logps`` (per-action log-probs) for
    the likelihood-ratio losses, or what a likelihood-free loss needs (DiffusionNFT's velocities);
    a policy that cannot compute one of them refuses the loss at setup.
    """

    def wrap(fn):
        fn.loss_name = name
        fn.loss_requires = tuple(requires)
        return LOSSES.register(name, fn, override)

    return wrap


def register_optimizer(name: str, master_weights: bool, override: bool = False):
    """Function decorator for an optimizer factory ``fn(params, *, lr, betas, weight_decay, eps)``
    (``train.optim``; see :mod:`mmrl.core.optimizer`).

    ``master_weights``: the trained parameters are kept in float32 and forwards autocast to the
    compute dtype (True), or they are kept in the compute dtype, bfloat16, and the optimizer alone
    must keep the small updates (False; :mod:`mmrl.core.precision` decides the dtype from this).
    """

    def wrap(fn):
        fn.optim_name = name
        fn.master_weights = bool(master_weights)
        return OPTIMIZERS.register(name, fn, override)

    return wrap


def _register_as(registry: Registry, attribute: str):
    def decorator(name: str, override: bool = False):
        def wrap(obj):
            setattr(obj, attribute, name)
            return registry.register(name, obj, override)

        return wrap

    return decorator


register_sde_sampler = _register_as(SDE_SAMPLERS, "sde_sampler_name")
register_selection = _register_as(SELECTIONS, "selection_name")
register_kl_schedule = _register_as(KL_SCHEDULES, "schedule_name")
register_perturbation = _register_as(PERTURBATIONS, "perturbation_name")
register_engine = _register_as(ENGINES, "engine_name")
register_env = _register_as(ENVS, "name")  # @register_env("synthetic_gui") on an mmrl.envs.Env
register_tool = _register_as(TOOLS, "name")  # @register_tool("zoom_in") on an mmrl.tools.Tool
# @register_policy("vlm") on a policy class (mmrl.core.policy.PolicyBase): it trains the tasks whose
# ``modality`` is that name, so a new modality is a plugin like a task.
register_policy = _register_as(POLICIES, "modality")

# the model families a policy loads: a checkpoint's config.model_type -> its VLM family
# (mmrl.vlm.families.VLMFamily), a diffusers pipeline's model_index.json _class_name -> its loader
VLM_FAMILIES: Registry[Any] = Registry("VLM family (model_type)", modules=("mmrl.vlm.families",))
GENERATOR_FAMILIES: Registry[Callable[..., Any]] = Registry("generator family (pipeline class)",
                                                            modules=("mmrl.diffusion.adapters",))
# the shipped tiny models: the model.path names that load each, what `mmrl build-tiny NAME` rebuilds
# (mmrl.config.tiny_models.TinyModel)
TINY_MODELS: Registry[Any] = Registry("tiny model", modules=("mmrl.config.tiny_models",))

# benchmark protocols (mmrl.eval_protocols): `mmrl eval --benchmark NAME`
BENCHMARKS: Registry[Any] = Registry("benchmark", modules=("mmrl.eval_protocols.protocols",
                                                           "mmrl.eval_protocols.visual_search"))

ALL_REGISTRIES: dict[str, Registry] = {
    "tasks": TASKS, "rewards": REWARDS, "advantage estimators": ADVANTAGES, "losses": LOSSES,
    "data samplers (prompts)": PROMPT_SAMPLERS, "SDE samplers": SDE_SAMPLERS, "batch selections": SELECTIONS,
    "KL schedules": KL_SCHEDULES, "image perturbations": PERTURBATIONS, "rollout engines": ENGINES,
    "environments": ENVS, "tools": TOOLS, "policies (task modalities)": POLICIES, "optimizers": OPTIMIZERS,
    "benchmarks": BENCHMARKS, "VLM families (model_type)": VLM_FAMILIES,
    "generator families (pipeline class)": GENERATOR_FAMILIES, "tiny models (mmrl build-tiny)": TINY_MODELS,
}


# -- plugin loading: installed by mmrl.plugins, so this module imports nothing of mmrl ---------------

_plugin_loader: Callable[[Iterable[str]], None] | None = None


def set_plugin_loader(loader: Callable[[Iterable[str]], None]) -> None:
    """Install the function that imports the built-in and third-party plugins (mmrl.plugins does
    this when the package is imported). Registries call it before every lookup."""
    global _plugin_loader
    _plugin_loader = loader


def load_plugins(extra: Iterable[str] = ()) -> None:
    """Import built-in plugins, installed ``mmrl.plugins`` entry points, then ``extra`` (module
    names or ``.py`` paths); see :func:`mmrl.plugins.load_plugins`."""
    if _plugin_loader is not None:
        _plugin_loader(extra)
