"""Did the edit follow the instruction? ``edit_instruction`` (a VLM judge, any edit data) and, for the
synthetic edits of :mod:`mmrl.data.shape_edits`, ``edit_success`` / ``edit_score`` (verified from pixels).

``edit_instruction``: a VLM sees the source and the result side by side (one image: source left,
result right, a 1/16-width gap of the background colour between) and is asked whether the right one
follows the instruction; the score is P(yes) / (P(yes) + P(no)) of its first answer token, as the
``vlm_judge`` reward scores images (VQAScore; rewards/_yes_judge.py). One composed image rather than
two, so the same question goes to a local mmrl VLM (``path``: a local Qwen-VL-family checkpoint, or
"tiny") and to an OpenAI-compatible server (``judge_url``, ``judge_model``, ... as ``vlm_judge``
takes them: rewards/_judge_client.py) alike. The question is ``question`` with ``{instruction}``
filled in.

``edit_success``: 1 when every check of :func:`mmrl.measures.edits.edit_checks` passes (the edited
object's colour, position and shape; the rest kept, no extra object, the background outside the edit
region unchanged), else 0: the task's metric. ``edit_score``: the fraction of those checks passed,
the dense signal RL trains on (as ``composition`` is to ``composition_strict``).
"""

from __future__ import annotations

from PIL import Image

from mmrl import register_reward
from mmrl.measures.batch import check_batch, score_each
from mmrl.measures.edits import edit_checks

from ._yes_judge import check_yes_judge, yes_scores

DEFAULT_QUESTION = ('The left picture is an image before editing, the right picture the same image after editing '
                    'with the instruction "{instruction}". Does the right picture follow the instruction and keep '
                    'the rest of the left picture unchanged? Answer yes or no.')


def side_by_side(source: Image.Image, result: Image.Image) -> Image.Image:
    """``source`` | gap | ``result``, both at the result's size."""
    source = source.convert("RGB").resize(result.size, Image.BICUBIC) if source.size != result.size else source.convert("RGB")
    w, h = result.size
    gap = max(1, w // 16)
    canvas = Image.new("RGB", (2 * w + gap, h), (255, 255, 255))
    canvas.paste(source, (0, 0))
    canvas.paste(result.convert("RGB"), (w + gap, 0))
    return canvas


def _check_edit_judge(path=None, judge_url=None, **options):
    options.pop("question", None)
    check_yes_judge("edit_instruction", path, judge_url, **options)


@register_reward("edit_instruction", check=_check_edit_judge, media="image")
def edit_instruction(completions, examples, path: str | None = None, question: str = DEFAULT_QUESTION,
                     device: str = "auto", dtype: str = "float32", batch_size: int = 8, judge_url: str | None = None,
                     judge_model: str | None = None, judge_token_env: str | None = None, judge_timeout: float = 60.0,
                     judge_retries: int = 2, judge_concurrency: int = 8, judge_top_logprobs: int = 20) -> list:
    """P(yes) in [0, 1] (or a future of it, served); None for a completion that is not a PIL image or
    an example without ``source`` and ``instruction``."""
    check_batch("edit_instruction", completions, examples, items="images")
    valid = [i for i, (im, ex) in enumerate(zip(completions, examples))
             if isinstance(im, Image.Image) and isinstance(ex, dict) and isinstance(ex.get("source"), Image.Image)
             and isinstance(ex.get("instruction"), str)]
    images = [side_by_side(examples[i]["source"], completions[i]) for i in valid]
    questions = [question.replace("{instruction}", examples[i]["instruction"]) for i in valid]
    scores = yes_scores("edit_instruction", images, questions, path, device, dtype, batch_size, judge_url,
                        judge_model, judge_token_env, judge_timeout, judge_retries, judge_concurrency,
                        judge_top_logprobs)
    out: list = [None] * len(completions)
    for i, s in zip(valid, scores):
        out[i] = s
    return out


def _checks(name: str, completions, examples, reduce) -> list:
    def score(image, ex):
        if not isinstance(image, Image.Image) or not isinstance(ex, dict) or "edit" not in ex:
            return None
        return reduce(list(edit_checks(image, ex).values()))

    return score_each(name, completions, examples, score, items="images")


@register_reward("edit_success", media="image")
def edit_success(completions, examples) -> list:
    """1.0 iff every edit check passes, else 0.0; None without a synthetic edit (``ex["edit"]``)."""
    return _checks("edit_success", completions, examples, lambda c: float(all(c)))


@register_reward("edit_score", media="image")
def edit_score(completions, examples) -> list:
    """The fraction of the edit checks passed, in [0, 1]; None without a synthetic edit."""
    return _checks("edit_score", completions, examples, lambda c: sum(c) / len(c))
