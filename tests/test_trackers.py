"""log.report_to: TensorBoard, wandb and mlflow through accelerate's trackers, read back offline
(wandb's offline run directory, an mlflow file store, TensorBoard's event files): the scalars of
metrics.jsonl at their steps, the config, the galleries' pictures, and one tracker run across a
resume. Plus the config errors."""

from __future__ import annotations

import json
import struct

import pytest

from conftest import tiny_run_config
from mmrl.config import ConfigError, load_config
from mmrl.runs.logging import RunLogger, read_jsonl
from mmrl.runs.trackers import known_trackers, tracker_names

KEYS = ("loss", "step_time", "completion_length")  # step_time differs at every step: a value mix-up shows


# -- the key ------------------------------------------------------------------------------------

def test_the_default_is_tensorboard_and_log_tensorboard_false_drops_it():
    assert load_config().log.report_to == ["tensorboard"]
    assert tracker_names(["tensorboard"]) == ["tensorboard"]
    assert tracker_names(["tensorboard", "wandb", "wandb"], tensorboard=False) == ["wandb"]
    assert tracker_names([]) == tracker_names(["none"]) == []
    assert load_config(None, ["log.report_to=[]"]).log.report_to == []


def test_all_is_every_installed_tracker():
    from accelerate.tracking import get_available_trackers

    installed = [t.value for t in get_available_trackers()]
    assert tracker_names(["all"]) == installed
    assert tracker_names(["all"], tensorboard=False) == [n for n in installed if n != "tensorboard"]


def test_an_unknown_tracker_is_a_config_error_listing_the_valid_ones(tmp_path):
    assert {"tensorboard", "wandb", "mlflow", "comet_ml", "aim"} <= set(known_trackers())
    with pytest.raises(ConfigError, match=r"unknown tracker 'wandbb'; choose from .*tensorboard.*wandb.*mlflow"):
        RunLogger(tmp_path, report_to=["wandbb"])
    with pytest.raises(ConfigError, match="'none' means no tracker"):
        tracker_names(["none", "wandb"])
    with pytest.raises(ConfigError, match=r"write a list, e.g. log.report_to=\[wandb\]"):
        load_config(None, ["log.report_to=wandb"])


def test_a_tracker_whose_library_is_missing_names_the_extra(monkeypatch):
    import accelerate.tracking
    from accelerate.utils import LoggerType

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [LoggerType.TENSORBOARD])
    with pytest.raises(ConfigError, match=r"'mlflow', but its library is not installed: pip install \"mmrl\[trackers\]\""):
        tracker_names(["tensorboard", "mlflow"])
    assert tracker_names(["all"]) == ["tensorboard"]


def test_no_tracker_writes_only_metrics_jsonl(tmp_path):
    with RunLogger(tmp_path, report_to=[]) as log:
        log.log(1, {"reward": 0.5})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


# -- a run, read back ------------------------------------------------------------------------------

def _wandb_records(path):
    """The records of a ``.wandb`` file: wandb's protobuf ``Record`` in LevelDB's log framing
    (32 KiB blocks of chunks: crc32, length, type; 1 full, 2 first, 3 middle, 4 last), after a
    7-byte header. wandb 0.31 keeps this reader in its Go core only, and writes no config.yaml or
    wandb-summary.json offline."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, chunk = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, size, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk += data[pos + 7:pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunk)
            yield record
            chunk = b""


def _wandb_run(folder):
    """``(config, {step: row})`` of one offline run directory."""
    (path,) = folder.glob("run-*.wandb")
    config, rows = {}, {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            rows[row["_step"]] = row
    return config, rows


@pytest.fixture(scope="module")
def tracked_run(random_tiny_dir, tmp_path_factory):
    """A 2-step run reporting to TensorBoard, wandb and mlflow, then resumed to 3 steps: the run
    directory, and its trackers.json before the resume."""
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy

    out = tmp_path_factory.mktemp("tracked")
    extra = ("eval.before=true", "log.save_rollouts_every=2", "log.num_rollouts_to_save=1",
             "log.report_to=[tensorboard,wandb,mlflow]")
    with pytest.MonkeyPatch.context() as env:
        for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                     "MLFLOW_RUN_ID", "MLFLOW_ALLOW_FILE_STORE"):
            env.delenv(name, raising=False)
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            env.setenv(name, str(out / "wandb-home"))
        env.setenv("WANDB_SILENT", "true")
        cfg = tiny_run_config(random_tiny_dir, out, 2, *extra)
        Trainer(cfg, VLMPolicy(cfg)).train()
        first = json.loads((out / "run" / "trackers.json").read_text())
        cfg = tiny_run_config(random_tiny_dir, out, 3, *extra, "resume=true", "allow_config_change=true")
        Trainer(cfg, VLMPolicy(cfg)).train()
    return out / "run", first


def _jsonl(run, key):
    return {r["step"]: r[key] for r in read_jsonl(run / "metrics.jsonl") if r.get(key) is not None}


@pytest.mark.slow
def test_mlflow_file_store_has_the_scalars_the_config_and_the_galleries(tracked_run):
    from mlflow.tracking import MlflowClient

    run, first = tracked_run
    client = MlflowClient((run / "mlruns").resolve().as_uri())
    run_id = first["mlflow"]["run_id"]
    for key in (*KEYS, "reward/format", "eval/reward"):
        history = {m.step: m.value for m in client.get_metric_history(run_id, key.replace("/", "."))}
        assert history == pytest.approx(_jsonl(run, key), rel=1e-12), key  # one run: steps 1-2, then 3 resumed
    assert sorted(_jsonl(run, "loss")) == [1, 2, 3]
    params = client.get_run(run_id).data.params
    assert params["algo.epsilon"] == "0.2" and params["rollout.num_generations"] == "2"
    assert json.loads(params["log.report_to"]) == ["tensorboard", "wandb", "mlflow"]
    assert params["train.steps"] == "2"  # an mlflow param keeps its first value (docs/trackers.md)
    images = [a.path for a in client.list_artifacts(run_id, "images")]
    for name in ("samples_before+step+0+", "samples_after+step+2+", "samples_after+step+3+", "rollouts~0+step+2+"):
        assert any(p.startswith(f"images/{name}") and p.endswith(".png") for p in images), (name, images)


@pytest.mark.slow
def test_wandb_offline_run_has_the_scalars_the_config_and_the_galleries(tracked_run):
    run, first = tracked_run
    run_id = first["wandb"]["id"]
    attempts = sorted((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(attempts) == 2  # the resume wrote to the same run id: `wandb sync` joins them
    (config, rows), (_, resumed) = _wandb_run(attempts[0]), _wandb_run(attempts[1])
    rows.update(resumed)
    for key in (*KEYS, "reward/format", "eval/reward"):
        assert {s: r[key] for s, r in rows.items() if key in r} == pytest.approx(_jsonl(run, key), rel=1e-12), key
    assert config["algo.epsilon"] == 0.2 and config["train.steps"] == 2 and config["log.run_name"] == "run"
    media = {p.relative_to(attempts[0] / "files" / "media" / "images").as_posix()
             for p in (attempts[0] / "files" / "media" / "images").rglob("*.png")}
    assert {m.rsplit("_", 1)[0] for m in media} >= {"samples_before_0", "samples_after_2", "rollouts/0_2", "rollouts/0_vis_2"}
    assert rows[0]["samples_before/_type"] == "images/separated"
    assert any(p.name.startswith("samples_after_3_") for p in (attempts[1] / "files" / "media" / "images").glob("*.png"))


@pytest.mark.slow
def test_tensorboard_has_the_scalars_the_config_and_the_galleries(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, first = tracked_run
    assert first["tensorboard"] == {}
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0}).Reload()
    for key in KEYS:
        assert {e.step: e.value for e in events.Scalars(key)} == pytest.approx(_jsonl(run, key), rel=1e-6), key
    assert {e.step for e in events.Images("samples_before")} == {0}
    assert {e.step for e in events.Images("samples_after")} == {2, 3}
    hparams = [p for p in (run / "tensorboard").rglob("hparams.yml")]
    assert len(hparams) == 2 and "algo.epsilon: 0.2" in hparams[0].read_text()


@pytest.mark.slow
def test_a_resume_keeps_the_tracker_runs(tracked_run):
    run, first = tracked_run
    assert json.loads((run / "trackers.json").read_text()) == first


@pytest.mark.slow
def test_a_rank_that_does_not_log_refuses_an_unknown_tracker_at_setup(random_tiny_dir, tmp_path, monkeypatch):
    """Only rank 0 makes the trackers; the names are checked on every rank while the trainer is set
    up, so a typo stops all ranks instead of leaving the others waiting at a collective."""
    import mmrl.core.trainer
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy

    cfg = tiny_run_config(random_tiny_dir, tmp_path, 1, "log.report_to=[wandbb]")
    monkeypatch.setattr(mmrl.core.trainer.dist, "is_main", lambda: False)
    with pytest.raises(ConfigError, match="unknown tracker 'wandbb'"):
        Trainer(cfg, VLMPolicy(cfg))
