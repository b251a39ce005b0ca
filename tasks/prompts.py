"""Text-to-image (or -video) RL on your own prompts: a prompt file and any image rewards.

``train_path`` / ``eval_path``: a ``.txt`` file (one prompt per line; blank lines and lines
starting with ``#`` skipped), or records with a ``prompt`` key in any data format mmrl reads
(JSONL, JSON, parquet, a ``datasets`` directory; ``fields: {prompt: caption}`` maps another key);
other keys are kept on the example for rewards, e.g. ``target_color``. Rewards come from the config
(``task.rewards``), e.g. ``{jpeg_compressibility: 1.0}`` (weight-free) or ``{clip_score: 1.0}``
with ``task.reward_kwargs.clip_score.pretrained`` pointing at local weights.
"""

from __future__ import annotations

from pathlib import Path

from mmrl import Task, register_task
from mmrl.data.records import BadRecord


def _parse(record: dict) -> dict:
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRecord("no non-empty string 'prompt'")
    return {**record, "prompt": prompt.strip()}


def read_prompt_lines(path: Path) -> list[dict]:
    """``{"prompt": ...}`` examples from a .txt file: one prompt a line, ``#`` lines are comments."""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8-sig").splitlines()]  # a BOM dropped, as data files
    prompts = [{"prompt": ln} for ln in lines if ln and not ln.startswith("#")]
    if not prompts:
        raise ValueError(f"{path} has no prompts (one per line; '#' lines are comments)")
    return prompts


@register_task("t2i_prompts")
class PromptFile(Task):
    modality = "diffusion"
    rewards = {"jpeg_compressibility": 1.0}

    def default_options(self):
        return {"train_path": None, "eval_path": None}

    def examples(self, split: str):
        if split not in ("train", "eval"):
            raise ValueError(f"{self.name}: unknown split {split!r}; valid splits: ['eval', 'train']")
        path = self.options[f"{split}_path"] or (self.options["train_path"] if split == "eval" else None)
        if not path:
            raise ValueError(f"task {self.name!r} needs task.options.train_path (a prompt file; eval_path "
                             "defaults to it)")
        cache = self.__dict__.setdefault("_splits", {})
        if path not in cache:
            file = Path(str(path)).expanduser()
            if file.suffix == ".txt":
                if not file.is_file():
                    raise FileNotFoundError(f"prompt file not found: {file} (task.options.{split}_path)")
                cache[path] = read_prompt_lines(file)
            else:
                cache[path] = self.read_examples(path, _parse, split)
        return cache[path]

    def prompt(self, ex: dict) -> str:
        return ex["prompt"]

    def build_prompt(self, ex: dict) -> str:
        return self.prompt(ex)
