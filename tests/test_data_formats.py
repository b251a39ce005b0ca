"""The data users have: JSON arrays, parquet, ``datasets`` directories, VLM-R1 conversations and
verl / EasyR1 layouts, through one ``task.options.fields`` mapping, read by the built-in tasks.

Every file here is written by the test itself (no downloads)."""

from __future__ import annotations

import io
import json

import datasets
import mmrl
import pytest
from PIL import Image

from conftest import tiny_run_config
from mmrl.media.coords import Frame, convert_box, qwen_frame
from mmrl.registry import REWARDS

SIZES = {"a.jpg": (640, 427), "b.jpg": (333, 500)}  # odd sizes: resizing changes the aspect a little


def png(size, color="red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


def write_images(folder):
    for name, size in SIZES.items():
        Image.new("RGB", size, "white").save(folder / name)


# -- parquet and datasets directories, images embedded --------------------------------------------

def counting_rows():
    """CLEVR-style counting rows with embedded image bytes; row 2 has no count (a bad record)."""
    return {"image": [{"bytes": png((30, 20)), "path": None}, {"bytes": png((40, 10), "blue"), "path": None},
                      {"bytes": png((8, 8)), "path": None}],
            "problem": ["<image>How many red circles are there?", "How many blue squares are there?", "How many?"],
            "solution": ["<answer>3</answer>", "2", "many"]}


IMAGE_FEATURES = datasets.Features({"image": datasets.Image(), "problem": datasets.Value("string"),
                                    "solution": datasets.Value("string")})


def test_parquet_with_embedded_images(tmp_path, caplog):
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_dict(counting_rows(), features=IMAGE_FEATURES).to_parquet(str(path))
    task = mmrl.make_task("counting", train_path=str(path), eval_path=str(path))
    data = task.examples("train")
    assert len(data) == 2 and data.skipped == [(2, "the answer is not a count: 'many'")]
    assert f"{path} row 2 skipped" in caplog.text
    ex = data[1]
    assert ex["image"].size == (40, 10) and ex["answer"] == "2" and "image_path" not in ex
    assert data[0]["question"] == "How many red circles are there?"  # the <image> marker is gone
    assert data.stats() == {"examples": 2, "skipped_lines": 1, "bad_images": 0, "bad_targets": 0}


def test_raw_bytes_column_and_a_corrupt_image(tmp_path):
    """A plain binary column (no Image feature) holds the bytes themselves; a corrupt one is
    counted and the next example used."""
    path = tmp_path / "raw.parquet"
    datasets.Dataset.from_dict({"image": [b"not an image", png((12, 7))], "question": ["How many?", "How many?"],
                                "answer": ["1", "4"]}).to_parquet(str(path))
    data = mmrl.make_task("counting", train_path=str(path), eval_path=str(path)).examples("train")
    assert data[0]["image"].size == (12, 7) and data[0]["answer"] == "4"
    assert data.stats()["bad_images"] == 1


def verl_rows():
    """verl / EasyR1 layout: a chat-list prompt with an <image> marker, an images list, the truth
    in reward_model.ground_truth."""
    def row(n, size):
        return {"prompt": [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "<image>How many shapes are there?"}],
                "images": [{"bytes": png(size), "path": None}],
                "reward_model": {"ground_truth": str(n), "style": "rule"}, "data_source": "synthetic"}
    return [row(3, (21, 13)), row(5, (17, 9))]


def test_datasets_directory_with_splits_in_verl_layout(tmp_path):
    rows = verl_rows()
    features = datasets.Features({
        "prompt": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
        "images": datasets.List(datasets.Image()),
        "reward_model": {"ground_truth": datasets.Value("string"), "style": datasets.Value("string")},
        "data_source": datasets.Value("string")})
    splits = {name: datasets.Dataset.from_list(part, features=features)
              for name, part in (("train", rows[:1]), ("test", rows[1:]))}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "ds"))
    task = mmrl.make_task("vqa", train_path=str(tmp_path / "ds"), eval_path=str(tmp_path / "ds"))
    train, held_out = task.examples("train")[0], task.examples("eval")[0]
    assert train["question"] == "How many shapes are there?" and train["answer"] == "3"
    assert train["image"].size == (21, 13)  # the first (only) image of the list
    assert held_out["answer"] == "5" and held_out["image"].size == (17, 9)  # eval = the "test" split


def test_saved_dataset_and_the_field_mapping(tmp_path, caplog):
    """``fields`` maps the task's keys to the file's (dotted into nested values); a record without
    a mapped key is skipped, naming the option."""
    rows = {"pics": [[{"bytes": png((9, 5)), "path": None}], [{"bytes": png((9, 5)), "path": None}]],
            "q": ["How many?", "How many?"], "meta": [{"count": "7"}, {"other": "x"}]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    fields = {"question": "q", "answer": "meta.count", "image": "pics"}
    task = mmrl.make_task("counting", train_path=str(tmp_path / "saved"), eval_path=str(tmp_path / "saved"),
                          fields=fields)
    data = task.examples("train")
    assert len(data) == 1 and data[0]["answer"] == "7" and data[0]["image"].size == (9, 5)
    assert data.skipped == [(1, "no 'meta.count' (task.options.fields.answer); keys: pics, q, meta")]
    with pytest.raises(ValueError, match="task.options.fields must map"):
        mmrl.make_task("counting", train_path=str(tmp_path / "saved"), fields={"question": 3}).examples("train")


def test_folder_of_split_named_parquet_files(tmp_path):
    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    for split, n in (("train", 2), ("test", 1)):
        rows = {k: v[:n] for k, v in counting_rows().items()}
        datasets.Dataset.from_dict(rows, features=IMAGE_FEATURES).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))
    task = mmrl.make_task("counting", train_path=str(tmp_path / "hub"), eval_path=str(tmp_path / "hub"))
    assert len(task.examples("train")) == 2 and len(task.examples("eval")) == 1
    glob = mmrl.make_task("counting", train_path=str(folder / "test-*.parquet"), eval_path=str(folder / "*.parquet"))
    assert len(glob.examples("train")) == 1 and len(glob.examples("eval")) == 1  # split names pick "test"


# -- JSON arrays ------------------------------------------------------------------------------------

def test_json_array_chartqa_style(tmp_path, caplog):
    write_images(tmp_path)
    records = [{"imgname": "a.jpg", "query": "What is the value of B?", "label": "7"},
               {"imgname": "b.jpg", "query": "Which is the highest?"},  # no answer: skipped
               {"imgname": "b.jpg", "query": "Is A higher than C?", "label": "yes"}]
    path = tmp_path / "test_augmented.json"
    path.write_text(json.dumps(records, indent=2))
    data = mmrl.make_task("chart_qa", train_path=str(path), eval_path=str(path)).examples("train")
    assert len(data) == 2
    assert [n for n, _ in data.skipped] == [7]  # the line the second record starts on
    assert f"{path}:7 (entry 1) skipped" in caplog.text
    assert data[1]["answer"] == "yes" and data[1]["image"].size == (333, 500)
    assert data[1]["image_path"] == str(tmp_path / "b.jpg")


def test_json_object_holding_the_record_list(tmp_path):
    write_images(tmp_path)
    path = tmp_path / "mathvista.json"
    path.write_text(json.dumps({"version": 1, "data": [
        {"image": "a.jpg", "question": "What is x?", "answer": "12", "choices": ["3", "12"]}]}))
    ex = mmrl.make_task("visual_math", train_path=str(path), eval_path=str(path)).examples("train")[0]
    assert ex["answer"] == "B" and ex["image"].size == (640, 427)


def test_clevr_questions_on_one_line_name_each_skip_by_entry(tmp_path, caplog):
    """CLEVR's questions file as it ships: one object on one line, ``info`` and the ``questions``
    list; every record is on line 1, so a skip names its entry (index in the list, from 0)."""
    write_images(tmp_path)
    questions = [{"image_index": 0, "image_filename": "a.jpg", "question": "How many cubes are there?",
                  "answer": "3", "split": "val"},
                 {"image_index": 1, "image_filename": "b.jpg", "question": "Is it red?", "answer": "yes",
                  "split": "val"},
                 {"image_index": 1, "image_filename": "b.jpg", "question": "How many spheres?", "answer": "0",
                  "split": "val"}]
    path = tmp_path / "CLEVR_val_questions.json"
    path.write_text(json.dumps({"info": {"split": "val", "version": "1.0"}, "questions": questions}))
    assert len(path.read_text().splitlines()) == 1
    data = mmrl.make_task("counting", train_path=str(path), fields={"image": "image_filename"}).examples("train")
    assert [data[i]["answer"] for i in range(len(data))] == ["3", "0"]
    ((line, reason),) = data.skipped
    assert line == 1 and "not a count: 'yes'" in reason
    assert f"{path}:1 (entry 1) skipped: the answer is not a count" in caplog.text


def gqa_questions(tmp_path):
    """GQA's question files as they ship: one object keyed by question id on one line, each
    question naming its image by ``imageId`` (the file images/<imageId>.jpg)."""
    (tmp_path / "images").mkdir()
    Image.new("RGB", (64, 48), "white").save(tmp_path / "images" / "2354786.jpg")
    Image.new("RGB", (32, 40), "white").save(tmp_path / "images" / "n161313.jpg")
    questions = {
        "02930152": {"semantic": [{"operation": "select", "argument": "sky (2486325)", "dependencies": []}],
                     "entailed": ["02930160"], "equivalent": ["02930152"], "question": "Is the sky dark?",
                     "imageId": "2354786", "isBalanced": True, "answer": "yes", "fullAnswer": "Yes, the sky is dark.",
                     "types": {"structural": "verify", "semantic": "attr", "detailed": "verifyAttr"}},
        "07333408": {"question": "What is on the white wall?", "imageId": "n161313", "isBalanced": True,
                     "answer": "pipe", "fullAnswer": "The pipe is on the wall."},
        "07333409": {"imageId": "n161313", "answer": "pipe"},  # no question: skipped, named by entry and id
        "07333410": ["not", "an", "object"],
    }
    path = tmp_path / "val_balanced_questions.json"
    path.write_text(json.dumps(questions))
    return path


def test_gqa_questions_keyed_by_id_with_images_named_by_id(tmp_path, caplog):
    path = gqa_questions(tmp_path)
    task = mmrl.make_task("vqa", train_path=str(path), eval_path=str(path), fields={"image": "imageId"},
                          image_template="{}.jpg", image_root=str(tmp_path / "images"))
    data = task.examples("eval")
    assert len(data) == 2 and task.examples("eval") is data  # the file is read once
    first, second = data[0], data[1]
    assert first["id"] == "02930152" and first["question"] == "Is the sky dark?" and first["answer"] == "yes"
    assert first["image_size"] == (64, 48) and first["image_path"] == str(tmp_path / "images" / "2354786.jpg")
    assert second["id"] == "07333408" and second["image_size"] == (32, 40)
    assert [line for line, _ in data.skipped] == [1, 1]
    assert f"{path}:1 (entry 2, 07333409) skipped: no 'question'" in caplog.text
    assert f"{path}:1 (entry 3, 07333410) skipped: expected a JSON object, got list" in caplog.text
    assert data.stats() == {"examples": 2, "skipped_lines": 2, "bad_images": 0, "bad_targets": 0}
    # without the template a bare id names no file: no image opens, and the error names the entry
    bare = mmrl.make_task("vqa", train_path=str(path), fields={"image": "imageId"},
                          image_root=str(tmp_path / "images")).examples("train")
    with pytest.raises(ValueError, match=r"no example could be used.*:1 \(entry 0, 02930152\): FileNotFoundError"):
        bare[0]
    # ... and says which options say where images are
    images = tmp_path / "images"
    assert bare.bad_images[f"{path}:1 (entry 0, 02930152)"] == (
        f"FileNotFoundError: image {images / '2354786'} does not exist (relative paths start at {images}): set "
        "task.options.image_root to the folder the records' image paths start from, or task.options.image_template "
        "(e.g. '{}.jpg') when records name images by a bare id")
    wrong = mmrl.make_task("vqa", train_path=str(path), fields={"image": "imageId"}, image_template="{}.png",
                           image_root=str(images)).examples("train")
    with pytest.raises(ValueError, match=r"2354786\.png does not exist .*image_template '\{\}\.png' made this name"):
        wrong[0]
    with pytest.raises(ValueError, match=r"image_template must be a path with \{\} .*got 'images/%s.jpg'"):
        mmrl.make_task("vqa", train_path=str(path), image_template="images/%s.jpg").examples("train")


def test_image_template_is_accepted_unquoted_on_the_command_line():
    """`task.options.image_template={}.jpg` as docs/tasks.md writes it: YAML cannot parse "{}.jpg"
    (a flow mapping, then text) and the shell has stripped any quotes, so it is read as the text."""
    from mmrl.config import ConfigError, load_config

    for given, read in (("{}.jpg", "{}.jpg"), ('"{}.jpg"', "{}.jpg"), ("images/{}.png", "images/{}.png"),
                        ("{}_0.png", "{}_0.png")):
        cfg = load_config("vlm/counting_tiny", [f"task.options.image_template={given}"])
        assert cfg.task.options["image_template"] == read
    with pytest.raises(ConfigError, match="cannot parse the value"):  # other YAML errors still say so
        load_config("vlm/counting_tiny", ["task.options.image_root=[a"])


@pytest.mark.slow
def test_errors_about_huge_files_stay_short(tmp_path):
    """An object of another layout is refused quoting a few of its keys, not all 100,000; a record's
    skip reason quotes at most a few hundred characters of its value."""
    path = tmp_path / "ids.json"
    path.write_text(json.dumps({f"{i:08d}": i for i in range(100_000)}))
    with pytest.raises(ValueError) as info:
        mmrl.make_task("vqa", train_path=str(path)).examples("train")
    message = str(info.value)
    assert len(message) < 600 and "'00000000', '00000001'" in message and "(100,000 in all)" in message
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"image": "a.jpg", "question": "How many?", "answer": "x" * 50_000}) + "\n")
    with pytest.raises(ValueError) as info:
        mmrl.make_task("counting", train_path=str(long)).examples("train")
    assert len(str(info.value)) < 700 and "more characters)" in str(info.value)


def test_unreadable_json_and_urls_name_the_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('[{"image": "a.jpg",\n "question": }]')
    with pytest.raises(ValueError, match=r"broken\.json:2: not valid JSON"):
        mmrl.make_task("vqa", train_path=str(broken)).examples("train")
    urls = tmp_path / "urls.jsonl"
    urls.write_text(json.dumps({"image": "https://example.com/a.jpg", "question": "q", "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"urls\.jsonl has no usable example; first problem: line 1: .*is a URL; "
                                         r"mmrl reads local files only"):
        mmrl.make_task("vqa", train_path=str(urls)).examples("train")


# -- VLM-R1 conversations, end to end ---------------------------------------------------------------

BOXES = {"a.jpg": (101.0, 57.0, 402.0, 300.0), "b.jpg": (20.0, 250.0, 160.0, 480.0)}


def write_rec_conversations(folder):
    """VLM-R1's REC layout as it is: the question in the human turn after an <image> marker, the
    box (original pixels) in the gpt turn; one record's box is unreadable."""
    write_images(folder)
    lines = [{"image": name, "conversations": [
        {"from": "human", "value": f"<image>Please provide the bounding box coordinate of the region this "
                                   f"sentence describes: the thing in {name}."},
        {"from": "gpt", "value": json.dumps(list(box))}]} for name, box in BOXES.items()]
    lines.insert(1, {"image": "a.jpg", "conversations": [{"from": "human", "value": "<image>Where?"},
                                                         {"from": "gpt", "value": "no box"}]})
    path = folder / "rec.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _qwen25_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)  # Qwen's default budget


def test_vlm_r1_conversations_read_by_grounding_and_scored_in_each_family_space(tmp_path):
    path = write_rec_conversations(tmp_path)
    data = mmrl.make_task("grounding", train_path=str(path), eval_path=str(path)).examples("train")
    assert len(data) == 2 and [n for n, _ in data.skipped] == [2]
    iou = REWARDS.get("iou")
    processor = _qwen25_processor()
    for ex, name in zip(data, BOXES):
        assert ex["image_size"] == SIZES[name] and ex["box"] == BOXES[name]
        assert ex["question"].startswith("Please provide the bounding box") and "<image>" not in ex["question"]
        # What the trainer records on each example (core.trainer.with_coordinates), per family:
        qwen25 = {**ex, "pred_space": "resized", "frame": qwen_frame(ex["image_size"], processor)}
        qwen2 = {**ex, "pred_space": "rel1000", "frame": Frame(*ex["image_size"])}
        assert qwen25["frame"].resized_width != ex["image_size"][0]  # the resize is not the identity
        for example in (qwen25, qwen2):
            perfect = convert_box(ex["box"], "pixel", example["pred_space"], example["frame"])
            answer = "[" + ", ".join(str(round(v)) for v in perfect) + "]"  # what the model writes: integers
            (score,) = iou([f"<think>There.</think><answer>{answer}</answer>"], [example])
            assert score >= 0.98, (name, example["pred_space"], answer, score)


@pytest.mark.slow
def test_grounding_trains_a_step_on_vlm_r1_conversations(random_tiny_dir, tmp_path, capsys):
    """... and what it skipped is on the record, per split: the train file's unreadable box
    (``skipped_lines``), the eval file's too, and its first record's image that does not open,
    which the evaluation skips (``eval/skipped``) rather than scoring another example twice."""
    path = write_rec_conversations(tmp_path)
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    eval_path = tmp_path / "rec_eval.jsonl"
    broken = {"image": "broken.jpg", "conversations": [{"from": "human", "value": "<image>Where?"},
                                                       {"from": "gpt", "value": "[1, 2, 30, 40]"}]}
    eval_path.write_text(json.dumps(broken) + "\n" + path.read_text())
    cfg = tiny_run_config(random_tiny_dir, tmp_path / "runs", 1, "task.name=grounding",
                          f"task.options.train_path={path}", f"task.options.eval_path={eval_path}",
                          "vlm.max_pixels=50176", "eval.num_examples=5", "eval.before=true")
    result = mmrl.train(cfg)
    assert result.steps == 1
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert any("reward/iou" in x for x in lines)
    assert all(x["data/train/skipped_lines"] == 1 and x["data/eval/skipped_lines"] == 1 for x in lines)
    final = lines[-1]  # the evaluation after training: 2 examples scored, the broken one skipped
    assert final["eval/skipped"] == 1 and final["data/eval/bad_images"] == 1 and final["data/eval/examples"] == 3
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["after"]["skipped"] == 1
    # the table's title states the examples scored, not eval.num_examples
    title = " ".join(capsys.readouterr().out.split())
    assert "held-out eval (grounding, 2 examples;" in title  # eval.num_examples=5
    assert summary["data"]["train"] == {"examples": 2, "skipped_lines": 1, "bad_images": 0, "bad_targets": 0}
    assert summary["data"]["eval"] == {"examples": 3, "skipped_lines": 1, "bad_images": 1, "bad_targets": 0}
