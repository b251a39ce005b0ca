"""What the model-based rewards share (a private helper of the rewards package: rewards import it,
never each other): the image-scorer registry, the model cache, local-path checks, open_clip models,
an MLP head read from a state dict, and OpenAI CLIP's image normalisation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Sequence

from PIL import Image

from mmrl import Registry, pick_device

# OpenAI CLIP's normalisation (open_clip.constants.OPENAI_DATASET_MEAN/STD)
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

_SCORERS: Registry[Callable] = Registry("image scorer")  # one registry implementation: mmrl's
_CACHE: dict[tuple, object] = {}  # loaded models, per (kind, name, path, device)


# -- shared helpers --------------------------------------------------------------------------------

def _require_path(path, key: str) -> Path:
    """``path`` as an existing local Path, else FileNotFoundError naming the config ``key``."""
    if path is None or str(path) == "" or not Path(str(path)).expanduser().exists():
        raise FileNotFoundError(
            f"{key}={path!r} is not an existing local path. Set {key} to local weights; mmrl "
            "downloads nothing, so fetch the checkpoint yourself first."
        )
    return Path(str(path)).expanduser().resolve()


def _device(device):
    return pick_device(str(device))


def _cached(key: tuple, load: Callable[[], object]):
    if key not in _CACHE:
        _CACHE[key] = load()
    return _CACHE[key]


def clear_cache() -> None:
    """Forget every loaded model (tests; freeing memory between evaluations)."""
    _CACHE.clear()


# -- CLIP ------------------------------------------------------------------------------------------

def _import_open_clip():
    try:
        import open_clip
    except ImportError as exc:
        raise ImportError("this reward needs open_clip: pip install 'mmrl[clip]'") from exc
    return open_clip


class ClipModel:
    """An open_clip model, its image preprocessing and tokenizer, with unit-norm embeddings."""

    def __init__(self, model_name: str, checkpoint: Path, device):
        open_clip = _import_open_clip()
        # An absolute path (never a release tag such as "openai") makes open_clip load that file
        # with its own checkpoint loader (bare state_dict or {"state_dict": ...}, "module."
        # prefixes, position-embedding resizing) and download nothing. Architectures whose text
        # tower is a Hugging Face model fetch its config at build time: not usable offline.
        model, _, preprocess = open_clip.create_model_and_transforms(model_name, pretrained=str(checkpoint))
        self.model = model.to(device).eval()
        self.preprocess = preprocess
        self.tokenizer = open_clip.get_tokenizer(model_name)
        self.device = device

    def embed_images(self, images: Sequence[Image.Image], batch_size: int = 32, normalize: bool = True):
        import torch

        out = []
        with torch.no_grad():
            for start in range(0, len(images), batch_size):
                pixels = torch.stack([self.preprocess(im.convert("RGB")) for im in images[start:start + batch_size]])
                out.append(self.model.encode_image(pixels.to(self.device)).float())
        emb = torch.cat(out)
        return torch.nn.functional.normalize(emb, dim=-1) if normalize else emb

    def embed_texts(self, texts: Sequence[str], batch_size: int = 32):
        import torch

        out = []
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                tokens = self.tokenizer(list(texts[start:start + batch_size]))
                out.append(self.model.encode_text(tokens.to(self.device)).float())
        return torch.nn.functional.normalize(torch.cat(out), dim=-1)


def load_clip(model_name: str, checkpoint, device) -> ClipModel:
    """The cached :class:`ClipModel` for (architecture, local checkpoint, device)."""
    checkpoint = Path(checkpoint).resolve()
    key = ("clip", model_name, str(checkpoint), str(device))
    return _cached(key, lambda: ClipModel(model_name, checkpoint, device))


def register_scorer(name: str, override: bool = False):
    """Decorator for a learned scorer's loader ``fn(path: str, device) -> score`` where
    ``score(images: list[PIL.Image], prompts: list[str]) -> list[float]``; the reward
    ``image_scorer`` (``scorer: name, path: ...``) then loads it once and calls it."""

    def wrap(fn):
        return _SCORERS.register(name, fn, override)

    return wrap


def scorer_names() -> list[str]:
    return _SCORERS.names()


_ACTIVATIONS = {"none": None, "relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "tanh": "Tanh"}


def mlp_from_state_dict(state: dict, activation: str | None = None):
    """Rebuild the ``nn.Sequential`` of Linear layers a state_dict came from, sizes read from it.

    Keys are ``<prefix><index>.weight/bias`` (``layers.0.weight`` for the LAION improved aesthetic
    predictor, ``0.weight`` for a bare Sequential) or just ``weight``/``bias`` (the LAION linear
    head). Parameter-free slots between Linears (LAION's Dropouts) become ``activation`` (a name
    in ``none``/``relu``/``gelu``/``silu``/``tanh``; LAION's MLP has none: it is linear)."""
    import torch

    if set(state) <= {"weight", "bias"}:
        state = {f"0.{k}": v for k, v in state.items()}
    pattern = re.compile(r"^(.*?)(\d+)\.(weight|bias)$")
    parsed = {k: pattern.match(k) for k in state}
    bad = [k for k, m in parsed.items() if m is None]
    prefixes = {m.group(1) for m in parsed.values() if m is not None}
    if bad or len(prefixes) != 1:
        raise ValueError(f"not the state_dict of an nn.Sequential of Linear layers (keys {sorted(state)})")
    prefix = prefixes.pop()
    weights = {int(m.group(2)): state[k] for k, m in parsed.items() if m.group(3) == "weight"}
    if not weights or any(w.dim() != 2 for w in weights.values()):
        raise ValueError("an MLP head's state_dict needs 2-D Linear weights")
    act = _ACTIVATIONS[(activation or "none").lower()]
    layers: list[torch.nn.Module] = []
    for i in range(max(weights) + 1):
        if i in weights:
            out_f, in_f = weights[i].shape
            layers.append(torch.nn.Linear(in_f, out_f, bias=f"{prefix}{i}.bias" in state))
        else:
            layers.append(getattr(torch.nn, act)() if act else torch.nn.Identity())
    head = torch.nn.Sequential(*layers)
    head.load_state_dict({k[len(prefix):]: v for k, v in state.items()})
    return head.eval()
