"""Shared fixtures: a randomly initialised tiny Qwen2.5-VL built locally (no downloads)."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def random_tiny_dir(tmp_path_factory):
    """An untrained tiny Qwen2.5-VL checkpoint directory (tokenizer trained on task text)."""
    from mmrl.registry import TASKS, load_plugins
    from mmrl.vlm import tiny
    from mmrl.vlm.sft import tokenizer_corpus

    load_plugins()
    tasks = [TASKS.get("counting")(), TASKS.get("grounding")()]
    tok = tiny.build_tokenizer(tokenizer_corpus(tasks, per_task=200), vocab_size=512)
    path = tmp_path_factory.mktemp("tiny-random")
    tiny.save_tiny(tiny.build_model(tok, seed=0, hidden_size=64, layers=2), tiny.build_processor(tok), path)
    return path


def make_config(*overrides: str, path=None):
    from mmrl.config import load_config

    return load_config(path, list(overrides))
