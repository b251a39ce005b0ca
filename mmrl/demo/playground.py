"""What the demo's policy tabs do, without any widgets: pick a model and a task, draw or read one
input, sample completions (or episodes, or images), score them with the task's rewards and draw
them with the task's own pictures. :mod:`mmrl.demo.app` only wires Gradio widgets to
:class:`Playground`; the tests call it directly as well.

Models are named by labels the page shows: a shipped tiny default (``tiny``, ``tiny-gui``,
``tiny-video``; generators ``tiny``, ``tiny-t2v``, ``tiny-i2v`` (image-to-video), ``tiny-edit`` (image
editing)), ``run: <name>`` (a run's latest checkpoint, trained from its own ``config.yaml``) or
``dir: <path>`` (a checkpoint directory under a ``--models`` root: any generator family mmrl reads).
A task's settings come from its shipped tiny recipe when there is one, so the prompt, rewards and
options are those a run of it uses. Loading goes through the same ``make_policy`` as ``mmrl train``:
native transformers / diffusers classes, never ``trust_remote_code`` (a checkpoint's own Python code
is not run). An editing or image-to-video generator edits / animates an uploaded image (its record
gives the instruction or prompt).

An uploaded image or clip becomes an example through the task's own file reader: the upload and
the record's other fields (question, answer, ...: the task's data format, see the README's "Data
formats"; :meth:`mmrl.task.Task.file_record` fills them from a synthetic example) are written as
a one-record JSON file and read as the task's eval split, so a corrupt file or a record the task
cannot read gets the reader's own message."""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from ..config import builtin_config_names, builtin_config_path, load_config
from ..registry import TASKS
from .overrides import refuse_interpolation
from .paths import AllowedRoots
from .run_dirs import list_runs, run_path
from .runs_index import latest_checkpoint

# The shipped tiny models by policy modality, and the task each was warm-started for.
BUILTIN_MODELS = {"vlm": {"tiny": "counting", "tiny-gui": "screen_grounding",
                          "tiny-gui-grounding": "screen_grounding", "tiny-video": "video_qa"},
                  "diffusion": {"tiny": "composition", "tiny-t2v": "motion_t2v", "tiny-i2v": "motion_i2v",
                                "tiny-edit": "image_edit"}}
UPLOAD = "<the upload>"  # where Task.file_record puts the media path in an upload's record
MAX_SAMPLES = 16


class DemoError(ValueError):
    """A problem with what the page asked for, shown there as a message."""


@dataclass
class Loaded:
    """A policy ready to sample for a task, with the task's rewards."""
    cfg: Any
    task: Any
    policy: Any
    rewards: Any
    label: str


@dataclass
class Samples:
    """What one sampling call shows: a picture per sample (or per episode step) and a table."""
    pictures: list[tuple[Image.Image, str]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    message: str = ""
    input_text: str = ""  # the question, instruction or prompt that was sampled


def recipe_for(task_name: str) -> str | None:
    """The shipped tiny recipe that trains ``task_name`` (its settings are the demo's), if any."""
    import yaml

    for name in builtin_config_names():
        if "tiny" in name:
            data = yaml.safe_load(builtin_config_path(name).read_text()) or {}
            if (data.get("task") or {}).get("name") == task_name:
                return name
    return None


class Playground:
    """Loads models for tasks (the last few kept), and samples, scores and draws for the page."""

    def __init__(self, runs_dir: str | Path, upload_dir: str | Path, model_roots: Sequence[str | Path] = (),
                 device: str = "cpu", keep_models: int = 3):
        self.runs_dir = Path(runs_dir)
        self.upload_dir = Path(upload_dir)
        self.model_roots = [Path(r) for r in model_roots]
        self.uploads = AllowedRoots([self.upload_dir])
        self.device = device
        self.keep_models = keep_models
        self._cache: OrderedDict[tuple, Loaded] = OrderedDict()
        self._lock = threading.Lock()  # one model call at a time: the page's events run in threads

    # -- choices ------------------------------------------------------------------------------
    def model_choices(self, modality: str) -> list[str]:
        """Labels of the models that can run ``modality`` ("vlm" or "diffusion") tasks."""
        labels = list(BUILTIN_MODELS[modality])
        labels += [f"run: {name}" for name in list_runs(self.runs_dir) if self._run_modality(name) == modality]
        labels += [f"dir: {d}" for d in self._model_dirs()]
        return labels

    def task_choices(self, modality: str) -> list[str]:
        from ..plugins import load_plugins

        load_plugins([])
        return [n for n in TASKS.names() if n != "mixture" and getattr(TASKS.get(n), "modality", "vlm") == modality
                and (n == "gui_env" or self._reads_synthetic(n))]

    def default_task(self, label: str, modality: str) -> str:
        if label.startswith("run: "):
            return self._run_config(label[5:]).task.name
        return BUILTIN_MODELS[modality].get(label, next(iter(BUILTIN_MODELS[modality].values())))

    def runs(self) -> list[str]:
        return list_runs(self.runs_dir)

    # -- loading ------------------------------------------------------------------------------
    def load(self, label: str, task_name: str, checkpoint: bool = True) -> Loaded:
        """The policy named by ``label`` for ``task_name``; ``checkpoint=False`` for a run gives its
        starting model (the run's config without its trained weights): the "before" of a run."""
        cfg, ckpt = self._config(label, task_name)
        key = (label, task_name, str(ckpt) if checkpoint else None)  # a run that trains on gets reloaded
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        from ..api import make_policy
        from ..core.reward_computer import make_reward_computer
        from ..core.trainer import build_task

        task = build_task(cfg)
        try:
            policy = make_policy(cfg, task)
        except (FileNotFoundError, OSError, ValueError) as exc:
            raise DemoError(f"cannot load {label}: {exc}") from exc
        if checkpoint and ckpt is not None:
            policy.load(ckpt / "policy")
        policy.module.eval()
        loaded = Loaded(cfg, task, policy, make_reward_computer(task, cfg.task), label)
        self._cache[key] = loaded
        while len(self._cache) > self.keep_models:
            self._cache.popitem(last=False)
        return loaded

    def _config(self, label: str, task_name: str):
        """The config a model label runs ``task_name`` with, and the checkpoint to load (or None).
        Both come from the page and may reach an override: never an interpolation."""
        refuse_interpolation("the model", label)
        refuse_interpolation("the task", task_name)
        overrides = [f"train.device={self.device}", "resume=false", "log.progress=false"]
        if label.startswith("run: "):
            name = label[5:]
            cfg = self._run_config(name)
            if cfg.task.name != task_name:
                raise DemoError(f"run {name!r} trained task {cfg.task.name!r}; choose that task to try it")
            ckpt = latest_checkpoint(run_path(self.runs_dir, name))
            return load_config(None, overrides, base=cfg), ckpt
        recipe = recipe_for(task_name)
        cfg = load_config(builtin_config_path(recipe or "vlm/counting_tiny"),
                          overrides + ([] if recipe else [f"task.name={task_name}"]))
        if label.startswith("dir: "):
            path = label[5:]
            if Path(path).resolve() not in [d.resolve() for d in self._model_dirs()]:
                raise DemoError(f"{path} is not a checkpoint directory under the demo's --models directories")
            cfg.model.path = path
        else:
            modality = getattr(TASKS.get(task_name), "modality", "vlm")
            if label not in BUILTIN_MODELS.get(modality, {}):
                raise DemoError(f"unknown model {label!r} for a {modality} task; choose one of the list")
            cfg.model.path = label
        return cfg, None

    def _run_config(self, name: str):
        path = run_path(self.runs_dir, name) / "config.yaml"
        if not path.exists():
            raise DemoError(f"run {name!r} has no config.yaml")
        return load_config(path, ["resume=false"])

    def _run_modality(self, name: str) -> str | None:
        try:
            task_name = self._run_config(name).task.name
            return getattr(TASKS.get(task_name), "modality", "vlm")
        except Exception:  # a half-written or foreign run is simply not offered
            return None

    def _model_dirs(self) -> list[Path]:
        """Checkpoint directories (a ``config.json``, or a diffusers ``model_index.json``) at most
        two levels under the ``--models`` roots, and inside them once links are followed."""
        found = []
        for root in self.model_roots:
            inside = AllowedRoots([root])
            for marker in ("config.json", "model_index.json", "*/config.json", "*/model_index.json"):
                found += [p.parent for p in root.glob(marker) if inside.contains(p)]
        return sorted(set(found))

    def _reads_synthetic(self, task_name: str) -> bool:
        try:
            return len(TASKS.get(task_name)().examples("eval")) > 0
        except Exception:  # tasks that need a data file (prompt files) are not offered here
            return False

    # -- inputs -------------------------------------------------------------------------------
    def task(self, label: str, task_name: str):
        """The task as ``label`` would run it (its recipe's or run's options), without a model."""
        from ..core.trainer import build_task

        return build_task(self._config(label, task_name)[0])

    @staticmethod
    def synthetic_example(task, seed: int) -> dict:
        examples = task.examples("eval")
        return examples[int(seed) % len(examples)]

    def record_template(self, label: str, task_name: str, seed: int) -> str:
        """Example ``seed`` as a record of the task's data files (:meth:`mmrl.task.Task.file_record`)
        without its media path, as editable JSON: what an upload's record starts from."""
        task = self.task(label, task_name)
        record = task.file_record(self.synthetic_example(task, seed), UPLOAD)
        return json.dumps({k: v for k, v in record.items() if v != UPLOAD})

    def uploaded_example(self, task, upload: str | Path, record_json: str) -> dict:
        """The example ``task``'s own reader makes of an uploaded file and a JSON record."""
        path = self.uploads.resolve(upload)
        try:
            record = json.loads(record_json or "{}")
        except json.JSONDecodeError as exc:
            raise DemoError(f"the record is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
        if not isinstance(record, dict):
            raise DemoError("the record must be a JSON object, e.g. {\"question\": \"...\", \"answer\": \"2\"}")
        if "eval_path" not in task.options:
            raise DemoError(f"task {task.name!r} reads no data files; use a synthetic example")
        is_clip = Path(path).suffix.lower() in (".mp4", ".avi", ".mov", ".mkv", ".webm")
        shape = task.file_record(self.synthetic_example(task, 0), UPLOAD)  # where the task's files name the media
        media_keys = [k for k, v in shape.items() if v == UPLOAD] or ["video" if is_clip else "image"]
        records_file = self.upload_dir / "records" / f"{uuid.uuid4().hex}.json"  # a JSON array: every reader takes one
        records_file.parent.mkdir(parents=True, exist_ok=True)
        records_file.write_text(json.dumps([{**record, **{k: str(path) for k in media_keys}}]))
        files = {"eval_path": str(records_file), "image_root": str(path.parent)}
        if "train_path" in task.options:  # classification reads its classes from the train file
            files["train_path"] = str(records_file)
        if task.options.get("classes", "") is None:  # ... which, of one record, would be one class
            files["classes"] = list(self.synthetic_example(task, 0).get("classes") or []) or None
        reader = TASKS.get(task.name)(**{**task.options, **files})
        try:
            examples = reader.examples("eval")
            return examples[0]
        except (ValueError, OSError, KeyError, IndexError) as exc:
            raise DemoError(f"the upload could not be read as a {task.name} example: {exc}") from exc

    # -- sampling -----------------------------------------------------------------------------
    def sample(self, label: str, task_name: str, seed: int, n: int, temperature: float,
               upload: str | Path | None = None, record_json: str = "", checkpoint: bool = True,
               prompt: str = "") -> Samples:
        """``n`` completions (episodes; images) of one input at ``temperature`` (0: greedy),
        with the parsed answer, the rewards and the task's picture of each. The input: example
        ``seed`` of the task's eval split, an ``upload`` with its JSON record, or for a generator
        a free-text ``prompt`` (not scored: the generator tasks' rewards check generated specs)."""
        n = max(1, min(int(n), MAX_SAMPLES))
        with self._lock:
            loaded = self.load(label, task_name, checkpoint)
            free_text = bool(prompt.strip()) and loaded.task.modality == "diffusion" and not upload
            if free_text and getattr(getattr(loaded.policy, "pipe", None), "conditioning", None):
                raise DemoError(f"{label} edits or animates an image: upload one, with the instruction or prompt in "
                                "its record")
            if free_text:
                ex = {"prompt": prompt.strip()}
            elif upload:
                ex = self.uploaded_example(loaded.task, upload, record_json)
            else:
                ex = self.synthetic_example(loaded.task, seed)
            return _sample(loaded, ex, n, float(temperature), int(seed), score=not free_text)


def _sample(loaded: Loaded, ex: dict, n: int, temperature: float, seed: int, score: bool = True) -> Samples:
    from ..core.episodes import is_episodic, rollout_task
    from ..runs.gallery import is_generated_media, sample_picture

    policy, task = loaded.policy, loaded.task
    examples = [ex] if is_episodic(task) else policy.prepare_examples([ex])
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with _sampling(policy, temperature), torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        # a generator samples n initial noises ("sample"); a VLM greedily ("eval") or at the temperature
        mode = "sample" if task.modality == "diffusion" or temperature > 0 else "eval"
        batch = rollout_task(policy, task, examples, n, mode)
    if score:
        total, comps, _ = loaded.rewards(batch.completions, batch.examples, group_ids=batch.group_ids)
        note = ""
    else:  # a free-text prompt has no generated spec for the task's rewards to check against
        total, comps = torch.full((len(batch.completions),), float("nan")), {}
        note = (f"{len(batch.completions)} sample(s) of your prompt, not scored: "
                f"{task.name}'s rewards check generated specs")
    text = next((str(ex[k]) for k in ("question", "instruction", "prompt") if ex.get(k)), "")
    out = Samples(columns=_columns(task, comps), message=note, input_text=text)
    for i, (completion, row_ex) in enumerate(zip(batch.completions, batch.examples)):
        parsed = _parsed(task, completion, row_ex)
        reward = float(total[i])
        label = (f"episode {row_ex['episode_id']} step {row_ex['step_index']}" if "episode_id" in row_ex
                 else f"sample {i}")
        text = "(generated)" if is_generated_media(completion) else str(completion)
        row = [label, text, parsed, round(reward, 4)] + [round(float(v[i]), 4) for v in comps.values()]
        if "episode_id" in row_ex:
            row += [row_ex.get("step_message", ""), row_ex.get("episode_success")]
        out.rows.append(row)
        picture = sample_picture(task, row_ex, completion)
        if picture is not None:
            out.pictures.append((picture, f"{label}: {parsed} (reward {reward:.2f})"))
    if is_episodic(task):
        succeeded = sum(bool(r[-1]) for r in out.rows if r[0].endswith("step 0"))
        out.message = f"{n} episode(s) of \"{ex.get('instruction', '')}\": {succeeded} succeeded"
    return out


class _sampling:
    """The policy's rollout temperature set for one call, and put back after it."""

    def __init__(self, policy, temperature: float):
        self.rollout = getattr(policy.cfg, "rollout", None)
        self.temperature = temperature

    def __enter__(self):
        if self.rollout is not None and self.temperature > 0:
            self.saved = self.rollout.temperature
            self.rollout.temperature = self.temperature

    def __exit__(self, *exc):
        if self.rollout is not None and self.temperature > 0:
            self.rollout.temperature = self.saved


def _columns(task, comps: dict) -> list[str]:
    from ..core.episodes import is_episodic

    cols = ["sample", "completion", "parsed answer", "reward"] + list(comps)
    return cols + ["environment", "episode success"] if is_episodic(task) else cols


def _parsed(task, completion: Any, ex: dict) -> str:
    """What the task reads from a completion: the action of an environment or GUI task, else the
    answer block's content."""
    from ..parsing import extract_answer
    from ..runs.gallery import is_generated_media

    if is_generated_media(completion):
        return ""
    read_action: Callable | None = getattr(task, "read_action", None)
    if read_action is not None:
        action = read_action(completion, ex)
        return "unparsable" if action is None else json.dumps(action)
    answer = extract_answer(str(completion))
    return "unparsable" if answer is None else answer
