"""Model-based rewards from LOCAL weights: ``clip_score``, ``image_scorer``, ``vlm_judge`` (images) and
``deepeyes`` (DeepEyes' reward with its LLM judge, on answers).

mmrl never downloads weights (runs must be reproducible offline and a hub outage must not kill a
long run), so every reward here takes a local path and fails at once with the config key to set
when it is missing. Models load lazily on first use and are cached per (path, device): a reward is
called every step, a load costs seconds to minutes.

- ``clip_score``: CLIP image-text cosine ("Learning Transferable Visual Models From Natural
  Language Supervision", Radford et al., 2021; as a metric: "CLIPScore: A Reference-free
  Evaluation Metric for Image Captioning", Hessel et al., 2021), via ``open_clip`` (``mmrl[clip]``).
- ``image_scorer``: a plug-in point for learned preference/aesthetic scorers (PickScore, HPSv2,
  ImageReward, LAION aesthetic, ...), which all share one shape: load from a path, then map
  (images, prompts) to floats. :func:`register_scorer` adds one; "aesthetic_mlp" is built in.
- ``vlm_judge``: a mmrl VLM answers "does this image show {prompt}?"; the score is its
  probability of "yes" (the VQAScore recipe of "Evaluating Text-to-Visual Generation with
  Image-to-Text Generation", Lin et al., 2024), through the public :class:`mmrl.vlm.judge.VLMJudge`.

- ``deepeyes``: DeepEyes' trajectory reward ("DeepEyes: Incentivizing 'Thinking with Images' via
  Reinforcement Learning", Zheng et al., 2025) with its accuracy asked of a local chat model, on its
  judge prompt, through the public :class:`mmrl.vlm.judge.ChatJudge`.

Both judges also run on an OpenAI-compatible server instead (``judge_url``: rewards/_judge_client.py).

The first three are image rewards (``media="image"``): a clip's frames are scored in the same batch
as the images and reduced per clip by ``frames`` (``mean`` | ``min``; :mod:`mmrl.media.clips`).
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from mmrl import register_reward
from mmrl.vlm.judge import ChatJudge
from mmrl.measures.batch import check_batch
from mmrl.measures.deepeyes_judge import JUDGE_SYSTEM, judge_prompt, parse_judgement
from mmrl.measures.tool_use import deepeyes_answer, deepeyes_parts, deepeyes_total

from ._judge_client import JudgeServer, check_served, replies
from ._scorers import (_CACHE, _SCORERS, ClipModel, _cached, _device, _require_path, clear_cache, load_clip,  # noqa: F401
                       mlp_from_state_dict, register_scorer, scorer_names)
from ._service import then
from ._yes_judge import check_yes_judge, yes_scores

def _valid(completions, examples, name: str) -> list[int]:
    """Indices of the completions that are PIL images (the others score None)."""
    check_batch(name, completions, examples, items="images")
    return [i for i, im in enumerate(completions) if isinstance(im, Image.Image)]


def _prompt(ex) -> str:
    return str(ex.get("prompt", "")) if isinstance(ex, dict) else ""


def _check_clip(pretrained=None, **_):
    _require_path(pretrained, "task.reward_kwargs.clip_score.pretrained")


def _check_scorer(scorer=None, path=None, **_):
    if scorer not in _SCORERS:
        raise ValueError(f"image_scorer: unknown scorer {scorer!r} (task.reward_kwargs.image_scorer.scorer); "
                         f"registered: {', '.join(scorer_names()) or 'none'}")
    _require_path(path, "task.reward_kwargs.image_scorer.path")


def _check_judge(path=None, judge_url=None, **options):
    check_yes_judge("vlm_judge", path, judge_url, **options)


@register_reward("clip_score", minimum=-1.0, check=_check_clip, media="image")
def clip_score(completions, examples, model: str = "ViT-B-32", pretrained: str | None = None,
               device: str = "auto", scale: float = 1.0, batch_size: int = 32) -> list:
    """``scale * cos(image_emb, text_emb)`` of each image and its ``ex["prompt"]`` (in [-1, 1] for
    scale 1). ``model``: an open_clip architecture name; ``pretrained``: a local checkpoint file."""
    checkpoint = _require_path(pretrained, "task.reward_kwargs.clip_score.pretrained")
    valid = _valid(completions, examples, "clip_score")
    out: list = [None] * len(completions)
    if not valid:
        return out
    clip = load_clip(model, checkpoint, _device(device))
    images = clip.embed_images([completions[i] for i in valid], batch_size)
    texts = clip.embed_texts([_prompt(examples[i]) for i in valid], batch_size)
    for i, cos in zip(valid, (images * texts).sum(-1).tolist()):
        out[i] = scale * cos
    return out


# -- pluggable learned scorers ---------------------------------------------------------------------

@register_reward("image_scorer", check=_check_scorer, media="image")
def image_scorer(completions, examples, scorer: str | None = None, path: str | None = None,
                 device: str = "auto", scale: float = 1.0) -> list:
    """``scale *`` the registered scorer's value for each image and its ``ex["prompt"]``."""
    if scorer not in _SCORERS:
        raise ValueError(f"image_scorer: unknown scorer {scorer!r} (task.reward_kwargs.image_scorer.scorer); "
                         f"registered: {', '.join(scorer_names()) or 'none'}")
    where = _require_path(path, "task.reward_kwargs.image_scorer.path")
    valid = _valid(completions, examples, "image_scorer")
    out: list = [None] * len(completions)
    if not valid:
        return out
    dev = _device(device)
    score = _cached(("scorer", scorer, str(where), str(dev)), lambda: _SCORERS.get(scorer)(str(where), dev))
    values = list(score([completions[i] for i in valid], [_prompt(examples[i]) for i in valid]))
    if len(values) != len(valid):
        raise ValueError(f"image scorer {scorer!r} returned {len(values)} scores for {len(valid)} images")
    for i, v in zip(valid, values):
        out[i] = scale * float(v)
    return out


@register_scorer("aesthetic_mlp")
def load_aesthetic_mlp(path: str, device):
    """The LAION aesthetic predictor shape: an MLP over the unit-norm CLIP image embedding.

    ``path`` is a directory with ``head.pt`` (the MLP's state_dict) and ``config.json``:
    ``{"clip_model": "ViT-L-14", "clip_pretrained": "<checkpoint, absolute or relative to the
    directory>", "activation": "none", "normalize": true}``. The prompt is not used."""
    import torch

    folder = Path(path)
    cfg = json.loads((folder / "config.json").read_text())
    clip_path = Path(cfg["clip_pretrained"]).expanduser()
    clip_path = _require_path(clip_path if clip_path.is_absolute() else folder / clip_path,
                              f"clip_pretrained in {folder / 'config.json'}")
    clip = load_clip(cfg["clip_model"], clip_path, device)
    head = mlp_from_state_dict(torch.load(folder / "head.pt", map_location="cpu", weights_only=True),
                               cfg.get("activation")).to(device)
    normalize = bool(cfg.get("normalize", True))

    def score(images, prompts):
        emb = clip.embed_images(images, normalize=normalize)  # LAION's predictor was fit on unit-norm embeddings
        with torch.no_grad():
            return head(emb).reshape(len(images), -1)[:, 0].tolist()

    return score


# -- VLM judge ---------------------------------------------------------------------------------------

DEFAULT_QUESTION = "Does this image show {prompt}? Answer yes or no."


@register_reward("vlm_judge", check=_check_judge, media="image")
def vlm_judge(completions, examples, path: str | None = None, question: str = DEFAULT_QUESTION,
              device: str = "auto", dtype: str = "float32", batch_size: int = 8, judge_url: str | None = None,
              judge_model: str | None = None, judge_token_env: str | None = None, judge_timeout: float = 60.0,
              judge_retries: int = 2, judge_concurrency: int = 8, judge_top_logprobs: int = 20) -> list:
    """P("yes") / (P("yes") + P("no")) of the VLM at ``path`` (a local checkpoint directory, or
    "tiny" for mmrl's built-in tiny Qwen2.5-VL) asked ``question`` about each image, with
    ``{prompt}`` replaced by the example's prompt. In [0, 1]. With ``judge_url`` instead: the same
    ratio from the server's ``judge_top_logprobs`` top log-probs of the first answer token (futures;
    rewards/_judge_client.py)."""
    valid = _valid(completions, examples, "vlm_judge")
    questions = [question.replace("{prompt}", _prompt(examples[i])) for i in valid]
    scores = yes_scores("vlm_judge", [completions[i] for i in valid], questions, path, device, dtype, batch_size,
                        judge_url, judge_model, judge_token_env, judge_timeout, judge_retries, judge_concurrency,
                        judge_top_logprobs)
    out: list = [None] * len(completions)
    for i, s in zip(valid, scores):
        out[i] = s
    return out


# -- DeepEyes' reward with its LLM judge ---------------------------------------------------------------

def _check_deepeyes(judge=None, judge_url=None, **options):
    if not check_served("deepeyes", "judge", judge, judge_url, **options):
        _require_path(judge, "task.reward_kwargs.deepeyes.judge")


@register_reward("deepeyes", minimum=-0.2, maximum=2.0, check=_check_deepeyes)
def deepeyes(completions, examples, judge: str | None = None, device: str = "auto", dtype: str = "float32",
             temperature: float = 0.3, max_new_tokens: int = 8, batch_size: int = 8, judge_url: str | None = None,
             judge_model: str | None = None, judge_token_env: str | None = None, judge_timeout: float = 60.0,
             judge_retries: int = 2, judge_concurrency: int = 8) -> list:
    """DeepEyes' ``compute_score`` with its LLM judge: 0.8 * accuracy + 0.2 * format + 1.2 * tool
    (:func:`mmrl.measures.tool_use.deepeyes_parts`), accuracy the verdict of the local chat model at
    ``judge`` (DeepEyes: Qwen2.5-72B-Instruct, sampled at temperature 0.3) on DeepEyes' judge prompt
    (:mod:`mmrl.measures.deepeyes_judge`: the answer, the ground truth and ``ex["question"]``). The
    rows of one trajectory share one verdict. ``deepeyes_rule_judge`` is the same formula with a rule
    in place of the judge. None without ``ex["answer"]``. With ``judge_url`` instead of ``judge``:
    the verdicts of the chat model on that server (futures; rewards/_judge_client.py)."""
    check_batch("deepeyes", completions, examples)
    where = None if judge_url is not None else _require_path(judge, "task.reward_kwargs.deepeyes.judge")
    asks = {}
    for i, (c, ex) in enumerate(zip(completions, examples)):
        answer = deepeyes_answer(c, ex)
        if answer is not None:
            asks[i] = judge_prompt(answer, str(ex["answer"]).strip(), str(ex.get("question") or ""))
    out: list = [None] * len(completions)
    if not asks:
        return out
    prompts = list(dict.fromkeys(asks.values()))  # each trajectory (and each repeated case) asked once
    if where is None:
        server = JudgeServer.of(judge_url, judge_model, judge_token_env, judge_timeout, judge_retries,
                                judge_concurrency)
        asked = dict(zip(prompts, replies(server, prompts, JUDGE_SYSTEM, temperature, max_new_tokens)))
        for i, prompt in asks.items():
            out[i] = then(asked[prompt], lambda reply, i=i: deepeyes_total(
                deepeyes_parts(completions[i], examples[i], accuracy=parse_judgement(reply))))
        return out
    dev = _device(device)
    model = _cached(("chat_judge", str(where.resolve()), str(dev), dtype), lambda: ChatJudge(where, dev, dtype))
    verdicts = dict(zip(prompts, map(parse_judgement, model(prompts, JUDGE_SYSTEM, float(temperature),
                                                            int(max_new_tokens), int(batch_size)))))
    for i, prompt in asks.items():
        out[i] = deepeyes_total(deepeyes_parts(completions[i], examples[i], accuracy=verdicts[prompt]))
    return out
