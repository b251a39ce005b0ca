"""Hub ids (``model.path=org/name``) resolved offline (``HF_HUB_OFFLINE=1``) from a Hugging Face cache
laid out by hand the way huggingface_hub lays it out: ``models--org--name/refs/main`` holds a commit,
``snapshots/<commit>/`` holds links to ``blobs/``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI_RUN, make_config
from mmrl.assets import asset_path
from mmrl.config.hub import HubCheckpointError, is_hub_id, pin_revision, resolve_checkpoint
from mmrl.vlm.loading import resolve_model_path

COMMIT, OTHER = "a1" * 20, "b2" * 20


def cache_repo(cache: Path, source: Path, repo: str = "org/name", commits=(COMMIT,), main: str = COMMIT) -> Path:
    """``source``'s files cached as ``repo`` at each of ``commits`` (links into content-named blobs, as
    huggingface_hub writes them); ``refs/main`` -> ``main``. Returns the repo's folder."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    for commit in commits:
        for f in sorted(p for p in source.rglob("*") if p.is_file()):
            blob = folder / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                blob.write_bytes(f.read_bytes())
            link = folder / "snapshots" / commit / f.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(main)
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache in HF_HUB_CACHE, downloads off, the working directory holding no ``org/``."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return cache


def test_a_hub_id_resolves_to_its_cached_snapshot(cache):
    folder = cache_repo(cache, asset_path("tiny-qwen2.5-vl"))
    snapshot = folder / "snapshots" / COMMIT
    assert resolve_checkpoint("org/name") == snapshot
    assert resolve_model_path("org/name") == snapshot and (snapshot / "config.json").is_file()


def test_a_revision_pins_a_commit_and_a_wrong_one_says_what_the_cache_holds(cache):
    folder = cache_repo(cache, asset_path("tiny-qwen2.5-vl"), commits=(COMMIT, OTHER), main=COMMIT)
    assert resolve_model_path("org/name", revision=OTHER) == folder / "snapshots" / OTHER
    assert resolve_model_path("org/name", revision="main") == folder / "snapshots" / COMMIT
    for wrong in ("v9", "c3" * 20):
        with pytest.raises(HubCheckpointError) as err:
            resolve_model_path("org/name", revision=wrong)
        msg = " ".join(str(err.value).split())
        assert f"revision {wrong}" in msg and str(cache) in msg and f"main -> {COMMIT[:12]}" in msg
        assert f"hf download org/name --revision {wrong}" in msg


def test_a_missing_repo_names_the_cache_it_looked_in_and_how_to_get_it(cache):
    with pytest.raises(HubCheckpointError) as err:
        resolve_model_path("org/missing")
    msg = " ".join(str(err.value).split())
    for part in ("'org/missing'", "revision main", str(cache), "HF_HUB_OFFLINE=1", "holds nothing of it",
                 "hf download org/missing", "model.path=/local/dir"):
        assert part in msg, part


def test_local_paths_and_builtin_names_never_reach_the_hub(cache, monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    assert resolve_model_path("tiny") == asset_path("tiny-qwen2.5-vl")
    local = Path("org/name")  # shaped like a hub id, but a local directory: local wins (as in transformers)
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    assert resolve_model_path("org/name") == local
    with pytest.raises(FileNotFoundError, match="not a local checkpoint directory"):
        resolve_model_path(str(cache / "nope"))
    with pytest.raises(ValueError, match="leave model.revision unset"):
        resolve_model_path("tiny", revision=COMMIT)
    assert [is_hub_id(p) for p in ("Qwen/Qwen2.5-VL-3B-Instruct", "tiny", "/abs/dir", "./a/b", "a/b/c", "a/")] \
        == [True, False, False, False, False, False]


def test_online_the_revision_and_cache_go_to_snapshot_download(cache, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    def fake_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(cache / "models--org--name" / "snapshots" / COMMIT)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_checkpoint("org/name", "v1").name == COMMIT
    (repo, kwargs), = calls
    assert repo == "org/name" and kwargs["revision"] == "v1" and Path(kwargs["cache_dir"]) == cache
    assert kwargs["local_files_only"] is False and "*.msgpack" in kwargs["ignore_patterns"]

    def unreachable(repo_id, **kwargs):
        raise LocalEntryNotFoundError("Got: ConnectError")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(HubCheckpointError, match="the hub could not be reached: Got: ConnectError"):
        resolve_checkpoint("org/name")


@pytest.mark.slow
def test_a_run_records_the_commit_and_a_resume_refuses_a_moved_ref(cache, tmp_path):
    from mmrl.runs.config_history import ConfigChangeError, check_resume_config, record_start

    folder = cache_repo(cache, asset_path("tiny-qwen2.5-vl"), commits=(COMMIT, OTHER), main=COMMIT)
    cfg = make_config("model.path=org/name")
    assert cfg.model.revision is None and pin_revision(cfg).model.revision == COMMIT
    assert pin_revision(make_config("model.path=org/name", f"model.revision={OTHER}")).model.revision == OTHER
    assert pin_revision(make_config("model.path=tiny")).model.revision is None
    run = tmp_path / "run"
    run.mkdir()
    record_start(run, cfg)
    assert f"revision: {COMMIT}" in (run / "config.yaml").read_text()
    check_resume_config(run, cfg)  # main still at the recorded commit
    (folder / "refs" / "main").write_text(OTHER)  # the repo moved on (a later download)
    with pytest.raises(ConfigChangeError, match=f"model.revision: '{COMMIT}' -> '{OTHER}'"):
        check_resume_config(run, cfg)
    check_resume_config(run, make_config("model.path=org/name", f"model.revision={COMMIT}"))


def test_a_generator_hub_id_resolves_through_diffusers(cache, tmp_path):
    from diffusion_fixtures import build_tiny_sd3
    from mmrl.diffusion.loading import generator_dir

    folder = cache_repo(cache, build_tiny_sd3(tmp_path / "sd3"), repo="org/sd3")
    assert Path(generator_dir("org/sd3")) == folder / "snapshots" / COMMIT
    with pytest.raises(HubCheckpointError, match="revision v2"):
        generator_dir("org/sd3", "v2")
    assert generator_dir("tiny") == str(asset_path("tiny-flow-shapes"))


@pytest.mark.slow
def test_mmrl_train_on_a_hub_id_records_its_commit(cache, random_tiny_dir, tmp_path):
    """`mmrl train vlm model.path=org/name` (2 steps, offline) trains the cached snapshot and its
    config.yaml pins the commit that refs/main named."""
    from mmrl.config import load_config

    cache_repo(cache, random_tiny_dir)
    r = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "vlm", "model.path=org/name", *CLI_RUN,
                        "train.steps=2", f"log.output_dir={tmp_path / 'runs'}", "log.run_name=hub"],
                       capture_output=True, text=True, timeout=300)  # HF_HUB_* inherited from the fixture
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "runs" / "hub"
    for saved in (run / "config.yaml", run / "config_history" / "000-start.yaml"):
        cfg = load_config(saved)
        assert (cfg.model.path, cfg.model.revision) == ("org/name", COMMIT)
    assert (run / "summary.json").exists()
