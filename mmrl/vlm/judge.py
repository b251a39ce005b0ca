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


def answer_spellings(word: str) -> tuple[str, ...]:
    """The spellings of an answer word the judge counts: ``word``, ``" " + word`` and their capitalised forms."""
    return word, " " + word, word.capitalize(), " " + word.capitalize()


def answer_token_ids(tokenizer, word: str) -> list[int]:
    """Ids of the single-token spellings of an answer word: ``word``, ``" " + word`` and their
    capitalised forms. The first answer token follows the chat template's "assistant\\n", so a
    chat model usually writes "Yes"/"yes" without a space, but a BPE vocabulary may only have the
    spaced form as one token (or the capitalised one); summing the probability of every
    single-token spelling counts the answer however the model spells it. Multi-token spellings
    are skipped: their first piece (e.g. "y") says nothing about yes vs no."""
    ids = set()
    for variant in answer_spellings(word):
        tokens = tokenizer.encode(variant, add_special_tokens=False)
        if len(tokens) == 1:
            ids.add(int(tokens[0]))
    if not ids:
        raise ValueError(f"vlm_judge: the tokenizer has no single-token spelling of {word!r}")
    return sorted(ids)


def resolve_checkpoint(path: str) -> Path:
    """The checkpoint directory of ``path``: ``"tiny"`` is mmrl's built-in tiny Qwen2.5-VL, anything
    else must be a local directory with a ``config.json`` (FileNotFoundError otherwise)."""
    from mmrl.vlm.loading import resolve_model_path

    return resolve_model_path(str(path))


class VLMJudge:
    """A Qwen-VL-family model loaded with mmrl's loader (:func:`mmrl.vlm.loading.load_vlm`),
    reading P(yes) / (P(yes) + P(no)) at the first answer token."""

    def __init__(self, path: str | Path, device, dtype: str = "float32"):
        from mmrl.core.precision import compute_dtype
        from mmrl.vlm.loading import load_vlm

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


class ChatJudge:
    """A local chat LLM that answers text prompts (transformers' ``AutoModelForCausalLM`` and its
    tokenizer's chat template): the LLM judge of DeepEyes' accuracy term
    (:mod:`mmrl.measures.deepeyes_judge`). Local directories only; nothing is downloaded."""

    def __init__(self, path: str | Path, device, dtype: str = "float32"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mmrl.core.precision import compute_dtype

        self.tokenizer = AutoTokenizer.from_pretrained(str(path), padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=compute_dtype(dtype)).to(device).eval()
        self.device = device

    def __call__(self, prompts: Sequence[str], system: str, temperature: float = 0.0, max_new_tokens: int = 8,
                 batch_size: int = 8) -> list[str]:
        """The judge's reply to each prompt (a system message, then the prompt as the user turn);
        sampled at ``temperature`` from torch's global random state (greedy at 0)."""
        import torch

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        sampling = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature > 0 else \
            dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        replies: list[str] = []
        for start in range(0, len(prompts), batch_size):
            texts = [tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": p}],
                                             tokenize=False, add_generation_prompt=True)
                     for p in prompts[start:start + batch_size]]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            with torch.no_grad():
                out = self.model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=pad, **sampling)
            replies += tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return replies


def yes_share(top_logprobs) -> float | None:
    """P(yes) / (P(yes) + P(no)) from a server's top log-probs of the first answer token (pairs of
    token text and log-prob, e.g. an OpenAI-compatible answer's ``top_logprobs``): the ratio
    :class:`VLMJudge` computes from the logits, over the same spellings (:func:`answer_spellings`).
    A spelling outside the top counts as 0, so the ratio is exact when every spelling the model
    gives weight is listed (ask for enough: vLLM's ``--max-logprobs``); None when neither answer is."""
    import math

    yes = sum(math.exp(lp) for token, lp in top_logprobs if token in answer_spellings("yes"))
    no = sum(math.exp(lp) for token, lp in top_logprobs if token in answer_spellings("no"))
    return yes / (yes + no) if yes + no > 0 else None
