"""Every ``mmrl ...`` command shown in the docs is run (issue 38, item 6), not only parsed
(``tests/test_docs.py`` parses them all).

Each command of :func:`test_docs.shown_commands` is handled in one of four ways, declared in the tables
below; :func:`test_every_shown_command_has_a_runner` fails the suite when a new docs command has none:

(a) **run** by the command line's own code in this process (typer's runner: a subprocess would spend
    most of its time importing torch), in a temporary directory, with the command's own arguments
    plus the one declared budget suffix of its subcommand (:data:`BUDGET`: one RL step of one prompt,
    one held-out example, ...). The test checks the exit code (or, for a command the docs show
    failing, the error the docs show) and one output the command promises (a run directory with a
    metrics row, a written file, a printed table). Two commands that parse to the same parameters
    once the budget is on run once.
(b) a command naming a checkpoint or data that cannot exist here runs the same way with the
    suite's tiny stand-in of the same kind in its place (:data:`STAND_INS`, the one table of them).
(c) a command that asks for CUDA is marked ``gpu`` (it runs where torch sees a device, else it is
    skipped with the reason); one that needs vLLM is marked ``vllm``.
(d) an expensive command that an existing test already runs is named in :data:`COVERED_BY`, and
    :func:`test_covered_commands_name_a_test_that_runs_them` checks that test exists and runs it.

A few commands cannot run here at all (several GPUs, a recipe the user writes): :data:`CANNOT_RUN`,
each skipped with its reason.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import mmrl_in_process
from test_docs import REPO, _parse, shown_commands

COMMANDS = shown_commands()


def _text(args) -> str:
    return " ".join(args)


# --------------------------------------------------------------------------- the declared tables

# The one budget suffix per subcommand (train and sft: per kind of model, since a key the policy does
# not read is a config error). Appended after the command's own arguments, so it wins.
_VLM = ("train.steps=1", "train.prompts_per_step=1", "rollout.num_generations=2",
        "rollout.max_completion_length=4", "eval.num_examples=1", "eval.pass_k=0", "log.progress=false",
        "train.device=cpu")
_GENERATOR = ("train.steps=1", "train.prompts_per_step=1", "rollout.num_generations=2", "diffusion.num_steps=2",
              "diffusion.eval_num_steps=2", "diffusion.height=16", "diffusion.width=16", "eval.num_examples=1",
              "log.progress=false", "train.device=cpu")
BUDGET: dict[str, tuple[str, ...]] = {
    "train vlm": _VLM, "train video": _VLM, "train gui": _VLM, "train diffusion": _GENERATOR,
    "sft": ("train.steps=1", "train.prompts_per_step=2", "eval.num_examples=1", "log.progress=false",
            "train.device=cpu"),
    "eval": ("--num-examples", "1"),
    "bench algos": ("--steps", "1", "--seeds", "0", *_VLM[1:]),
    "bench async": (),  # --simulate only: the measurement is in CANNOT_RUN
    "bench diffusion": ("--steps", "1", *_GENERATOR[1:]),
    "bench speed": ("--prompts", "1", "--generations", "2", "--tokens", "2", "--steps", "1", "--warmup", "0",
                    "--repeats", "1", "--towers", "frozen", "--trl", "best"),  # one pair, two runs
    "bench rollout": ("--tiny",),
    "bench optimizers": ("--width", "16", "--layers", "1", "--steps", "1"),
    "bench gpu": ("--steps", "1", "--warmup", "0", "--budget", "120"),
    "plan": (),  # reads configs only: seconds
    "demo": ("--port", "{free port}"),  # not 7860, which anyone on the machine may be using
}

# What a command names that cannot exist here -> the stand-in of the same kind the suite builds
# (resolved by the `stand_ins` fixture). Checkpoints: the random tiny Qwen2.5-VL (conftest), the tiny
# SD3 pipeline (diffusion_fixtures), the tiny Wan 2.1 I2V pipeline (wan_i2v_builders); hub ids: the same, in an offline Hugging Face cache laid out as
# tests/test_hub_ids.py lays it out; benchmark and data files: a few entries in each file layout, as
# the readers' tests write them (ScreenSpot-v2 as test_benchmarks.py's command test, ScreenSpot-Pro
# as test_screen_grounding.py, with boxes on their screenshots; AndroidControl: test_gui_episodes.py;
# VLM-R1's RefCOCO records: test_grounding_reader.py; V*: test_tool_data.py; HR-Bench:
# test_visual_search_benchmarks.py; Video-R1: test_video_tasks.py); GenEval's CLIP: the random tiny
# open_clip model (conftest); a user's plugin file: the complete one of test_plugin_loading.py.
STAND_INS: dict[str, str] = {
    "/models/Qwen2.5-VL-3B-Instruct": "tiny_vlm", "/models/Qwen2.5-VL-7B-Instruct": "tiny_vlm",
    "/models/sd3.5-medium": "tiny_sd3", "/models": "models_dir",
    "/models/wan2.1-i2v-14b-480p": "tiny_wan21_i2v",
    "plan /models/sd3.5-medium": "sd35_shape",  # `mmrl plan` measures the real shape: the tiny SD3 cannot run 512 px
    "Qwen/Qwen2.5-VL-3B-Instruct": "hub_vlm", "stabilityai/stable-diffusion-3.5-medium": "hub_generator",
    "prompts.txt": "prompts",
    "ScreenSpot-v2/": "screenspot_v2", "ScreenSpot-v2/screenspotv2_image": "screenspot_v2_images",
    "/data/ScreenSpot-v2": "screenspot_v2", "/data/ScreenSpot-v2/screenspotv2_image": "screenspot_v2_images",
    "/data/screens/train.json": "screenspot_v2_file",
    "ScreenSpot-Pro/annotations": "screenspot_pro", "ScreenSpot-Pro/images": "screenspot_pro_images",
    "refcoco_val.json,refcoco_testA.json": "refcoco", "coco/train2014": "refcoco_images",
    "ViT-L-14=weights/vit_l_14_openai.pt": "clip",
    "/data/android_control/train.jsonl": "android_control", "/data/android_control/test.jsonl": "android_control",
    "/data/Video-R1-260k.json": "video_r1", "/data/Video-R1-data": "video_r1_root",
    "data/train.jsonl": "counting_jsonl", "data/val.jsonl": "counting_jsonl",
    "[my_task.py]": "plugin", "[docs/examples/calculator.py]": "calculator",
    "vstar_bench/": "vstar", "hr_bench_4k.tsv": "hrbench",
}

# Runs the docs name that no shown command makes: made once a module in the workspace by the
# command here, with the budget (a run trained on the task the docs mean).
STAND_IN_RUNS: dict[str, tuple[str, ...]] = {
    "runs/zoom": ("train", "vlm", "vlm/zoom_qa_tiny", "log.run_name=zoom"),
}

# Commands that earlier commands' outputs feed (the docs' `runs/exp1`, `runs/t2i`, `runs/warm`): each
# is made once a module, in the shared workspace, by the command shown here with the extra arguments
# that give its run the name the docs use (and, for exp1, 2 steps with a checkpoint at each, so
# that `train --resume` has a step left to train).
PRODUCERS: dict[str, tuple[str, ...]] = {
    "train vlm": ("train.steps=2", "log.save_every=1", "log.run_name=exp1"),
    "train diffusion": ("log.run_name=t2i",),
    "sft vlm/counting_tiny log.run_name=warm": (),
}

# (d) Expensive commands an existing test runs: the test, and the call in its source that runs the
# command (the command line itself, or, for build-tiny, the builder the command calls:
# mmrl.registry.TINY_MODELS). build-tiny's budget (one SFT step) still takes 3-22 s a model
# (the tokenizer, the corpus, the vision tower), which the suite cannot spend twice.
COVERED_BY: dict[str, tuple[str, str]] = {
    "bench gpu --tiny": ("tests/test_bench_gpu.py::test_bench_gpu_tiny_runs_every_group_on_a_cpu",
                         '["bench", "gpu", "--tiny"'),
    "build-tiny vlm": ("tests/test_vlm_policy.py::test_build_tiny_is_reproducible", "build_tiny_vlm("),
    "build-tiny video": ("tests/test_video_tasks.py::test_build_tiny_video_warm_starts_a_checkpoint_that_loads",
                         "build_tiny_video("),
    "build-tiny gui": ("tests/test_vision_pretrain.py::test_build_tiny_gui_pretrains_the_tower_then_warm_starts",
                       "build_tiny_gui("),
    "build-tiny gui-grounding": ("tests/test_vision_pretrain.py::"
                                 "test_build_tiny_gui_grounding_teaches_clicks_with_the_tower_frozen",
                                 "build_tiny_gui_grounding("),
    "build-tiny diffusion": ("tests/test_tiny_generator.py::test_shipped_generator_is_what_build_tiny_makes",
                             '["build-tiny", modality, "--out", str(tmp_path), "--steps", "2"]'),
    "build-tiny video-gen": ("tests/test_tiny_generator.py::test_shipped_generator_is_what_build_tiny_makes",
                             '["build-tiny", modality, "--out", str(tmp_path), "--steps", "2"]'),
    "build-tiny edit": ("tests/test_tiny_edit_generator.py::test_shipped_editing_generator_is_what_build_tiny_makes",
                        '["build-tiny", "edit", "--out", str(tmp_path), "--steps", "2"]'),
    # a reward service runs until stopped; the test starts one in its own process and trains against it
    "serve-reward composition --port 8100": ("tests/test_reward_service.py::test_a_served_reward_trains_as_in_process",
                                             '_serve_reward("serve-reward", "composition", "--port"'),
    "train diffusion task.rewards.http=1.0 task.reward_kwargs.http.url=http://127.0.0.1:8100": (
        "tests/test_reward_service.py::test_a_served_reward_trains_as_in_process",
        '"task.rewards.http=1.0", f"task.reward_kwargs.http.url={url}"'),
}

_ASYNC_BENCH = ("the measurement: a vLLM server (the vLLM environment) and 6 training runs, minutes on both cores; "
                "its parts are tested by tests/test_bench_async.py")
_LAYOUT = ("a layout of vLLM servers and training processes on 8 or 16 GPUs (docs/distributed.md) for a recipe the "
           "user writes; the server and the asynchronous trainer run on CPU in tests/test_vllm_server.py and "
           "tests/test_async_rollouts.py")
_SERVER = ("a vLLM server (the vLLM environment, ~30 s to start) and a run against it: tests/test_vllm_server.py "
           "starts servers with start_rollout_server (mmrl rollout-server's function) and runs mmrl train on one")
CANNOT_RUN: dict[str, str] = {
    "train vlm my_recipe.yaml": "a launch on 8 GPUs (accelerate / torchrun) of a recipe the user writes; the "
                                "2-process CPU launch is run by tests/test_distributed.py",
    "bench async": _ASYNC_BENCH,
    "rollout-server my_recipe.yaml --port 8000": _LAYOUT,
    "rollout-server my_recipe.yaml --port 8001": _LAYOUT,
    "train vlm my_recipe.yaml rollout.engine=vllm_server rollout.server_urls=[http://127.0.0.1:8000,"
    "http://127.0.0.1:8001] train.async_rollouts=true": _LAYOUT,
    "train vlm my_recipe.yaml rollout.engine=vllm_server rollout.server_urls=[" + ",".join(
        f"http://servers:800{i}" for i in range(8)) + "] rollout.weight_sync_dir=/shared/mmrl-weights "
    "train.async_rollouts=true": _LAYOUT,
    "bench async --vllm /path/to/venv-vllm --steps 40 --seeds 0,1 train.prompts_per_step=16": _ASYNC_BENCH,
    "rollout-server vlm/counting_tiny --port 8000": _SERVER,
    "train vlm vlm/counting_tiny rollout.engine=vllm_server rollout.server_urls=[http://127.0.0.1:8000]": _SERVER,
    "train vlm vlm/counting_tiny rollout.engine=vllm_server rollout.server_urls=[http://127.0.0.1:8000] "
    "train.async_rollouts=true train.max_staleness=1": _SERVER,
}


def _needs_gpu(args) -> bool:
    """(c): the command asks for a CUDA device (bench gpu's full table is the GPU's)."""
    return "train.device=cuda" in args or "--device cuda" in _text(args) or \
        (args[:2] == ["bench", "gpu"] and "--tiny" not in args)


def _recipe(args):
    """The config of the shipped recipe a ``train`` / ``sft`` command names, else None."""
    from mmrl.config import ConfigError, builtin_config_path, load_config

    for a in args[1:]:
        if "=" in a or a.startswith("-") or a in ("vlm", "video", "diffusion", "gui"):
            continue
        try:
            return load_config(builtin_config_path(a), [])
        except (ConfigError, FileNotFoundError, ValueError):
            return None
    return None


def _needs_vllm(args) -> bool:
    """The command uses vLLM: rollout.engine=vllm (given, or set by the recipe it names), or bench
    rollout's HF-vs-vLLM comparison."""
    if args[:2] == ["bench", "rollout"]:
        return "--caches" not in args
    cfg = _recipe(args) if args[0] in ("train", "sft") else None
    return "rollout.engine=vllm" in args or (cfg is not None and cfg.rollout.engine == "vllm")


def _with_recipe_checkpoint(args) -> list[str]:
    """A shipped recipe whose ``model.path`` is a checkpoint of :data:`STAND_INS` (the real-model
    recipes' /models/...) gets that path as an override, so its stand-in replaces it."""
    if args[0] not in ("train", "sft") or any(a.startswith("model.path=") for a in args):
        return list(args)
    cfg = _recipe(args)
    return [*args, f"model.path={cfg.model.path}"] if cfg is not None and cfg.model.path in STAND_INS else list(args)


def _subcommand(args) -> str:
    return " ".join(args[:2]) if args[0] in ("train", "bench") and len(args) > 1 and not args[1].startswith("-") \
        else args[0]


# --------------------------------------------------------------------------- coverage of the tables


def _how(args) -> str:
    text = _text(args)
    if text in COVERED_BY:
        return "covered"
    if text in CANNOT_RUN:
        return "cannot"
    if any(a.startswith("<") for a in args):
        return "placeholder"
    return "run"


def test_every_shown_command_has_a_runner():
    """The union of (a)-(d) is every command the docs show: a command with no way to run here
    fails (add it to a table above, or give its subcommand a budget)."""
    for where, args, _ in COMMANDS:
        how = _how(args)
        assert how != "placeholder", f"{where}: a placeholder in a docs command cannot be run"
        if how != "run" or args[-1] == "--help":
            continue
        sub = _subcommand(args)
        runnable = sub in BUDGET or sub in ("list", "export", "report") or args[:2] == ["train", "--resume"] \
            or args[0] == "demo"
        assert runnable, f"{where}: `mmrl {_text(args)}` has no budget suffix ({sub!r} is not in BUDGET)"
    shown = {_text(a) for _, a, _ in COMMANDS}
    for table in (COVERED_BY, CANNOT_RUN, PRODUCERS):
        assert set(table) <= shown, f"entries for commands the docs no longer show: {sorted(set(table) - shown)}"
    values = {w for _, args, _ in COMMANDS for a in args for v in (a, a.partition("=")[2])
              for w in (v, f"{args[0]} {v}")}
    unused = (set(STAND_INS) | set(STAND_IN_RUNS)) - values
    assert not unused, f"stand-ins for nothing shown: {sorted(unused)}"


@pytest.mark.parametrize("command", sorted(COVERED_BY))
def test_covered_commands_name_a_test_that_runs_them(command):
    """Each (d) entry names a test that exists, and its source runs the command: the subcommand and its
    arguments as the command line is invoked, or the builder that ``build-tiny NAME`` calls."""
    target, call = COVERED_BY[command]
    path, name = target.split("::")
    source = (REPO / path).read_text()
    tree = ast.parse(source)
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert node is not None, f"{target} does not exist"
    body = ast.get_source_segment(source, node)
    assert call in body, f"{target} does not show {call!r}"
    args = command.split()
    if args[0] == "build-tiny":
        from mmrl.registry import TINY_MODELS

        builder = TINY_MODELS.get(args[1]).builder.split(":")[1]
        assert f"{builder}(" in body or (args[0] in body and args[1] in source), (command, builder)
    else:
        assert all(a in body for a in args if not a.startswith("0.0.0.0")), (command, target)


# --------------------------------------------------------------------------- stand-ins and workspace


def write_sd35_medium_shape(path: Path) -> Path:
    """tests/published_shapes/sd3_5_medium with its three text encoders' configs, as a download of
    stabilityai/stable-diffusion-3.5-medium has them: CLIP-L (openai/clip-vit-large-patch14's text
    model), OpenCLIP bigG's text model, and T5 v1.1 XXL's encoder (google/t5-v1_1-xxl)."""
    from transformers import CLIPTextConfig, T5Config

    shutil.copytree(REPO / "tests" / "published_shapes" / "sd3_5_medium", path)
    clip = dict(vocab_size=49408, max_position_embeddings=77, architectures=["CLIPTextModelWithProjection"])
    CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                   projection_dim=768, hidden_act="quick_gelu", **clip).save_pretrained(path / "text_encoder")
    CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                   projection_dim=1280, hidden_act="gelu", **clip).save_pretrained(path / "text_encoder_2")
    T5Config(vocab_size=32128, d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24,
             feed_forward_proj="gated-gelu", is_encoder_decoder=False,
             architectures=["T5EncoderModel"]).save_pretrained(path / "text_encoder_3")
    return path


@pytest.fixture(scope="module")
def stand_ins(request, tmp_path_factory, random_tiny_dir):
    """:data:`STAND_INS`'s names -> the paths (or values) that replace what the docs name."""
    from PIL import Image

    from test_gui_episodes import write_android_control
    from test_hub_ids import cache_repo
    from test_plugin_loading import PLUGIN
    from test_video_reader import write_clip
    from test_visual_search_benchmarks import HR_ROWS, write_hrbench_tsv

    root = tmp_path_factory.mktemp("stand-ins")
    out = {"tiny_vlm": random_tiny_dir}
    # ScreenSpot-v2's layout (screenspot_<platform>_v2.json beside screenspotv2_image/), as the
    # benchmark test of tests/test_benchmarks.py writes it: boxes that lie on their screenshots
    v2 = root / "screenspot-v2"
    (v2 / "screenspotv2_image").mkdir(parents=True)
    Image.new("RGB", (320, 200), "white").save(v2 / "screenspotv2_image" / "pc_1.png")
    Image.new("RGB", (200, 320), "white").save(v2 / "screenspotv2_image" / "mobile_1.png")
    rows = {"desktop": [{"img_filename": "pc_1.png", "bbox": [20, 30, 60, 20], "instruction": "close the window",
                         "data_type": "icon", "data_source": "windows"}],
            "mobile": [{"img_filename": "mobile_1.png", "bbox": [10, 40, 150, 50], "instruction": "turn on Wi-Fi",
                        "data_type": "text", "data_source": "ios"}], "web": []}
    for platform, entries in rows.items():
        (v2 / f"screenspot_{platform}_v2.json").write_text(json.dumps(entries))
    out.update(screenspot_v2=v2, screenspot_v2_images=v2 / "screenspotv2_image",
               screenspot_v2_file=v2 / "screenspot_desktop_v2.json")
    # ScreenSpot-Pro's layout: annotations/<app>_<platform>.json, images/<app>_<platform>/*.png
    pro = root / "screenspot-pro"
    (pro / "annotations").mkdir(parents=True)
    (pro / "images" / "vscode_macos").mkdir(parents=True)
    Image.new("RGB", (320, 208), "white").save(pro / "images" / "vscode_macos" / "shot.png")
    (pro / "annotations" / "vscode_macos.json").write_text(json.dumps([
        {"img_filename": "vscode_macos/shot.png", "bbox": [40, 20, 90, 50], "instruction": "Refresh the file explorer.",
         "id": "vscode_macos_0", "application": "vscode", "platform": "macos", "img_size": [320, 208],
         "ui_type": "icon", "group": "Dev"}]))
    out.update(screenspot_pro=pro / "annotations", screenspot_pro_images=pro / "images")
    coco = root / "coco"
    coco.mkdir()
    Image.new("RGB", (200, 100), "white").save(coco / "img.jpg")
    refcoco = []
    for split, box in (("val", [10, 20, 50, 80]), ("testA", [100, 10, 190, 60])):  # VLM-R1's records, a JSON array
        path = root / f"refcoco_{split}.json"
        path.write_text(json.dumps([{"image": "img.jpg", "problem": "the shape", "solution": box}]))
        refcoco.append(str(path))
    out.update(refcoco=",".join(refcoco), refcoco_images=coco)
    vstar = root / "vstar_bench" / "direct_attributes"  # V* Bench: <category>/<name>.jpg beside <name>.json
    vstar.mkdir(parents=True)
    Image.new("RGB", (200, 100), (0, 0, 255)).save(vstar / "sa_1.jpg")
    (vstar / "sa_1.json").write_text(json.dumps({"target_object": ["umbrella"], "bbox": [[10, 20, 30, 40]],
                                                 "question": "What is the color of the umbrella?",
                                                 "options": ["blue", "red", "green", "white"]}))
    (vstar.parent / "relative_position").mkdir()
    Image.new("RGB", (200, 100), (0, 0, 255)).save(vstar.parent / "relative_position" / "sa_2.jpg")
    (vstar.parent / "relative_position" / "sa_2.json").write_text(json.dumps(
        {"question": "Is the cup on the left or right of the dog?", "options": ["left", "right"]}))
    out["vstar"] = vstar.parent
    write_hrbench_tsv(root / "hr_bench_4k.tsv", HR_ROWS)
    out["hrbench"] = root / "hr_bench_4k.tsv"
    out["android_control"] = write_android_control(root / "android-control")
    video = root / "video-r1"
    video.mkdir()
    write_clip(video / "a.mp4", frames=20, fps=10, size=(56, 56))
    Image.new("RGB", (56, 56), (200, 0, 0)).save(video / "b.png")
    (video / "train.json").write_text(json.dumps([  # Video-R1's layout: clips, and images among them
        {"problem": "Which way does it move?", "problem_type": "multiple choice", "options": ["A. left", "B. right"],
         "solution": "<answer>B</answer>", "path": "a.mp4", "data_type": "video"},
        {"problem": "What colour is it?", "problem_type": "multiple choice", "options": ["A. red", "B. blue"],
         "solution": "<answer>A</answer>", "path": "b.png", "data_type": "image"}]))
    out.update(video_r1=video / "train.json", video_r1_root=video)
    counting = root / "counting.jsonl"  # CLEVR-style counting lines, as test_grounding_reader.py reads them
    counting.write_text(json.dumps({"image": str(coco / "img.jpg"), "problem": "How many shapes?",
                                    "solution": "<answer>2</answer>"}) + "\n")
    out["counting_jsonl"] = counting
    (root / "prompts.txt").write_text("a red circle\ntwo blue squares\n")
    out["prompts"] = root / "prompts.txt"
    name, checkpoint = request.getfixturevalue("tiny_clip")
    out["clip"] = f"{name}={checkpoint}"
    (root / "my_task.py").write_text(PLUGIN.replace("PREFIX_", ""))
    out["plugin"] = f"[{root / 'my_task.py'}]"
    out["calculator"] = f"[{REPO / 'docs' / 'examples' / 'calculator.py'}]"  # the docs' example, as it ships
    models = root / "models"
    models.mkdir()
    (models / "qwen").symlink_to(random_tiny_dir, target_is_directory=True)
    out["models_dir"] = models

    def sd3():
        return request.getfixturevalue("sd3_dir")

    out["tiny_sd3"] = sd3  # built only when a command needs it

    def wan21_i2v():  # the tiny Wan 2.1 I2V pipeline of tests/test_wan_i2v_generator.py
        from wan_i2v_builders import build_tiny_wan21_i2v

        path = root / "wan2.1-i2v"
        return path if (path / "model_index.json").is_file() else build_tiny_wan21_i2v(path)

    out["tiny_wan21_i2v"] = wan21_i2v

    def sd35_shape():  # SD3.5 Medium's published shape with its three text encoders: what a download has
        path = root / "sd3.5-medium-shape"
        if not path.is_dir():
            write_sd35_medium_shape(path)
        return path

    out["sd35_shape"] = sd35_shape
    hub = root / "hub"
    hub.mkdir()
    out["hub_cache"] = hub  # HF_HUB_CACHE of every command, with HF_HUB_OFFLINE=1

    def cached(source, repo):  # a hub id stays as it is: the offline cache gets the stand-in under it
        def put():
            if not (hub / ("models--" + repo.replace("/", "--"))).is_dir():
                cache_repo(hub, source(), repo)
            return repo
        return put

    out["hub_vlm"] = cached(lambda: random_tiny_dir, "Qwen/Qwen2.5-VL-3B-Instruct")
    out["hub_generator"] = cached(sd3, "stabilityai/stable-diffusion-3.5-medium")
    return out


def _substituted(args, stand_ins) -> list[str]:
    """The arguments with each value :data:`STAND_INS` names (a whole argument, or a KEY=VALUE's value)
    replaced by its stand-in (``"<subcommand> <value>"`` first: a stand-in for that subcommand only)."""
    out = []
    for a in args:
        key, sep, value = ("", "", a) if a in STAND_INS or "=" not in a else a.partition("=")
        name = STAND_INS.get(f"{args[0]} {value}", STAND_INS.get(value))
        if name is not None:
            found = stand_ins[name]
            value = str(found() if callable(found) else found)
        out.append(key + sep + value)
    return out


def _in_process(args, cwd: Path, env: dict | None = None):
    """(exit code, stdout, stderr) of :func:`conftest.mmrl_in_process` in ``cwd``, with the
    environment variables a docs line sets before ``mmrl`` set for the call."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        r = mmrl_in_process(*args, cwd=cwd)
    return r.returncode, r.stdout, r.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _budgeted(args, gpu: bool) -> list[str]:
    budget = tuple(str(_free_port()) if b == "{free port}" else b for b in BUDGET.get(_subcommand(args), ()))
    if args[:2] == ["train", "--resume"] or (args and args[-1] == "--help"):
        budget = ()
    if gpu:
        budget = tuple(b for b in budget if b != "train.device=cpu")
    return [a[1:-1] if a.startswith("[-") and a.endswith("]") else a for a in args] + list(budget)


class Workspace:
    """The shared directory the docs' commands run in (``runs/exp1`` ... live there), the stand-ins,
    the offline hub cache, and the results of commands already run (by their parsed parameters)."""

    def __init__(self, root: Path, stand_ins: dict):
        self.root, self.stand_ins, self.done = root, stand_ins, {}
        self.env = {"HF_HUB_CACHE": str(stand_ins["hub_cache"]), "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true",
                    **{k: str(root / "wandb-home") for k in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}}

    def run(self, args, extra=(), cwd: Path | None = None, gpu: bool = False, env: dict | None = None):
        for a in args:
            if a in STAND_IN_RUNS and not (self.root / a).is_dir():
                code, out, err, argv = self.run(STAND_IN_RUNS[a][:-1], extra=STAND_IN_RUNS[a][-1:])
                assert code == 0, f"`mmrl {_text(argv)}`\n{out[-3000:]}\n{err[-3000:]}"
        argv = _substituted(_budgeted(_with_recipe_checkpoint(args), gpu), self.stand_ins) + list(extra)
        ctx, path = _parse(argv)
        key = (tuple(path), repr(sorted((ctx.params or {}).items())) if ctx else "", tuple(ctx.args) if ctx else ())
        if key not in self.done:
            self.done[key] = (*_in_process(argv, cwd or self.root, {**self.env, **(env or {})}), argv)
        return self.done[key]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, stand_ins):
    ws = Workspace(tmp_path_factory.mktemp("docs-commands"), stand_ins)
    for command, extra in PRODUCERS.items():  # runs/exp1, runs/t2i, runs/warm: what later commands read
        code, out, err, argv = ws.run(command.split(), extra)
        assert code == 0, f"`mmrl {_text(argv)}`\n{out[-3000:]}\n{err[-3000:]}"
    return ws


# --------------------------------------------------------------------------- what each command promises


def _run_dir(out: str, cwd: Path) -> Path:
    m = re.search(r"run directory: (\S+)", out)  # out: stdout and stderr
    assert m, out[-2000:]
    return cwd / m.group(1)


def _trained(run: Path, steps: int = 1) -> None:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert any(r.get("step") == steps and "reward" in r for r in rows), rows[-3:]
    assert (run / "summary.json").is_file()


def _check(args, out: str, err: str, cwd: Path) -> None:
    sub = _subcommand(args)
    if args[-1] == "--help":
        assert "Usage:" in out
    elif args[:2] == ["train", "--resume"]:  # step 2 trained again: its checkpoint and the summary are back
        run = _run_dir(out + err, cwd)
        assert (run / "checkpoints" / "step_00000002").is_dir() and (run / "summary.json").is_file()
        _trained(run, steps=2)
    elif args[0] in ("train",):
        _trained(_run_dir(out + err, cwd))
    elif sub == "sft":  # the model the docs' next command trains from: runs/<log.run_name>/model
        name = next((a.split("=", 1)[1] for a in args if a.startswith("log.run_name=")), "warm")
        assert (cwd / "runs" / name / "model" / "config.json").is_file()
    elif sub == "eval" and "--benchmark" in args:  # the table, written beside the gallery
        name, target = args[args.index("--benchmark") + 1], cwd / args[1]
        gallery = (target if (target / "config.yaml").is_file() else cwd) / "eval_gallery"
        report = json.loads((gallery / f"benchmark_{name}.json").read_text())
        assert report["rows"] and f"benchmark_{name}.json" in " ".join((out + err).split()), out[-2000:]
    elif sub == "eval":
        assert '"intervals"' in out and "gallery:" in err
    elif sub == "export":
        assert (cwd / args[2] / "config.json").is_file() and (cwd / args[2] / "README.md").is_file()
    elif sub == "report":
        assert out.strip().endswith("report.html") and (cwd / args[1] / "report.html").is_file()
    elif sub == "list":
        assert "recipes" in out and re.search(r"^benchmarks: .*screenspot_v2", out, re.M)
    elif sub == "bench algos":
        out_dir = cwd / (args[args.index("--out") + 1] if "--out" in args else "runs/bench-algos")
        assert (out_dir / "algos.json").is_file() and "grpo" in out
    elif sub == "bench diffusion":
        assert (cwd / "runs" / "bench-diffusion" / "diffusion.json").is_file()
    elif sub == "bench speed":
        assert (cwd / "runs" / "bench-speed" / "speed.json").is_file()
    elif sub == "bench rollout":
        assert re.search(r"^dynamic\s+\d", out, re.M) and re.search(r"^static\s+\d", out, re.M), out
    elif sub == "bench optimizers":
        assert "adamw_kahan" in out and "adamw_bf16_sr" in out
    elif sub == "bench async":  # --simulate: the table
        assert "predictions, not measurements" in out and re.search(r"^\S+\s+k=1\s+\d", out, re.M), out
    elif sub == "plan":
        assert "predicted peak GiB per GPU" in out and re.search(r"^as configured\s+\d", out, re.M), out[-2000:]
    elif sub == "bench gpu":
        assert (cwd / "runs" / "bench-gpu" / "speed.md").is_file()
    elif sub == "demo":
        assert re.search(r"^mmrl demo: http://", out, re.M), out[-2000:]
    elif sub == "plan":  # the table of modes, and its verdict on the card named
        assert re.search(r"^as configured\s+\d", out, re.M) and re.search(r"^(fits|does not fit) as configured", out, re.M), out
    else:
        raise AssertionError(f"no check for `mmrl {_text(args)}`")


# --------------------------------------------------------------------------- the commands, run


def _cases():
    seen, cases = set(), []
    for where, args, following in COMMANDS:
        text = _text(args)
        if _how(args) != "run" or text in seen:
            continue
        seen.add(text)
        marks = []
        if _needs_gpu(args):
            marks.append(pytest.mark.gpu)
        if _needs_vllm(args):
            marks.append(pytest.mark.vllm)
        cases.append(pytest.param(where, args, following, marks=marks, id=f"{where} mmrl {text}"[:140]))
    return cases


def _env_of(where: str) -> dict:
    """The variables a docs line sets before ``mmrl`` (``MMRL_DEMO_AUTH=ada:secret mmrl demo ...``)."""
    path, lineno = where.rsplit(":", 1)
    line = (REPO / path).read_text().splitlines()[int(lineno) - 1].strip().removeprefix("$ ")
    m = re.match(r"((?:[A-Z_][A-Z0-9_]*=\S*\s+)+)\S*mmrl\b", line)
    return dict(pair.split("=", 1) for pair in m.group(1).split()) if m else {}


def _serving_returns(monkeypatch):
    """``mmrl demo`` serves until stopped: its server is started, the banner printed, and the call
    returns (gradio's ``block_thread``, the wait, is the one thing left out); closed after."""
    import gradio

    monkeypatch.setattr(gradio.Blocks, "block_thread", lambda self: None)
    return gradio


@pytest.mark.slow  # ~50 s of runs: the full suite runs them, the fast lane leaves them out
@pytest.mark.parametrize("where,args,following", _cases())
def test_the_shown_command_runs(where, args, following, workspace, tmp_path, monkeypatch):
    text = _text(args)
    gpu = _needs_gpu(args)
    if following.startswith(("config error: ", "error: ")):  # a transcript of a failure: run as shown
        code, out, err = _in_process(args, tmp_path)
        assert code == 2, (code, out, err)
        assert following.strip() in " ".join((out + err).split()), (out + err)[-2000:]
        return
    if args[0] == "demo":
        gradio = _serving_returns(monkeypatch)
        try:
            code, out, err, argv = workspace.run(args, gpu=gpu, env=_env_of(where))
        finally:
            gradio.close_all()
        assert code == 0, f"`mmrl {_text(argv)}`\n{out[-3000:]}\n{err[-3000:]}"
        return _check(args, out, err, workspace.root)
    cwd = workspace.root
    if args[:2] == ["train", "--resume"]:  # runs/exp1 stopped after step 1 of 2 (its step-2 checkpoint gone)
        shutil.copytree(workspace.root / "runs" / "exp1", tmp_path / "runs" / "exp1", symlinks=True)
        checkpoints = tmp_path / "runs" / "exp1" / "checkpoints"
        shutil.rmtree(checkpoints / "step_00000002")
        (checkpoints / "latest").write_text("step_00000001\n")
        (tmp_path / "runs" / "exp1" / "summary.json").unlink()
        cwd = tmp_path
    elif args[0] == "train" and text not in PRODUCERS and "model.path=runs/" not in text:  # else it reads a run
        cwd = tmp_path  # a run directory of its own (two runs of one recipe in one second would share one)
    code, out, err, argv = workspace.run(args, cwd=cwd, gpu=gpu,
                                         extra=PRODUCERS.get(text, ()))
    assert code == 0, f"`mmrl {_text(argv)}`\n{out[-3000:]}\n{err[-3000:]}"
    _check(args, out, err, cwd)


@pytest.mark.parametrize("command", sorted(CANNOT_RUN))
def test_commands_that_cannot_run_here(command):
    pytest.skip(CANNOT_RUN[command])


@pytest.mark.slow
def test_mmrl_finds_its_shipped_files_as_mmrl_assets():
    """``mmrl build-tiny NAME`` run outside a source checkout failed with "No module named 'assets'":
    the top-level ``assets`` package exists only in the repository (installed, it is ``mmrl.assets``)."""
    top_level = []
    for path in sorted((REPO / "mmrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            top_level += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names if n and n.split(".")[0] == "assets"]
    assert not top_level, top_level
