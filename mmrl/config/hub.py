"""Hub ids as ``model.path``: ``org/name`` resolved to a folder of the Hugging Face cache.

``model.path=Qwen/Qwen2.5-VL-3B-Instruct`` is looked up the way transformers and diffusers look a
hub id up: in the user's cache (``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``) and, where
the network allows, downloaded into it by ``huggingface_hub.snapshot_download`` (a diffusers
pipeline by ``DiffusionPipeline.download``, which fetches only the components the pipeline names).
``model.revision`` (TRL's ``model_revision``, transformers' ``revision``: a branch, tag or commit)
pins what is loaded; the folder found is ``snapshots/<commit>``, so the commit is its name. With
``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) nothing is downloaded: a miss is an error that
names the cache looked in, the repo and the revision, and how to get the checkpoint there.

A run records the commit it trained (:func:`pin_revision`): its ``config.yaml`` holds
``model.revision=<commit>``, so a resume or ``mmrl eval`` loads the same weights even after the
repo's ``main`` moved. Local directories and the built-in names (``tiny``) never touch the hub;
a path that exists locally is local even when it looks like ``org/name`` (as in transformers).
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from pathlib import Path
from typing import Optional

# org/name: one slash, names of letters, digits, '-', '_', '.' (the hub's own rule, without the
# legacy ids that have no org, which would be ambiguous with local names).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")
# Files a PyTorch model never reads (TF, Flax, ONNX, GGUF, Core ML exports): not downloaded.
NOT_PYTORCH = ["*.msgpack", "*.h5", "*.ot", "*.onnx", "*.onnx_data", "*.gguf", "*.tflite", "*.mlmodel",
               "flax_model*", "tf_model*", "rust_model*", "onnx/*", "openvino/*", "coreml/*"]
_TRUE = {"1", "on", "yes", "true"}


class HubCheckpointError(FileNotFoundError):
    """A hub id that could not be resolved: the message says where mmrl looked and what to do."""


def is_hub_id(path: str) -> bool:
    """``org/name`` that is not an existing local path."""
    return bool(HUB_ID.fullmatch(str(path))) and not Path(path).expanduser().exists()


def hub_cache_dir() -> Path:
    """The cache huggingface_hub uses, read from the environment now (``huggingface_hub.constants``
    reads it once, at import): ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else the library's default."""
    from huggingface_hub import constants

    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(cache)).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` as set now, or as huggingface_hub read them."""
    from huggingface_hub import constants

    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().lower()
    return env in _TRUE or bool(constants.HF_HUB_OFFLINE)


def _repo_folder(repo_id: str, cache: Path) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def cached_revisions(repo_id: str, cache: Optional[Path] = None) -> dict[str, str]:
    """What the cache holds of ``repo_id``: ``{ref name or commit: commit}`` (``refs/`` and ``snapshots/``)."""
    folder = _repo_folder(repo_id, cache or hub_cache_dir())
    found = {p.name: p.read_text().strip() for p in sorted((folder / "refs").glob("*")) if p.is_file()}
    for snap in sorted((folder / "snapshots").glob("*")):
        if snap.name not in found.values():
            found[snap.name] = snap.name
    return found


def _miss(repo_id: str, revision: Optional[str], cache: Path, why: str) -> HubCheckpointError:
    held = cached_revisions(repo_id, cache)
    holds = ", ".join(f"{k} -> {v[:12]}" if k != v else v[:12] for k, v in held.items()) or "nothing of it"
    rev = f" --revision {revision}" if revision else ""
    return HubCheckpointError(
        f"model.path={repo_id!r} (revision {revision or 'main'}) was not found in the Hugging Face cache {cache} "
        f"({why}; the cache holds {holds}; no local directory {Path(repo_id).resolve()} either). Get it with "
        f"`hf download {repo_id}{rev}` (huggingface-cli download before huggingface_hub 1.0) on a machine with "
        f"network and copy {_repo_folder(repo_id, cache).name} into this cache (or point HF_HUB_CACHE at it), "
        "or pass model.path=/local/dir for a downloaded checkpoint directory.")


def resolve_checkpoint(path: str, revision: Optional[str] = None, *, pipeline: bool = False,
                       local_files_only: bool = False, only: Optional[list[str]] = None) -> Path:
    """``path`` as a folder: a hub id's cached snapshot (downloaded first unless offline), anything
    else as the local path it names (the caller checks what is there). ``pipeline``: a diffusers
    pipeline, fetched by ``DiffusionPipeline.download``; ``only``: just these files of a model's
    snapshot (``mmrl plan`` reads its configs, never the weights). The snapshot's name is the resolved commit."""
    if not is_hub_id(path):
        if revision:
            raise ValueError(f"model.revision={revision!r} pins a hub id's commit (model.path=org/name), but "
                             f"model.path={path!r} is a local directory or built-in name: leave model.revision unset")
        return Path(path).expanduser()
    from huggingface_hub import errors, snapshot_download

    cache, offline = hub_cache_dir(), local_files_only or hub_offline()
    try:
        if pipeline:
            from diffusers import DiffusionPipeline

            folder = DiffusionPipeline.download(path, revision=revision, cache_dir=cache, local_files_only=offline)
        else:
            folder = snapshot_download(path, revision=revision, cache_dir=cache, local_files_only=offline,
                                       **({"allow_patterns": only} if only else {"ignore_patterns": NOT_PYTORCH}))
    except errors.IncompleteSnapshotError as e:  # e.g. `hf download --include ...`: load what is there
        warnings.warn(f"{e} mmrl loads the files that are there.", stacklevel=2)
        folder = e.snapshot_path
    except errors.RevisionNotFoundError as e:
        raise HubCheckpointError(f"model.revision={revision!r}: {path!r} on the hub has no such branch, tag or "
                                 f"commit ({e})") from e
    except errors.RepositoryNotFoundError as e:  # GatedRepoError included
        raise HubCheckpointError(f"model.path={path!r}: no such model on the hub, or it is gated or private "
                                 f"(`hf auth login`), and no local directory {Path(path).resolve()} ({e})") from e
    except (errors.LocalEntryNotFoundError, OSError) as e:
        why = ("downloads are off: HF_HUB_OFFLINE=1" if hub_offline() else "downloads are off: local_files_only"
               if offline else f"the hub could not be reached: {str(e).splitlines()[0]}")
        raise _miss(path, revision, cache, why) from e
    return Path(folder)


def pin_revision(cfg):
    """``cfg`` with ``model.revision`` set to the commit its hub id resolves to now (the cached ref
    the run just loaded), for the run's saved config; unchanged for local paths, built-in names and
    a revision that is already a commit."""
    model = cfg.model
    if not is_hub_id(model.path) or (model.revision and COMMIT.fullmatch(model.revision)):
        return cfg
    ref = _repo_folder(model.path, hub_cache_dir()) / "refs" / (model.revision or "main")
    if not ref.is_file():  # the policy was not loaded from the cache (e.g. given to the Trainer built)
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(model, revision=ref.read_text().strip()))
