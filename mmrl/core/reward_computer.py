"""Score completions with a weighted set of registered rewards, without ever crashing the run.

A reward may return ``None`` for text it cannot parse, or raise on inputs its author did not
foresee; both score the reward's declared minimum and are counted, so a run on a 100k-example
dataset is never killed by one odd completion, and the counts show when a reward is misbehaving.

A configuration error, by contrast, stops the run at setup: each reward is called with its options
(``task.reward_kwargs.<name>``, checked against the options it declares, see
:func:`mmrl.registry.register_reward`) and the per-call context it takes (:data:`REWARD_CONTEXT`),
kept apart, so a misspelt option is an error naming the valid ones rather than a ``**ctx`` entry
nobody reads.

A reward computed elsewhere (a reward service, the ``http`` reward) returns
``concurrent.futures.Future`` s in place of scores: :meth:`RewardComputer.start` sends every
request, :meth:`PendingRewards.result` awaits them when the step needs the rewards (so the
trainer's log-prob passes run meanwhile). A future that raises scores the minimum and is counted,
``reward/<name>/late_frac`` for a time-out, ``reward/<name>/failed_frac`` for any other failure. A
reward that takes a ``minimum`` option (a served reward, whose range only its service knows) is
given that value for failed and unparsable samples instead of its registered minimum.

One reward used twice, with other options, takes a label after ``@`` (``http@ocr`` and ``http@pickscore``:
two reward services; ``vlm_judge@style``): the label is its name in ``task.rewards``,
``task.reward_kwargs`` and the metrics, the part before ``@`` the registered reward it calls.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, Sequence

import torch

from mmrl.config.options import check_names
from .example import Example
from ..registry import REWARD_CONTEXT, REWARDS, registered_reward

log = logging.getLogger(__name__)


class RewardComputer:
    """``weights``: reward name -> weight; ``reward_kwargs``: name -> its options; ``key``: the
    config key they came from, named by the error a misspelt option raises."""

    def __init__(self, weights: dict[str, float], reward_kwargs: dict[str, dict] | None = None,
                 key: str = "task.reward_kwargs"):
        if not weights:
            raise ValueError("no rewards configured: set task.rewards (name: weight) or give the task defaults")
        self.weights = dict(weights)
        self.kwargs = {k: dict(v) for k, v in (reward_kwargs or {}).items()}
        unknown = set(self.kwargs) - set(self.weights)
        if unknown:
            raise ValueError(f"{key} names rewards that are not used: {sorted(unknown)}")
        self.fns = {name: REWARDS.get(registered_reward(name), f"task.rewards.{name}") for name in self.weights}
        for name, fn in self.fns.items():  # configuration errors now, not as minimum scores later
            # register_reward sets reward_options, reward_context, reward_check and reward_minimum
            check_names(fn.reward_options, self.kwargs.get(name, {}), f"{key}.{name}", f"the {name} reward")
            if fn.reward_check is not None:
                _checked(fn, name, self.kwargs.get(name, {}), key)

    def __call__(self, completions: Sequence[str], examples: Sequence[dict], **ctx: Any):
        """Returns ``(total (N,), {name: (N,)}, stats)`` where stats counts unparsable/errors.

        ``ctx``: the per-call context (:data:`REWARD_CONTEXT`; the trainer passes ``group_ids``
        (N,), so rewards that compare a group's samples can), each value given to the rewards that
        take it, after their options."""
        return self.start(completions, examples, **ctx).result()

    def start(self, completions: Sequence[str], examples: Sequence[dict], **ctx: Any) -> "PendingRewards":
        """Call every reward now (a reward computed elsewhere sends its requests and returns
        futures); what :meth:`__call__` returns comes from the result's ``result()``."""
        stray = sorted(set(ctx) - set(REWARD_CONTEXT))
        if stray:
            raise TypeError(f"reward context {', '.join(stray)} is not declared (mmrl.registry.REWARD_CONTEXT: "
                            f"{', '.join(REWARD_CONTEXT)})")
        n = len(completions)
        raws: dict[str, tuple[list, int]] = {}
        for name, fn in self.fns.items():
            try:
                context = {k: ctx[k] for k in fn.reward_context if k in ctx}
                raw = list(fn(list(completions), list(examples), **self.kwargs.get(name, {}), **context))
                if len(raw) != n:
                    raise ValueError(f"reward {name!r} returned {len(raw)} scores for {n} completions")
                raws[name] = (raw, 0)
            except Exception as exc:  # a broken reward must not kill a long run
                log.warning("reward %r raised %s: %s; scoring the batch at its minimum", name, type(exc).__name__, exc)
                raws[name] = ([None] * n, n)
        return PendingRewards(lambda: self._finish(raws, n))

    def _minimum(self, name: str) -> float:
        fn = self.fns[name]
        if "minimum" in fn.reward_options:
            return float(self.kwargs.get(name, {}).get("minimum", fn.reward_minimum))
        return float(fn.reward_minimum)

    def _finish(self, raws: dict[str, tuple[list, int]], n: int):
        components: dict[str, torch.Tensor] = {}
        stats: dict[str, float] = {}
        total = torch.zeros(n)
        for name, (raw, errors) in raws.items():
            minimum = self._minimum(name)
            remote = any(isinstance(r, Future) for r in raw)
            raw, late, failed = _resolved(raw)
            unparsable = sum(1 for r in raw if r is None or not math.isfinite(float(r))) - late - failed
            scores = torch.tensor([minimum if r is None or not math.isfinite(float(r)) else float(r) for r in raw])
            components[name] = scores
            total += self.weights[name] * scores
            stats[f"reward/{name}/unparsable_frac"] = (unparsable - errors) / max(n, 1)
            if errors:
                stats[f"reward/{name}/errors"] = float(errors)
            if remote:
                stats[f"reward/{name}/late_frac"] = late / max(n, 1)
                stats[f"reward/{name}/failed_frac"] = failed / max(n, 1)
        return total, components, stats


def _checked(fn, name: str, options: dict, key: str) -> None:
    """``fn``'s own check of its options; under a label (``http@ocr``) its message names the labelled key
    (rewards name their options ``task.reward_kwargs.<reward>.<option>``)."""
    base = registered_reward(name)
    try:
        fn.reward_check(**options)
    except (ValueError, FileNotFoundError) as exc:  # what reward checks raise
        message = str(exc).replace(f"task.reward_kwargs.{base}", f"{key}.{name}")
        if message == str(exc) or type(exc) not in (ValueError, FileNotFoundError):
            raise
        raise type(exc)(message) from None


class PendingRewards:
    """Rewards whose computation has started: :meth:`result` awaits the scores computed elsewhere
    and returns ``(total, components, stats)`` as :meth:`RewardComputer.__call__` does."""

    def __init__(self, finish):
        self._finish, self._result = finish, None

    def result(self):
        if self._result is None:
            self._result = self._finish()
        return self._result


def _resolved(raw: list) -> tuple[list, int, int]:
    """``raw`` with every future replaced by its score (None where it raised), and the counts of
    futures that timed out and that failed otherwise."""
    out, late, failed = [], 0, 0
    for r in raw:
        if isinstance(r, Future):
            try:
                r = r.result()
            except TimeoutError:
                r, late = None, late + 1
            except Exception:  # a dead or refusing service: counted, never fatal
                r, failed = None, failed + 1
        out.append(r)
    return out, late, failed


class PerSourceRewards:
    """One :class:`RewardComputer` per source of a mixture task, called like a RewardComputer.

    Why not one RewardComputer over the union of rewards: the sources' rewards answer different
    questions (a count's ``accuracy`` means nothing for a box) and a reward name may need different
    options per source (``format`` strict for one, answer-only for another). So the batch is split
    by ``ex["source"]``, each part is scored by its source's computer, and the results are put back
    in the batch's order.

    Returns ``(total (N,), {name: (N,)}, stats)`` like RewardComputer. The components are the union
    of all sources' reward names; a sample whose source does not use a reward has 0.0 there (so a
    component's batch mean mixes in those zeros; ``reward/by_source/<source>`` is the clean
    per-source signal). Stats are each computer's, renamed ``reward/<source>/...``, plus
    ``reward/by_source/<source>``: the mean total reward of that source's samples in the batch
    (sources absent from the batch have no stats). ``ctx`` is passed to every source, with its
    per-sample values (tensors or lists of length N, e.g. ``group_ids``) cut to that source's rows.

    ``weights`` is the union of the sources' weights, which z-score aggregation uses to weight each
    component; a name with different weights in two sources is therefore an error.
    """

    def __init__(self, computers: dict[str, RewardComputer]):
        if not computers:
            raise ValueError("PerSourceRewards needs at least one source")
        self.computers = dict(computers)
        self.weights: dict[str, float] = {}
        owner: dict[str, str] = {}
        for source, computer in self.computers.items():
            for name, w in computer.weights.items():
                if name in self.weights and self.weights[name] != w:
                    raise ValueError(
                        f"reward {name!r} has weight {self.weights[name]} in source {owner[name]!r} but {w} in "
                        f"{source!r}; reward aggregation (algo.reward_aggregation: zscore) weights each "
                        f"component name once, so give {name!r} the same weight in every source"
                    )
                self.weights.setdefault(name, w)
                owner.setdefault(name, source)

    def __call__(self, completions: Sequence[str], examples: Sequence[Example], **ctx: Any):
        return self.start(completions, examples, **ctx).result()

    def start(self, completions: Sequence[str], examples: Sequence[Example], **ctx: Any) -> PendingRewards:
        """Each source's rewards started (see :meth:`RewardComputer.start`)."""
        n = len(completions)
        if len(examples) != n:
            raise ValueError(f"{n} completions but {len(examples)} examples")
        parts: dict[str, list[int]] = {source: [] for source in self.computers}
        for i, ex in enumerate(examples):
            source = ex.get("source") if isinstance(ex, Mapping) else None
            if source not in parts:
                raise ValueError(
                    f"example {i} has source {source!r}; per-source rewards need ex['source'] to be one "
                    f"of {list(self.computers)} (examples of a mixture task carry it)"
                )
            parts[source].append(i)
        started = {source: (idx, self.computers[source].start([completions[i] for i in idx],
                                                              [examples[i] for i in idx], **_rows(ctx, idx, n)))
                   for source, idx in parts.items() if idx}
        return PendingRewards(lambda: self._finish(started, n))

    def _finish(self, started: dict[str, tuple[list[int], PendingRewards]], n: int):
        total = torch.zeros(n)
        components = {name: torch.zeros(n) for name in self.weights}
        stats: dict[str, float] = {}
        for source, (idx, pending) in started.items():
            sub_total, sub_components, sub_stats = pending.result()
            where = torch.tensor(idx, dtype=torch.long)
            total[where] = sub_total.to(total.dtype)
            for name, scores in sub_components.items():
                components[name][where] = scores.to(total.dtype)
            for key, value in sub_stats.items():
                stats[f"reward/{source}/{key.removeprefix('reward/')}"] = value
            stats[f"reward/by_source/{source}"] = float(sub_total.mean())
        return total, components, stats


def _rows(ctx: dict[str, Any], idx: list[int], n: int) -> dict[str, Any]:
    """``ctx`` with every per-sample value (a length-``n`` tensor or list) cut to rows ``idx``."""
    out = {}
    for key, value in ctx.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            value = value[torch.tensor(idx, dtype=torch.long)]
        elif isinstance(value, list) and len(value) == n:
            value = [value[i] for i in idx]
        out[key] = value
    return out


def make_reward_computer(task, task_cfg):
    """The reward scorer for ``task`` under the config's ``task`` section.

    A plain task: a RewardComputer with weights ``task_cfg.rewards`` (else the task's ``rewards``)
    and kwargs the task's ``reward_kwargs`` updated by ``task_cfg.reward_kwargs``. A task that
    scores each data source with its own rewards (a mixture: ``task.reward_sources()``): a
    PerSourceRewards with each source's weights and kwargs; there the run-wide ``task.rewards`` /
    ``task.reward_kwargs`` are an error, since one set of rewards cannot apply to every source.
    """
    sources = task.reward_sources()
    if sources is None:
        weights = dict(task_cfg.rewards) or dict(task.rewards)
        kwargs = {**task.reward_kwargs, **{k: dict(v) for k, v in task_cfg.reward_kwargs.items()}}
        return RewardComputer(weights, kwargs)
    for key, value in (("rewards", task_cfg.rewards), ("reward_kwargs", task_cfg.reward_kwargs)):
        if value:
            raise ValueError(
                f"task.{key} is set, but task {task.name!r} mixes sources {list(sources)} "
                f"that each have their own rewards; set task.options.{key}.<source> instead "
                f"(e.g. task.options.{key}.{next(iter(sources))})"
            )
    computers = {}
    for source, (weights, kwargs) in sources.items():
        if not weights:
            raise ValueError(f"source {source!r} has no rewards: set task.options.rewards.{source} (name: weight)")
        computers[source] = RewardComputer(dict(weights), {k: dict(v) for k, v in kwargs.items()},
                                           key=f"task.options.reward_kwargs.{source}")
    return PerSourceRewards(computers)
