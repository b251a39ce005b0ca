"""A VLM asked a yes/no question about an image, scored P(yes) / (P(yes) + P(no)) (the VQAScore recipe):
what ``vlm_judge`` (does the image show the prompt?) and ``edit_instruction`` (did the edit follow the
instruction?) share. Local weights (:class:`mmrl.vlm.judge.VLMJudge`, loaded once per path and
device) or an OpenAI-compatible server (``judge_url``: the top log-probs of the first answer token,
futures; :mod:`._judge_client`)."""

from __future__ import annotations

from mmrl.vlm.judge import VLMJudge, resolve_checkpoint

from ._judge_client import JudgeServer, check_served, yes_probabilities
from ._scorers import _cached, _device, _require_path


def check_yes_judge(reward: str, path=None, judge_url=None, **options) -> None:
    """Setup check: a served judge's options, or a local checkpoint (or "tiny") that exists."""
    if not check_served(reward, "path", path, judge_url, **options) and str(path) != "tiny":
        _require_path(path, f"task.reward_kwargs.{reward}.path")


def yes_scores(reward: str, images: list, questions: list[str], path: str | None = None, device: str = "auto",
               dtype: str = "float32", batch_size: int = 8, judge_url: str | None = None,
               judge_model: str | None = None, judge_token_env: str | None = None, judge_timeout: float = 60.0,
               judge_retries: int = 2, judge_concurrency: int = 8, judge_top_logprobs: int = 20) -> list:
    """P(yes) of each (image, question), a float (local) or a future of one (served)."""
    if not images:
        return []
    if judge_url is not None:
        server = JudgeServer.of(judge_url, judge_model, judge_token_env, judge_timeout, judge_retries,
                                judge_concurrency)
        return yes_probabilities(server, images, questions, judge_top_logprobs)
    key = f"task.reward_kwargs.{reward}.path"
    if str(path) != "tiny":
        _require_path(path, key)
    try:
        where = resolve_checkpoint(str(path))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{key}={path!r}: {exc}") from None
    dev = _device(device)
    judge = _cached(("vlm_judge", str(where.resolve()), str(dev), dtype), lambda: VLMJudge(where, dev, dtype))
    return list(judge(images, questions, batch_size))
