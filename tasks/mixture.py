"""``mixture``: one run over several tasks, every example labelled with the task it came from.

Why a task and not a trainer feature: the trainer already knows how to sample indices of one
sequence, prompt, score and log; a mixture only has to present several tasks as one sequence and
route each example back to its own task. The label (``ex["source"]``, plus ``ex["source_id"]``,
its position in ``tasks``) is what data-source bandits (DUMP) and per-task normalisation
(Stratified GRPO) need, and what :class:`mmrl.core.reward_computer.PerSourceRewards` scores by::

    task:
      name: mixture
      options:
        tasks: {counting: {query: color}, grounding: {}}   # source name -> the task's options
        rewards: {grounding: {iou: 1.0}}                   # optional per-source weight overrides

A source is named by its key, which is also the registered task it builds unless its options name
another with ``task``: ``tasks: {color: {task: counting, query: color}, shape: {task: counting,
query: shape}}`` mixes one task under two sets of options (the tiny default's SFT mixture does).
How often each source is drawn is the prompt sampler's business (``data.sampler=weighted``).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from mmrl import Task, UnknownNameError, make_task, register_task
from mmrl.data.sequence import LazySequence, split_stats, usable_item
from mmrl.measures.batch import check_batch


class SourceConcat(LazySequence):
    """Several sources' sequences seen as one, lazily: item i is looked up in its source on access.

    ``order="concat"``: the sources one after another (source_offsets[s] is where s starts), the
    layout for training, where the trainer's sampler picks indices anyway.
    ``order="round_robin"``: item i is source ``i % k`` at local index ``i // k`` while every source
    lasts; once the shorter ones run out the remaining ones continue to alternate. The layout for
    evaluation, whose callers take the first n items: those then cover every source evenly.

    ``source_offsets`` always gives the start of each source's block in the *concatenation*; in
    round-robin order a source's items are not contiguous, use :meth:`locate` / :meth:`index_of`.
    Items are shallow copies of the source's example with ``source`` (name) and ``source_id``
    (position among the sources) added; the source's own dict is never modified.
    """

    ORDERS = ("concat", "round_robin")

    def __init__(self, sources: Mapping[str, Sequence[dict]], order: str = "concat"):
        if order not in self.ORDERS:
            raise ValueError(f"SourceConcat: unknown order {order!r}; valid orders: {self.ORDERS}")
        self.sources = dict(sources)
        self.order = order
        self._names = list(self.sources)
        self._sizes = [len(s) for s in self.sources.values()]
        self.source_sizes: dict[str, int] = dict(zip(self._names, self._sizes))
        self._ends: list[int] = []  # cumulative ends of the concatenation's blocks
        total = 0
        for size in self._sizes:
            total += size
            self._ends.append(total)
        self.source_offsets: dict[str, int] = {n: e - s for n, e, s in zip(self._names, self._ends, self._sizes)}
        self._len = total

    def __len__(self) -> int:
        return self._len

    # -- index arithmetic (no source item is touched) -------------------------------------------
    def _covered(self, rounds: int) -> int:
        """Round-robin: how many items the first ``rounds`` rounds hold (a source of size s takes
        part in rounds 0..s-1, one item each)."""
        return sum(min(s, rounds) for s in self._sizes)

    def _normalise(self, i) -> int:
        i = operator.index(i)
        if not -self._len <= i < self._len:
            raise IndexError(f"index {i} out of range for {self._len} examples")
        return i % self._len

    def locate(self, i: int) -> tuple[str, int]:
        """``(source name, index within that source)`` of item ``i``."""
        i = self._normalise(i)
        if self.order == "concat":
            j = bisect.bisect_right(self._ends, i)
            return self._names[j], i - (self._ends[j] - self._sizes[j])
        # The round r holding i: the largest r with _covered(r) <= i (binary search, O(k log n)).
        lo, hi = 0, max(self._sizes)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._covered(mid) <= i:
                lo = mid
            else:
                hi = mid
        active = [j for j, s in enumerate(self._sizes) if s > lo]
        return self._names[active[i - self._covered(lo)]], lo

    def index_of(self, source: str, local: int) -> int:
        """The inverse of :meth:`locate`: the position of ``source``'s item ``local`` (e.g. for a
        sampler that first picks a source, then an example within it)."""
        if source not in self.source_sizes:
            raise KeyError(f"unknown source {source!r}; sources: {self._names}")
        local = operator.index(local)
        if not 0 <= local < self.source_sizes[source]:
            raise IndexError(f"source {source!r} has {self.source_sizes[source]} examples, no index {local}")
        if self.order == "concat":
            return self.source_offsets[source] + local
        j = self._names.index(source)
        return self._covered(local) + sum(1 for s in self._sizes[:j] if s > local)

    # -- items ------------------------------------------------------------------------------------
    def item(self, i: int) -> dict:
        name, local = self.locate(i)
        return self._tagged(self.sources[name][local], name)

    def usable(self, i: int) -> dict | None:
        name, local = self.locate(i)
        ex = usable_item(self.sources[name], local)
        return None if ex is None else self._tagged(ex, name)

    def _tagged(self, ex: dict, name: str) -> dict:
        return {**ex, "source": name, "source_id": self._names.index(name)}

    def stats(self) -> dict[str, Any]:
        """Each count summed over the sources, and each source's under its name."""
        per_source = {name: split_stats(s) for name, s in self.sources.items()}
        out: dict[str, Any] = {}
        for counts in per_source.values():
            for k, v in counts.items():
                if isinstance(v, (int, float)):
                    out[k] = out.get(k, 0) + v
        return {**out, "sources": per_source}

    def __repr__(self) -> str:
        return f"SourceConcat({self.source_sizes}, order={self.order!r})"


def _mapping(value: Any, what: str) -> dict:
    """``value`` as a plain dict; ``None`` (an empty YAML entry such as ``grounding:``) is {}."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"mixture: {what} must be a mapping, got {value!r}")
    return dict(value)


@register_task("mixture")
class Mixture(Task):
    """Examples, prompts, targets, hints and metrics of several registered tasks, by source.

    Rewards are not summed over the sources: each source keeps its own reward set (its defaults,
    or ``rewards.<source>``), scored by :func:`mmrl.core.reward_computer.make_reward_computer`, which
    builds a :class:`~mmrl.core.reward_computer.PerSourceRewards` for a mixture. The class-level
    ``rewards`` stays empty on purpose, so code that would score every sample with one reward set
    fails loudly instead of scoring counting answers with an IoU reward.
    """

    def default_options(self):
        return {
            "tasks": {},  # registry name -> that task's options; at least two entries
            "rewards": {},  # source -> {reward: weight}, replacing that task's default weights
            "reward_kwargs": {},  # source -> {reward: kwargs}, on top of that task's defaults
        }

    def __init__(self, **options):
        super().__init__(**options)
        specs = _mapping(self.options["tasks"], "option tasks (task name -> options)")
        if len(specs) < 2:
            raise ValueError(
                f"mixture: option tasks needs at least two tasks (name -> options), got {sorted(specs)}; "
                f"e.g. tasks: {{counting: {{query: color}}, grounding: {{}}}}"
            )
        self.sub_tasks: dict[str, Task] = {}
        for name, opts in specs.items():
            sub_options = _mapping(opts, f"the options of task {name!r}")
            registered = sub_options.pop("task", name)  # a source may name its task (one task, two option sets)
            if registered == self.name:
                raise ValueError("mixture: a mixture cannot contain a mixture; list its tasks directly")
            try:
                self.sub_tasks[name] = make_task(registered, **sub_options)
            except UnknownNameError as exc:
                raise UnknownNameError(f"mixture option tasks ({name}): {exc}") from None
        modalities = {n: t.modality for n, t in self.sub_tasks.items()}
        if len(set(modalities.values())) > 1:
            raise ValueError(f"mixture: all tasks must share one modality (one policy trains on all), got {modalities}")
        self.modality = next(iter(modalities.values()))
        self.sources: list[str] = list(self.sub_tasks)

        overrides = _mapping(self.options["rewards"], "option rewards (source -> {reward: weight})")
        kw_overrides = _mapping(self.options["reward_kwargs"], "option reward_kwargs (source -> {reward: kwargs})")
        for opt, given in (("rewards", overrides), ("reward_kwargs", kw_overrides)):
            unknown = set(given) - set(self.sub_tasks)
            if unknown:
                raise ValueError(f"mixture: option {opt} names tasks not in the mixture: {sorted(unknown)}; "
                                 f"tasks: {self.sources}")
        # Per-source reward weights and kwargs, resolved once. A task's default kwargs for a reward
        # that an override dropped are left out (they were defaults, not the user's request).
        self.source_rewards: dict[str, dict[str, float]] = {}
        self.source_reward_kwargs: dict[str, dict[str, dict]] = {}
        for name, task in self.sub_tasks.items():
            weights = _mapping(overrides.get(name), f"rewards.{name}") or dict(task.rewards)
            kwargs = {k: dict(v) for k, v in task.reward_kwargs.items() if k in weights}
            kwargs.update({k: _mapping(v, f"reward_kwargs.{name}.{k}")
                           for k, v in _mapping(kw_overrides.get(name), f"reward_kwargs.{name}").items()})
            self.source_rewards[name] = weights
            self.source_reward_kwargs[name] = kwargs

    # -- sources ----------------------------------------------------------------------------------
    def source_names(self) -> list[str]:
        return list(self.sources)

    def source_sizes(self, examples: SourceConcat) -> dict[str, int]:
        return dict(examples.source_sizes)

    def reward_sources(self) -> dict[str, tuple[dict[str, float], dict[str, dict]]]:
        """Each task's rewards: the ``rewards`` / ``reward_kwargs`` options where given, else its own."""
        return {source: (self.source_rewards[source], self.source_reward_kwargs[source]) for source in self.sources}

    # -- routing ----------------------------------------------------------------------------------
    def source_of(self, ex: dict) -> str:
        """The source name of ``ex``; a clear error for an example that did not come from
        :meth:`examples` (no ``source``) or from another mixture (unknown source)."""
        source = ex.get("source") if isinstance(ex, Mapping) else None
        if source is None:
            raise ValueError(
                "mixture: the example has no 'source' key; mixture examples must come from "
                f"Mixture.examples(split) (sources: {self.sources})"
            )
        if source not in self.sub_tasks:
            raise ValueError(f"mixture: unknown source {source!r}; sources: {self.sources}")
        return source

    def task_of(self, ex: dict) -> Task:
        return self.sub_tasks[self.source_of(ex)]

    # -- data -------------------------------------------------------------------------------------
    def examples(self, split: str) -> SourceConcat:
        """The sub-tasks' ``split`` as one lazy sequence: "eval" in round-robin order (so the first
        n examples an evaluation takes cover every task), any other split concatenated."""
        parts = {name: task.examples(split) for name, task in self.sub_tasks.items()}
        return SourceConcat(parts, order="round_robin" if split == "eval" else "concat")

    def sft_examples(self, split: str) -> SourceConcat:
        """What ``mmrl sft`` imitates, laid out as :meth:`examples`: each source's own SFT examples
        (an environment or tool task's are its reference steps or turns), else its examples."""
        parts = {name: getattr(task, "sft_examples", task.examples)(split) for name, task in self.sub_tasks.items()}
        return SourceConcat(parts, order="round_robin" if split == "eval" else "concat")

    def prompt(self, ex: dict) -> list[dict]:
        return self.task_of(ex).prompt(ex)

    def build_prompt(self, ex: dict) -> list[dict]:
        return self.task_of(ex).build_prompt(ex)

    def target(self, ex: dict) -> str:
        return self.task_of(ex).target(ex)

    def hints(self, ex: dict) -> list[str]:
        return self.task_of(ex).hints(ex)

    # -- evaluation -------------------------------------------------------------------------------
    def success(self, completion, ex: dict) -> bool | None:
        return self.task_of(ex).success(completion, ex)

    def metrics(self, completions, examples) -> dict[str, float]:
        """Each source's own metrics on its samples, as ``<source>/<metric>``, plus
        ``<source>/count`` (its number of samples; 0, with no other keys, when absent)."""
        check_batch("mixture.metrics", completions, examples)
        by_source: dict[str, list[int]] = {name: [] for name in self.sources}
        for i, ex in enumerate(examples):
            by_source[self.source_of(ex)].append(i)
        out: dict[str, float] = {}
        for name, idx in by_source.items():
            out[f"{name}/count"] = float(len(idx))
            if idx:
                sub = self.sub_tasks[name].metrics([completions[i] for i in idx], [examples[i] for i in idx])
                out.update({f"{name}/{k}": v for k, v in sub.items()})
        return out

    def visualize(self, ex: dict, completion: str):
        return self.task_of(ex).visualize(ex, completion)
