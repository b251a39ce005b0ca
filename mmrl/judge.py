"""A local Qwen-VL-family checkpoint as a yes/no judge: P("yes") for a question about an image.

The VQAScore recipe ("Evaluating Text-to-Visual Generation with Image-to-Text Generation", Lin et
al., 2024) behind the ``vlm_judge`` reward, public so a reward plugin can score images with a VLM
without reaching into mmrl's policy code. The checkpoint loads with mmrl's own loader (local
directories only, or ``"tiny"``; nothing is downloaded) and the image budget of the checkpoint's
processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from PIL import Image


def answer_token_ids(tokenizer, word: str) -> list[int]:
    """Ids of the single-token spellings of an answer word: ``word``, ``" " + word`` and their
    capitalised forms. The first answer token follows the chat template's "assistant\\n", so a
    chat model usually writes "Yes"/"yes" without a space, but a BPE vocabulary may only have the
    spaced form as one token (or the capitalised one); summing the probability of every
    single-token spelling counts the answer however the model spells it. Multi-token spellings
    are skipped: their first piece (e.g. "y") says nothing about yes vs no."""
    ids = set()
    for variant in (word, " " + word, word.capitalize(), " " + word.capitalize()):
        tokens = tokenizer.encode(variant, add_special_tokens=False)
        if len(tokens) == 1:
            ids.add(int(tokens[0]))
    if not ids:
        raise ValueError(f"vlm_judge: the tokenizer has no single-token spelling of {word!r}")
    return sorted(ids)


def resolve_checkpoint(path: str) -> Path:
    """The checkpoint directory of ``path``: ``"tiny"`` is mmrl's built-in tiny Qwen2.5-VL, anything
    else must be a local directory with a ``config.json`` (FileNotFoundError otherwise)."""
    from .vlm.loading import resolve_model_path

    return resolve_model_path(str(path))


class VLMJudge:
    """A Qwen-VL-family model loaded with mmrl's loader (:func:`mmrl.vlm.loading.load_vlm`),
    reading P(yes) / (P(yes) + P(no)) at the first answer token."""

    def __init__(self, path: str | Path, device, dtype: str = "float32"):
        from .core.precision import compute_dtype
        from .vlm.loading import load_vlm

        self.model, self.processor = load_vlm(str(path), device, compute_dtype(dtype))
        self.model.eval()
        self.device = device
        tok = self.processor.tokenizer
        self.yes_ids, self.no_ids = answer_token_ids(tok, "yes"), answer_token_ids(tok, "no")

    def _inputs(self, images: Sequence[Image.Image], questions: Sequence[str]) -> dict:
        """Processor inputs: the chat template sees an image placeholder, the processor the pixels."""
        texts = [self.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]) for q in questions]
        return self.processor(texts, [[im.convert("RGB")] for im in images])

    def __call__(self, images: Sequence[Image.Image], questions: Sequence[str], batch_size: int = 8) -> list[float]:
        import torch

        scores: list[float] = []
        for start in range(0, len(images), batch_size):
            batch = self._inputs(images[start:start + batch_size], questions[start:start + batch_size])
            inputs = {k: v.to(self.device) for k, v in batch.items()}
            with torch.no_grad():
                logits = self.model(**inputs, use_cache=False, logits_to_keep=1).logits[:, -1].float()
            # Prompts are left-padded, so the last column is every prompt's next-token position.
            # P(yes) / (P(yes) + P(no)): the full softmax's normaliser cancels, leaving a sigmoid
            # of the log-sum-exp difference of the two answers' logits.
            yes = torch.logsumexp(logits[:, self.yes_ids], dim=-1)
            no = torch.logsumexp(logits[:, self.no_ids], dim=-1)
            scores += torch.sigmoid(yes - no).tolist()
        return scores
