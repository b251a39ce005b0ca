"""A VLM policy's rollouts: chat prompts in, :class:`~mmrl.core.rollouts.Rollouts` out.

Prompts are encoded by the processor (images and clips taken out of the messages), completions are
sampled by the configured rollout engine (:mod:`mmrl.vlm.engines`) or, for off-policy guidance,
given and teacher-forced; either way each sample keeps its token ids and pixels in the batch's
payload (:func:`payload_keys`) so the same sequences can be re-scored (:mod:`mmrl.vlm.scoring`).

:class:`VLMSampling` is a part of :class:`~mmrl.vlm.policy.VLMPolicy`; it reads what the policy
sets up: ``cfg``, ``processor``, ``tokenizer``, ``engine``, ``eos_ids``, ``suppressed_ids``, and
calls its ``score``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..core.rollouts import Rollouts
from ..media.pixels import to_rgb
from .engines import Sampling
from .family_processing import split_images


def payload_keys(family) -> tuple[str, ...]:
    """What a sample keeps to be re-scored: its token ids, its family's image tensors
    (``VLMFamily.image_keys``; Qwen-VL: ``pixel_values``, ``image_grid_thw``) and ``video``, its
    video inputs (:func:`~mmrl.vlm.processing.split_videos`; None without video)."""
    return ("prompt_ids", "completion_ids", *family.image_keys, "video")


class VLMSampling:
    """Prompt encoding, sampling and teacher forcing of :class:`~mmrl.vlm.policy.VLMPolicy`."""

    # -- encoding -------------------------------------------------------------------------------
    @staticmethod
    def split_messages(messages: list[dict]) -> tuple[list[dict], list[Any], list[Any]]:
        """Images and videos out of the chat messages (the template sees placeholders, the
        processor pixels): ``(messages, images, videos)``, videos as
        :class:`~mmrl.media.video.Clip`."""
        images, videos, clean = [], [], []
        for msg in messages:
            content = msg["content"]
            if isinstance(content, list):
                items = []
                for item in content:
                    if item.get("type") == "video" or "video" in item:
                        videos.append(item["video"])
                        items.append({"type": "video"})
                    elif item.get("type") == "image" or "image" in item:
                        images.append(item["image"])
                        items.append({"type": "image"})
                    else:
                        items.append(item)
                clean.append({**msg, "content": items})
            else:
                clean.append(msg)
        return clean, images, videos

    def encode_prompts(self, prompts: Sequence[list[dict]]) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Model inputs for a batch of chat prompts, and how many images each prompt has (a
        sample's videos are found by its processor's ``split_videos``)."""
        texts, images, videos = [], [], []
        for messages in prompts:
            clean, imgs, clips = self.split_messages(messages)
            texts.append(self.processor.apply_chat_template(clean))
            images.append([to_rgb(im) for im in imgs])  # transparency on white, as transformers
            videos.append(clips)
        enc = self.processor(texts, images if any(images) else None, videos if any(videos) else None)
        return enc, [len(x) for x in images]

    def split_videos(self, enc: dict) -> list[dict | None]:
        """Each sample's video inputs in a batch encoding (None without video)."""
        return self.processor.split_videos(enc)

    def decode(self, ids: torch.Tensor) -> str:
        return self.processor.decode(ids.tolist())

    # -- sampling -------------------------------------------------------------------------------
    def sampling(self, mode: str, stop: Sequence[str] = ()) -> Sampling:
        """The training rollout's settings (``rollout.*``; modes "train" and "sample"), or for
        ``mode="eval"`` the same budget at ``eval.temperature``; ``stop``: texts that end a sample."""
        r = self.cfg.rollout
        temperature = self.cfg.eval.temperature if mode == "eval" else r.temperature
        return Sampling(temperature, r.top_p, r.top_k, r.max_completion_length, max(0, r.batch_size), tuple(stop))

    def _batch(self, samples: list[dict], examples: list[dict], group_ids: torch.Tensor,
               off_policy: torch.Tensor | None, need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """A :class:`Rollouts` of engine-style sample dicts, with the log-probs asked for."""
        lengths = [len(s["completion_ids"]) for s in samples]
        mask = torch.zeros(len(samples), max(lengths, default=0))
        for i, L in enumerate(lengths):
            mask[i, :L] = 1.0
        batch = Rollouts(
            group_ids=group_ids,
            action_mask=mask,
            completions=[self.decode(s["completion_ids"]) for s in samples],
            examples=examples,
            truncated=torch.tensor([s["truncated"] for s in samples], dtype=torch.bool),
            off_policy=off_policy,
            payload={k: [s[k] for s in samples] for k in payload_keys(self.processor.family)},
        )
        if samples and all(s.get("logprobs") is not None for s in samples):
            # The engine reported its own sampling log-probs (vLLM): either they are the old
            # log-probs (rollout.use_engine_logprobs), or the trainer's forward gives the old
            # log-probs and the objective corrects for the mismatch (truncated IS; the core asks
            # for those: mmrl.core.batch.scoring.complete_logps).
            engine = torch.zeros_like(mask)
            for i, s in enumerate(samples):
                engine[i, :len(s["logprobs"])] = torch.as_tensor(s["logprobs"], dtype=engine.dtype)
            if self.cfg.rollout.use_engine_logprobs:
                batch.old_logps = engine
                need_old_logps = False
            else:
                batch.rollout_logps = engine
        empty = torch.zeros(0, 0)
        if need_old_logps:
            batch.old_logps = self.score(batch, reference=False) if samples else empty
        if need_ref_logps:
            batch.ref_logps = self.score(batch, reference=True) if samples else empty
        return batch

    def take_rollout_stats(self) -> dict[str, float]:
        """Samples cut by ``rollout.max_time`` (when set) and the engine's counters (a server's
        retries and errors) since the last call."""
        stats = {"rollout_timeouts": float(self.engine.take_timeouts())} if self.cfg.rollout.max_time > 0 else {}
        return {**stats, **self.engine.take_stats()}

    def publish_weights(self) -> None:
        """The current weights into the rollout engine's own copy now (asynchronous training)."""
        self.engine.push_weights()

    def turn_cache(self):
        """While open, a rollout continuing the last one's sequences (the agent loop's next turn)
        reuses their keys/values (the engine's turn cache: :mod:`mmrl.vlm.turn_cache`)."""
        return self.engine.turn_cache()

    def rollout(self, examples: Sequence[dict], prompts: Sequence[list[dict]], n: int, mode: str = "train",
                need_old_logps: bool = False, need_ref_logps: bool = False, stop: Sequence[str] = ()) -> Rollouts:
        """``n`` samples for each prompt; group i holds the samples of ``prompts[i]``; a sample also
        ends where it writes one of the ``stop`` texts (a tool call's closing tag)."""
        samples = self.engine.generate([p for p in prompts for _ in range(n)], self.sampling(mode, stop))
        return self._batch(samples, [ex for ex in examples for _ in range(n)],
                           torch.arange(len(prompts)).repeat_interleave(n), None, need_old_logps, need_ref_logps)

    def _end_of_turn_id(self) -> int:
        """The stop token a real completion ends with: the family's end of turn (``<|im_end|>``
        for Qwen chat models: the chat template closes every assistant turn with it) when it stops
        generation, else the tokenizer's EOS, else the first of the generation config's EOS ids."""
        im_end = self.tokenizer.convert_tokens_to_ids(self.processor.family.end_of_turn)
        if im_end in self.eos_ids:
            return int(im_end)
        if self.tokenizer.eos_token_id in self.eos_ids:
            return int(self.tokenizer.eos_token_id)
        return int(sorted(self.eos_ids)[0])

    def rollout_given(self, examples: Sequence[dict], prompts: Sequence[list[dict]], completions: Sequence[str],
                      need_old_logps: bool, need_ref_logps: bool, stop: Sequence[str] = ()) -> Rollouts:
        """One sample per ``(example, prompt, completion)`` by teacher forcing, not generation:
        the off-policy samples of "TempSamp-R1: Effective Temporal Sampling with Reinforcement
        Fine-Tuning for Video LLMs" (e.g. ground-truth solutions injected into the groups).

        Prompts are encoded as ``generate`` does; a completion is its text tokenized without
        special tokens plus the end-of-turn id a real completion stops with (none after a text that
        ends with one of the ``stop`` texts: generation with them would have stopped there). Longer than
        ``rollout.max_completion_length`` it is cut there (no stop token, ``truncated``).
        ``group_ids = arange(len(prompts))``, ``off_policy`` is all True and ``completions`` are
        the decoded ids (what the rewards see, as for generated samples). The payload has the
        keys of :meth:`rollout`, so the batch can be scored, concatenated and trained on.
        """
        if not len(examples) == len(prompts) == len(completions):
            raise ValueError(f"rollout_given: {len(examples)} examples, {len(prompts)} prompts and "
                             f"{len(completions)} completions; one of each per sample")
        max_len = self.cfg.rollout.max_completion_length
        end_of_turn, stop_texts = self._end_of_turn_id(), tuple(stop)
        bs = self.cfg.rollout.batch_size if self.cfg.rollout.batch_size > 0 else max(1, len(prompts))
        samples: list[dict] = []
        for start in range(0, len(prompts), bs):
            chunk = prompts[start:start + bs]
            enc, images_per_sample = self.encode_prompts(chunk)
            images = split_images(enc, images_per_sample, self.processor)
            videos = self.split_videos(enc)
            for i in range(len(chunk)):
                text_ids = self.tokenizer(completions[start + i], add_special_tokens=False)["input_ids"]
                if any(tok in self.suppressed_ids for tok in text_ids):
                    raise ValueError(f"rollout_given: completion {start + i} contains a vision placeholder "
                                     "token (<|image_pad|>, <|vision_start|>, ...), which is never sampled "
                                     "and cannot be scored")
                ended = any(completions[start + i].endswith(t) for t in stop_texts)
                ids = list(text_ids) + ([] if ended else [end_of_turn])
                samples.append({
                    "prompt_ids": enc["input_ids"][i][enc["attention_mask"][i].bool()],
                    "completion_ids": torch.tensor(ids[:max_len], dtype=torch.long),
                    "truncated": len(ids) > max_len,
                    **images[i],
                    "video": videos[i],
                })
        return self._batch(samples, list(examples), torch.arange(len(prompts)),
                           torch.ones(len(samples), dtype=torch.bool), need_old_logps, need_ref_logps)
