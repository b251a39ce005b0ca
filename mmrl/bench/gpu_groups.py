"""The groups of ``mmrl bench gpu`` (:mod:`mmrl.bench.gpu`), one per process:
``python -m mmrl.bench.gpu_groups GROUP OUT_DIR`` reads ``OUT_DIR/options.json`` and appends one
JSON line per measured side to ``OUT_DIR/rows.jsonl``. ``GROUP,GROUP,...`` (``--tiny``) runs
several in turn in one process, appending each one's status to ``OUT_DIR/groups.jsonl``.

- ``full`` / ``lora``: the like-for-like rows of ``mmrl bench speed`` (:mod:`mmrl.bench.speed_compare`):
  per pair (vision tower trained on both sides, frozen on both; LoRA: one pair) mmrl with each
  rollout cache of ``caches`` (dynamic, static: transformers' compiled static-cache decode,
  static_plain: the same without shared prefixes in training, vllm: ``rollout.engine=vllm`` where
  installed) and TRL's ``GRPOTrainer`` at its defaults and its best settings on the prompts the
  first mmrl run drew, every row ``repeats`` times in alternating order, one line per run.
- ``optimizers``: one step per ``train.optim`` (bf16 compute), peak memory and step time.
- ``fit448``: one full fine-tuning step with 448-px scenes at the micro-batch asked: whether it fits
  without the out-of-memory back-off lowering the micro-batch.
- ``generator``: the SD3.5-Medium-shaped pipeline (:mod:`mmrl.bench.shaped_generator`) on Flow-GRPO's
  recipe (``diffusion/sd3_5_medium``: 1 prompt x 16 images of 512 px, LoRA r32, CFG 4.5, 10 SDE
  steps, KL 0.04, micro-batch 4), every step stochastic and trained, then with a 2-step SDE window.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from .diffusion import VARIANTS as DIFFUSION_VARIANTS
from .gpu import PEAK_BF16_TFLOPS, GpuBenchOptions
from .speed import DEFAULT_CONFIG, SpeedOptions, mmrl_overrides, run_mmrl_side
from .speed_common import SideResult

# cache -> (rollout.engine, overrides); "static_plain": the static cache with the per-sample
# training forward (train.shared_prefix=false), the setting of the 2026-11-27 GPU rows, so a session
# measures what the shared-prefix default changes on the GPU
CACHES = {"dynamic": ("hf", ["rollout.cache_implementation=dynamic"]),
          "static": ("hf", ["rollout.cache_implementation=static"]),
          "static_plain": ("hf", ["rollout.cache_implementation=static", "train.shared_prefix=false"]),
          "vllm": ("vllm", [])}


def update_flops(config: dict, prompt_tokens: float, completion_tokens: float, lora: bool) -> float:
    """Model FLOPs of one update over ``prompt_tokens + completion_tokens`` tokens: 2 N per token
    forward for the language model's matmul weights N, the LM head on completion tokens only (only
    their log-probs are needed); backward twice the forward for full fine-tuning, once with LoRA
    (activation gradients only). Attention scores and the vision tower are left out (small at
    these lengths and image sizes), so the MFU is a slight underestimate."""
    t = config.get("text_config", config)
    h, layers, inter, vocab = t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"], t["vocab_size"]
    kv = t["num_key_value_heads"] * (h // t["num_attention_heads"])
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter  # q, o; k, v; gate, up, down
    forward = 2 * layers * per_layer * (prompt_tokens + completion_tokens) + 2 * h * vocab * completion_tokens
    return forward * (2 if lora else 3)


def peak_flops(device_name: str, override: float | None) -> float | None:
    if override:
        return override * 1e12
    return next((v * 1e12 for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


class Group:
    """One group's runs and the lines it appends."""

    def __init__(self, name: str, out_dir: Path):
        self.name, self.out_dir = name, out_dir
        self.opts = GpuBenchOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in
                                       json.loads((out_dir / "options.json").read_text()).items()})
        from .speed_model import model_dir

        self.path = model_dir(self.opts.shape, out_dir)
        self.model_config = json.loads((self.path / "config.json").read_text())
        self.device_name = torch.cuda.get_device_name() if self.opts.device == "cuda" else "cpu"

    def speed_options(self, **changes: Any) -> SpeedOptions:
        o = self.opts
        base = SpeedOptions(shape=o.shape, prompts=o.prompts, generations=o.generations, tokens=o.tokens,
                            steps=o.steps, warmup=o.warmup, micro_batch=o.micro_batch, device=o.device, seed=o.seed)
        return replace(base, **changes).resolved()

    def config(self, sopts: SpeedOptions, overrides: list[str], run: str, tower: str = "frozen",
               threads: bool = True):
        """mmrl's recipe with the group's settings; ``threads``: apply ``train.threads`` on a CPU
        (the speed rows apply it once, so every run of the comparison has the same count)."""
        from ..config import builtin_config_path, load_config

        lora = [f"model.lora.r={self.opts.lora_rank}", f"model.lora.alpha={2 * self.opts.lora_rank}"] if sopts.lora else []
        cfg = load_config(builtin_config_path(DEFAULT_CONFIG), [*self.opts.extra, *lora, *overrides,
                                                                *mmrl_overrides(sopts, self.path, self.out_dir / run,
                                                                                tower=tower)])
        if threads and sopts.device == "cpu":
            from mmrl.config.threads import configure_threads

            configure_threads(cfg)
        return cfg

    def emit(self, run: str, side: str, sopts: SpeedOptions, result: SideResult | None = None, note: str = "",
             **extra: Any) -> None:
        row: dict[str, Any] = {"group": self.name, "name": run, "side": side, "note": note, **extra,
                               "settings": self.settings(sopts)}
        if result is not None:
            row["summary"] = result.summary()
            row["micro_batch_used"] = result.micro_batch_used
            row["update_mfu"] = self.mfu(row["summary"], sopts)
        with (self.out_dir / "rows.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{self.name}] {run}: " + (json.dumps(row.get("summary")) if result else note), flush=True)

    def settings(self, sopts: SpeedOptions) -> dict[str, Any]:
        import transformers

        try:
            import trl
            trl_version = trl.__version__
        except ImportError:
            trl_version = None
        return {"device_name": self.device_name, "torch": torch.__version__, "transformers": transformers.__version__,
                "trl": trl_version, "shape": sopts.shape, "dtype": sopts.dtype, "lora": sopts.lora,
                "tokens": sopts.tokens, "micro_batch": sopts.micro_batch, "threads": torch.get_num_threads()}

    def mfu(self, m: dict, sopts: SpeedOptions) -> float | None:
        """The update's model FLOPs over its seconds and the card's peak (None without a known peak)."""
        peak = peak_flops(self.device_name, self.opts.peak_tflops) if self.name != "generator" else None
        flops = update_flops(self.model_config, m["prompt_tokens_per_step"], m["completion_tokens_per_step"], sopts.lora)
        return flops / m["update_s"] / peak if peak and m["update_s"] > 0 else None

    def guarded(self, run: str, sopts: SpeedOptions, fn) -> Any:
        """``fn()``, or an error row (the exception's last line) if it raises; None then."""
        try:
            return fn()
        except Exception as exc:  # one run's failure is a row of the table, not the end of the group
            traceback.print_exc()
            self.emit(run, "mmrl" if not run.startswith("TRL") else "trl", sopts,
                      note=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            return None
        finally:
            import gc

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # -- the groups -----------------------------------------------------------------------------
    def speed(self, lora: bool) -> None:
        """The like-for-like rows of ``mmrl bench speed`` (:mod:`mmrl.bench.speed_compare`): each
        pair (tower trained on both sides, frozen on both; LoRA: one pair) with mmrl per cache and
        TRL per settings, every row ``repeats`` times in alternating order; one line per run."""
        from .speed import run_comparison
        from .speed_compare import rows_for

        sopts = self.speed_options(lora=lora, repeats=self.opts.repeats, towers=self.opts.towers, trl=self.opts.trl)
        caches = [c for c in self.opts.caches if c != "vllm" or _has("vllm")]
        if missing := [c for c in self.opts.caches if c not in caches]:
            for row in rows_for(sopts.towers, missing, (), lora):
                self.emit_run({"pair": row.pair, "name": row.name, "side": "mmrl", "tower": row.tower,
                               "variant": row.variant, "repeat": 0, "note": "not run: vLLM is not installed here"},
                              sopts)
        if not caches:
            return
        rows = rows_for(sopts.towers, caches, sopts.trl, lora)

        def config_for(row):
            engine, overrides = CACHES[row.variant]
            return self.config(replace(sopts, engine=engine), overrides, f"{row.tower}-{row.name.replace(' ', '-')}",
                               tower=row.tower, threads=False)

        def failed(row, exc: Exception) -> str:
            traceback.print_exc()
            return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"

        if sopts.device == "cpu":
            from mmrl.config.threads import configure_threads

            configure_threads(config_for(rows[0]))
        run_comparison(rows, sopts, config_for, self.path, self.out_dir, on_record=lambda rec: self.emit_run(rec, sopts),
                       on_error=failed, echo=lambda line: print(f"[{self.name}] {line}", flush=True))

    def emit_run(self, record: dict, sopts: SpeedOptions) -> None:
        """One run of the comparison as a line of ``rows.jsonl`` (its update MFU added)."""
        row = {"group": self.name, **{k: v for k, v in record.items() if k != "logs"}, "settings": self.settings(sopts)}
        if record.get("summary"):
            row["update_mfu"] = self.mfu(record["summary"], sopts)
        with (self.out_dir / "rows.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    def optimizers(self) -> None:
        # a warm-up step first: the measured step's peak holds the optimizer state and gradients
        # (the steady state), and its time leaves out CUDA's and torchao's first-call costs
        sopts = self.speed_options(tokens=self.opts.optim_tokens, steps=1, warmup=1, dtype="bfloat16")
        for optim in self.opts.optims:
            run = f"mmrl train.optim={optim}"
            cfg = self.config(sopts, [f"train.optim={optim}"], f"optim-{optim}")
            out = self.guarded(run, sopts, lambda: run_mmrl_side(cfg, sopts))
            if out is not None:
                self.emit(run, "mmrl", sopts, out[0], note=f"{self.opts.optim_tokens} tokens, one step after a warm-up step")

    def generator(self) -> None:
        from ..config import builtin_config_path, load_config
        from .shaped_generator import build_sd3_shaped

        o = self.opts
        path = build_sd3_shaped(self.out_dir / ("sd3-tiny" if o.tiny else "sd3.5-medium-shape"), tiny=o.tiny)
        prompts = self.out_dir / "generator-prompts.txt"
        prompts.write_text("a red circle\na blue square on the left\ntwo green circles\n")
        sopts = self.speed_options(dtype="bfloat16" if not o.tiny else "float32", steps=min(o.steps, 2),
                                   warmup=min(o.warmup, 1))
        for name, variant in GENERATOR_VARIANTS.items():
            run = f"mmrl generator, {name}"
            cfg = load_config(builtin_config_path("diffusion/sd3_5_medium"), [
                f"model.path={path}", f"task.options.train_path={prompts}", f"train.device={o.device}",
                f"train.steps={sopts.warmup + sopts.steps}", "train.prompts_per_step=1", f"train.seed={o.seed}",
                "eval.before=false", "log.tensorboard=false", "log.progress=false", "log.save_rollouts_every=0",
                f"log.output_dir={self.out_dir}", f"log.run_name=generator-{name.replace(' ', '-')}",
                *(GENERATOR_TINY if o.tiny else ()), *variant])
            result = self.guarded(run, sopts, lambda: run_generator_side(cfg, sopts.steps, sopts.warmup))
            if result is not None:
                self.emit(run, "mmrl", sopts, result, note=f"{cfg.rollout.num_generations} images of "
                          f"{cfg.diffusion.height} px, {cfg.diffusion.num_steps} steps, CFG {cfg.diffusion.guidance_scale}")

    def fit448(self) -> None:
        size = self.opts.fit_image_size
        sopts = self.speed_options(steps=1, warmup=0)
        run = f"mmrl {size}-px scenes"
        cfg = self.config(sopts, [f"task.options.image_size={size}", f"vlm.max_pixels={size * size}",
                                  f"vlm.min_pixels={size * size}"], "fit448")
        out = self.guarded(run, sopts, lambda: run_mmrl_side(cfg, sopts))
        if out is not None:
            used = out[0].micro_batch_used
            fits = used == sopts.micro_batch
            self.emit(run, "mmrl", sopts, out[0], fits=fits,
                      note=(f"fits micro-batch {sopts.micro_batch}" if fits else
                            f"did not fit micro-batch {sopts.micro_batch}: the out-of-memory back-off trained at {used}"))


GENERATOR_VARIANTS = {"full SDE": DIFFUSION_VARIANTS["full_sde"], "SDE window 2": DIFFUSION_VARIANTS["sde_window"]}
GENERATOR_TINY = ("model.dtype=float32", "diffusion.height=16", "diffusion.width=16", "diffusion.num_steps=4",
                  "rollout.num_generations=4", "rollout.batch_size=4", "train.micro_batch_size=2", "model.lora.r=4",
                  "model.lora.alpha=8")


def run_generator_side(cfg, steps: int, warmup: int) -> SideResult:
    """The diffusion trainer's steps, timed as :func:`~mmrl.bench.speed.run_mmrl_side` times the VLM's."""
    from ..api import make_policy
    from ..core.trainer import Trainer, build_task
    from .speed import timed_trainer_steps

    task = build_task(cfg)
    trainer = Trainer(cfg, make_policy(cfg, task), task)
    trainer.policy.configure_optimizer(cfg.train, cfg.train.steps)
    return timed_trainer_steps(trainer, warmup + steps, warmup, torch.device(cfg.train.device))


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run(name: str, out_dir: Path) -> None:
    group = Group(name, out_dir)
    {"full": lambda: group.speed(lora=False), "lora": lambda: group.speed(lora=True),
     "optimizers": group.optimizers, "fit448": group.fit448, "generator": group.generator}[name]()


def main(argv: list[str]) -> int:
    names, out_dir = argv[0].split(","), Path(argv[1])
    if len(names) == 1:
        run(names[0], out_dir)
        return 0
    import time

    for name in names:  # one process for several groups: a group that raises is a status, the next runs
        t0 = time.monotonic()
        try:
            run(name, out_dir)
            status = "done"
        except Exception as exc:
            traceback.print_exc()
            status = f"failed ({type(exc).__name__}; see the log above)"
        seconds = round(time.monotonic() - t0, 1)
        with (out_dir / "groups.jsonl").open("a") as f:
            f.write(json.dumps({"group": name, "status": status, "seconds": seconds}) + "\n")
        print(f"[{name}] {status} in {seconds} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
