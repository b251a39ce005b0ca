"""Experiment trackers (TensorBoard, Weights & Biases, MLflow, and the others accelerate knows),
through accelerate's tracker API (``accelerate.tracking``), so mmrl keeps no client of its own.

``log.report_to`` names them (transformers' and TRL's key). Each gets what ``metrics.jsonl`` gets
(the numeric scalars, at their step), the run's config (flattened: ``algo.epsilon``), and the
pictures the run saves (``samples_before.png``, ``samples_after.png``, the saved rollouts' PNGs)
where the tracker takes images. Nothing tries the network unless asked:

- wandb runs offline under ``<run_dir>/wandb`` unless ``WANDB_MODE`` is set (``wandb sync`` uploads);
- mlflow writes the file store ``<run_dir>/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set.

``trackers.json`` in the run directory keeps each tracker's run id, so a resumed run logs to the
same wandb run (``resume="allow"``) and the same mlflow run.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union
from urllib.parse import urlparse

from ..config import ConfigError
from .config_history import flatten

__all__ = ["Trackers", "known_trackers", "tracker_names"]

STATE_FILE = "trackers.json"
TRACKERS_EXTRA = 'pip install "mmrl[trackers]"'
# The install line of each tracker's library (wandb and mlflow are mmrl's "trackers" extra).
INSTALL = {"wandb": TRACKERS_EXTRA, "mlflow": TRACKERS_EXTRA, "tensorboard": "pip install tensorboard",
           "aim": "pip install aim", "comet_ml": "pip install comet_ml", "clearml": "pip install clearml",
           "dvclive": "pip install dvclive", "swanlab": "pip install swanlab", "trackio": "pip install trackio"}


def known_trackers() -> list[str]:
    """The tracker names accelerate knows (``LoggerType``), less ``all``."""
    from accelerate.utils import LoggerType

    return [name for name in LoggerType.list() if name != "all"]


def tracker_names(report_to: Sequence[str], tensorboard: bool = True) -> list[str]:
    """The trackers to start for ``log.report_to``: each checked, ``all`` = every installed one,
    ``none`` or ``[]`` = none, duplicates once; ``tensorboard=False`` (``log.tensorboard``) drops
    TensorBoard. An unknown name, or one whose library is missing, is a :class:`ConfigError`."""
    from accelerate.tracking import get_available_trackers

    if isinstance(report_to, str):  # the Python API: report_to="wandb", as transformers takes it
        report_to = [report_to]
    known = known_trackers()
    for name in report_to:
        if name not in (*known, "all", "none"):
            raise ConfigError(f"log.report_to: unknown tracker {name!r}; choose from {', '.join(known)}, "
                              "all (every installed one) or none")
    if "none" in report_to and len(set(report_to)) > 1:
        raise ConfigError(f"log.report_to={list(report_to)}: 'none' means no tracker, and cannot go with others")
    installed = [t.value for t in get_available_trackers()]  # accelerate's own availability check
    names: list[str] = []
    for name in (installed + list(report_to)) if "all" in report_to else report_to:
        if name in ("all", "none") or name in names or (name == "tensorboard" and not tensorboard):
            continue
        if name not in installed:
            if name == "tensorboard":  # a dependency of mmrl: missing means a broken install, not a choice
                warnings.warn("TensorBoard logging disabled: tensorboard is not installed", stacklevel=2)
                continue
            raise ConfigError(f"log.report_to names {name!r}, but its library is not installed: {INSTALL[name]}")
        names.append(name)
    return names


def _value(v: Any) -> Union[bool, int, float, str]:
    """A config value as every tracker takes it: scalars as they are, the rest (None, lists) as JSON."""
    return v if isinstance(v, (bool, int, float, str)) else json.dumps(v)


def _is_file_store(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file")


class Trackers:
    """The trackers of one run directory (:func:`tracker_names`), started at their first use, so
    that a resume can first say from which step TensorBoard must forget (``purge_step``), and
    finished by :meth:`finish`. Only rank 0 makes one."""

    def __init__(self, run_dir: Union[str, Path], names: Sequence[str], config: Any = None):
        self.run_dir = Path(run_dir)
        self.names = list(names)
        self.config = {k: _value(v) for k, v in flatten(config).items()} if config is not None else None
        self._trackers: Optional[list[Any]] = None
        self._purge_step: Optional[int] = None
        self._mlflow_file_store = False

    def purge_after(self, step: int) -> None:
        """A resume re-runs the steps after ``step``: TensorBoard drops its events of them (wandb
        and mlflow keep what they had; docs/trackers.md)."""
        self.finish()
        self._purge_step = int(step) + 1

    def log(self, step: int, scalars: Mapping[str, float], images: Optional[Mapping[str, Path]] = None) -> None:
        """``images`` (name -> PNG) first, then the scalars, both at ``step``."""
        if not self.names:
            return
        for tracker in self._start():
            for key, path in (images or {}).items():
                self._log_image(tracker, key, path, step)
            if scalars:
                tracker.log(self._keys(tracker, scalars), step=int(step))

    def finish(self) -> None:
        for tracker in self._trackers or []:
            tracker.finish()
        self._trackers = None

    # -- set-up ---------------------------------------------------------------------------------
    def _start(self) -> list[Any]:
        if self._trackers is not None:
            return self._trackers
        from accelerate import PartialState

        PartialState()  # accelerate's tracker logging needs one; the policy's Accelerator has made it already
        path = self.run_dir / STATE_FILE
        state = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        self._trackers = []
        for name in self.names:
            tracker = self._build(name, state.get(name) or {})
            tracker.main_process_only = False  # rank 0 alone makes trackers: no need to ask accelerate
            tracker.start()
            self._trackers.append(tracker)
            state[name] = self._ids(tracker)
            if self.config is not None:
                tracker.store_init_configuration(self._new_params(tracker, self.config))
        path.write_text(json.dumps(state, indent=2), encoding="utf-8")
        return self._trackers

    def _build(self, name: str, saved: Mapping[str, Any]) -> Any:
        """accelerate's tracker ``name``, pointed at this run directory (and its earlier run, if any)."""
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        cls, run = LOGGER_TYPE_TO_CLASS[name], self.run_dir.name
        if name == "tensorboard":
            return cls("", self.run_dir / "tensorboard", purge_step=self._purge_step)
        if name == "wandb":
            kwargs: dict[str, Any] = {"name": run, "dir": str(self.run_dir), "resume": "allow", "id": saved.get("id")}
            if not os.environ.get("WANDB_MODE"):
                kwargs["mode"] = "offline"
            return cls(os.environ.get("WANDB_PROJECT", "mmrl"), **kwargs)
        if name == "mlflow":
            import mlflow

            if not os.environ.get("MLFLOW_TRACKING_URI"):
                mlflow.set_tracking_uri((self.run_dir / "mlruns").resolve().as_uri())
            uri = mlflow.get_tracking_uri()
            self._mlflow_file_store = _is_file_store(uri)
            if self._mlflow_file_store:  # MLflow 3 refuses its file store unless this is set
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            run_id = saved.get("run_id") if saved.get("tracking_uri") == uri else None
            return cls(experiment_name="mmrl", run_name=run, run_id=run_id)
        if cls.requires_logging_directory:  # the others: accelerate's defaults, their own environment variables
            return cls(run, logging_dir=str(self.run_dir / name))
        return cls(run)

    @staticmethod
    def _ids(tracker: Any) -> dict[str, Any]:
        """What a resume needs to find this tracker's run again."""
        if tracker.name == "wandb":
            return {"id": tracker.tracker.id}
        if tracker.name == "mlflow":
            import mlflow

            return {"run_id": tracker.tracker.info.run_id, "tracking_uri": mlflow.get_tracking_uri()}
        return {}

    @staticmethod
    def _new_params(tracker: Any, config: Mapping[str, Any]) -> dict[str, Any]:
        """An mlflow param cannot change within a run: a resumed run adds only the keys it lacks
        (each start's full config is in ``config_history/``)."""
        if tracker.name != "mlflow":
            return dict(config)
        have = tracker.tracker.data.params
        return {k: v for k, v in config.items() if k not in have}

    # -- what is logged ---------------------------------------------------------------------------
    def _keys(self, tracker: Any, scalars: Mapping[str, float]) -> dict[str, float]:
        """MLflow's file store keeps a metric in a file named by its key, so ``reward`` and
        ``reward/format`` cannot both be there: on a file store ``/`` becomes ``.``."""
        if tracker.name == "mlflow" and self._mlflow_file_store:
            return {k.replace("/", "."): v for k, v in scalars.items()}
        return dict(scalars)

    def _log_image(self, tracker: Any, key: str, path: Path, step: int) -> None:
        """One picture, where the tracker takes pictures (mlflow: ``log_image`` on the tracker's run,
        as accelerate's MLflowTracker has no image method)."""
        import numpy as np
        from PIL import Image

        with Image.open(path) as im:
            image = im.convert("RGB")
        if tracker.name == "mlflow":
            import mlflow

            mlflow.MlflowClient().log_image(tracker.tracker.info.run_id, image, key=key, step=int(step))
        elif tracker.name == "tensorboard":
            tracker.log_images({key: np.asarray(image)[None]}, step=int(step), dataformats="NHWC")
        elif hasattr(tracker, "log_images"):  # wandb, aim, clearml, swanlab
            tracker.log_images({key: [image]}, step=int(step))
