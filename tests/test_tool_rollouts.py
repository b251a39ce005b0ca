"""Multi-turn tool rollouts (the agent loop with mmrl.tools.interaction) with a scripted policy: a
row per turn, the conversation each turn sees, the trajectory record, the budget, over-turn
masking, the metrics and trajectory-level advantages, all hand-checked."""

from __future__ import annotations

import time

import pytest
import torch

from mmrl import make_task
from mmrl.core.advantages import episode_grpo
from mmrl.core.episodes import episode_metrics, is_episodic, rollout_task
from mmrl.core.rollouts import Rollouts
from mmrl.registry import REWARDS, load_plugins
from mmrl.tools import Tool, ToolObservation, call_text, register_tool

load_plugins()


class ScriptedPolicy:
    """Writes ``script(turn_index, example)`` for each prompt; records the prompts it saw."""

    capabilities = frozenset({"multi_turn"})

    def __init__(self, script):
        self.script, self.prompts, self.stops = script, [], []

    def prepare_examples(self, examples):
        return [{**ex, "pred_space": "pixel"} for ex in examples]

    def rollout(self, examples, prompts, n, mode, need_old_logps=False, need_ref_logps=False, stop=()):
        self.prompts.append(prompts)
        self.stops.append(stop)
        turn = len(self.prompts) - 1
        completions = [self.script(turn, ex) for ex in examples]
        return Rollouts(group_ids=torch.arange(len(prompts)), action_mask=torch.ones(len(prompts), 3),
                        completions=completions, examples=list(examples),
                        payload={"prompt_ids": [torch.zeros(10 * (turn + 1)) for _ in prompts],
                                 "completion_ids": [torch.zeros(5) for _ in prompts]})


ZOOM_QA = make_task("zoom_qa")


def _task(**options):
    return make_task("zoom_qa", canvas_size=256, distractors=2, **options)


def zoom_then_answer(turn, ex):
    """Zoom on the target's frame (in the policy's coordinate frame), then answer right."""
    if turn == 0:
        return "<think>zoom</think>" + ZOOM_QA.zoom_call(ex)
    return f"<think>I see it.</think><answer>{ex['answer']}</answer>"


def test_turns_become_rows_and_the_tool_image_comes_back_as_the_next_turn():
    task = _task()
    assert is_episodic(task)
    specs = [task.examples("train")[i] for i in range(2)]
    policy = ScriptedPolicy(zoom_then_answer)
    rows = rollout_task(policy, task, specs, 2, "train")
    # 2 examples x 2 trajectories, each: a zoom turn, then the answer
    assert len(rows) == 8 and rows.group_ids.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert policy.stops == [("</tool_call>",)] * 2  # stop_at_call: generation ends at the call
    assert [ex["episode_id"] for ex in rows.examples] == [0, 1, 2, 3] * 2
    assert [ex["step_index"] for ex in rows.examples] == [0] * 4 + [1] * 4
    # the first turn's prompt: the tool list as a system message, then the image and question
    first = policy.prompts[0][0]
    assert first[0]["role"] == "system" and '"name": "zoom_in"' in first[0]["content"]
    # the second turn's prompt: the same start, the model's message, then the tool's image
    second = policy.prompts[1][0]
    assert second[:2] == first[:2]
    assert second[2] == {"role": "assistant", "content": zoom_then_answer(0, specs[0])}
    response = second[3]
    assert response["role"] == "user"
    assert [c.get("text") for c in response["content"]] == ["<tool_response>", None, "</tool_response>"]
    crop = response["content"][1]["image"]
    assert crop.size[0] * crop.size[1] >= 4 * 28 * 28  # DeepEyes' zoom: resized to its pixel range
    # every row of a trajectory carries the whole trajectory's record
    for ex in rows.examples:
        assert ex["turns"] == 2 and ex["over_turn"] is False
        assert ex["trajectory"] == (zoom_then_answer(0, ex) + "<tool_response><image></tool_response>"
                                    + zoom_then_answer(1, ex))
        [call] = ex["tool_calls"]
        assert call["ok"] and call["name"] == "zoom_in" and call["turn"] == 1
        assert call["box"] == pytest.approx(list(ex["target_box"]), abs=14)  # grown to >= 28 px sides
        assert ex["tool_budget"] == {"turns": 1, "pixels": crop.size[0] * crop.size[1], "tokens": 25, "refused": 0}
    # the metrics count trajectories, not rows; DeepEyes' reward scores every row's trajectory
    m = task.metrics(rows.completions, rows.examples)
    assert m["accuracy"] == 1.0 and m["turns"] == 2.0 and m["tool/over_turn"] == 0.0
    assert m["tool/calls"] == 1.0 and m["tool/rapr"] == 1.0
    scores = REWARDS.get("deepeyes_rule_judge")(rows.completions, rows.examples)
    assert scores == [pytest.approx(0.8 + 1.2)] * 8  # right, well formed, a tool image came back


def test_a_bad_call_is_read_by_the_model_and_the_budget_cuts_a_trajectory_that_keeps_calling():
    """Trajectory 0 writes malformed JSON, reads the error, then answers. Trajectory 1 calls a
    tool every turn: with max_turns=2 it runs two tool turns, its third call is refused and the
    trajectory ends there, over-turn; over_turn_masking zeroes its rows' action mask."""
    task = _task(max_turns=2, over_turn_masking=True)
    [spec] = [task.examples("train")[0]]

    def script(turn, ex):
        if ex["_trajectory"] == 0:
            return "<tool_call>{not json</tool_call>" if turn == 0 else f"<answer>{ex['answer']}</answer>"
        return call_text("zoom_in", {"bbox_2d": list(ex["target_box"])})

    counter = iter(range(100))

    class Tagging(ScriptedPolicy):
        def prepare_examples(self, examples):
            return [{**ex, "pred_space": "pixel", "_trajectory": next(counter)} for ex in examples]

    policy = Tagging(script)
    rows = rollout_task(policy, task, [spec], 2, "train")
    assert len(policy.prompts) == 3 and [len(p) for p in policy.prompts] == [2, 2, 1]
    error = policy.prompts[1][0][3]["content"][1]["text"]
    assert error.startswith("Error: the tool call is not valid JSON") and "A valid call looks like" in error
    by_traj = {}
    for i, ex in enumerate(rows.examples):
        by_traj.setdefault(ex["episode_id"], []).append(i)
    answered, looping = rows.examples[by_traj[0][0]], rows.examples[by_traj[1][0]]
    assert answered["over_turn"] is False and answered["turns"] == 2
    assert [c["ok"] for c in answered["tool_calls"]] == [False]
    assert looping["over_turn"] is True and looping["turns"] == 3
    assert [c["ok"] for c in looping["tool_calls"]] == [True, True, False]
    assert "limit of 2 tool turns" in looping["tool_calls"][-1]["error"]
    assert looping["tool_budget"]["turns"] == 2 and looping["tool_budget"]["refused"] == 1
    assert rows.action_mask[by_traj[1]].sum() == 0  # masked from the loss
    assert rows.action_mask[by_traj[0]].sum() == 6
    m = task.metrics(rows.completions, rows.examples)
    assert m["tool/over_turn"] == 0.5 and m["turns"] == 2.5 and m["accuracy"] == 0.5


def test_the_token_budget_ends_a_trajectory_and_no_tools_is_a_baseline():
    # conversation tokens after turn 0: 10 (prompt) + 5 = 15 >= 12: the call is refused, cut
    task = _task(max_tokens=12)
    rows = rollout_task(ScriptedPolicy(zoom_then_answer), task, [task.examples("train")[0]], 1, "train")
    [ex] = rows.examples
    assert ex["over_turn"] and ex["turns"] == 1 and "limit of 12 tokens" in ex["tool_calls"][0]["error"]
    # max_turns=0: no tool list in the prompt, one message per trajectory
    task = _task(max_turns=0)
    policy = ScriptedPolicy(lambda turn, ex: f"<answer>{ex['answer']}</answer>")
    rows = rollout_task(policy, task, [task.examples("train")[0]], 2, "train")
    assert len(rows) == 2 and policy.prompts[0][0][0]["role"] == "user"
    assert all(ex["turns"] == 1 and ex["tool_calls"] == [] for ex in rows.examples)


class Sleep(Tool):
    """Sleeps ``seconds``, then answers in text: a tool that can outlast the step time limit."""

    name = "test_sleep"
    example_arguments = {"seconds": 0.1}

    def __call__(self, arguments, state):
        time.sleep(float(arguments["seconds"]))
        return ToolObservation(text=f"slept {arguments['seconds']} s")


register_tool("test_sleep")(Sleep)


@pytest.mark.slow
def test_a_tool_turn_past_the_step_timeout_ends_only_its_trajectory():
    """Two trajectories of one example with step_timeout 0.2 s: trajectory 0 calls the tool for
    1 s, trajectory 1 for 0.01 s and then answers. The slow call is not waited for: trajectory 0
    ends at that turn, its call recorded as failed with the reason, ``episode_timed_out`` on its
    row, the budget as before the turn; trajectory 1 goes on unheld. Without a limit the 1 s call
    is waited for and the trajectory answers."""
    def script(turn, ex):
        if turn == 0:
            return call_text("test_sleep", {"seconds": 1.0 if ex["_trajectory"] == 0 else 0.01})
        return f"<answer>{ex['answer']}</answer>"

    def run(**options):
        counter = iter(range(100))

        class Tagging(ScriptedPolicy):
            def prepare_examples(self, examples):
                return [{**ex, "pred_space": "pixel", "_trajectory": next(counter)} for ex in examples]

        task = _task(tools={"test_sleep": {}}, **options)
        start = time.perf_counter()
        rows = rollout_task(Tagging(script), task, [task.examples("train")[0]], 2, "train")
        return task, rows, time.perf_counter() - start

    task, rows, seconds = run(step_timeout=0.2)
    assert seconds < 0.8  # the 1 s call was abandoned at 0.2 s
    assert task.loop_options().step_timeout == 0.2
    [slow] = [ex for ex in rows.examples if ex["episode_id"] == 0]  # one row: the trajectory ended there
    fast = [ex for ex in rows.examples if ex["episode_id"] == 1]
    assert slow["episode_timed_out"] is True and slow["turns"] == 1 and slow["over_turn"] is False
    assert slow["tool_calls"] == [{"turn": 1, "name": "test_sleep", "arguments": {"seconds": 1.0}, "ok": False,
                                   "error": "Error: the tool calls took longer than 0.2 s.", "box": None,
                                   "image_size": None}]
    assert slow["tool_budget"] == {"turns": 0, "pixels": 0, "tokens": 0, "refused": 0}
    assert slow["trajectory"] == script(0, {"_trajectory": 0})
    assert len(fast) == 2 and not fast[0]["episode_timed_out"] and fast[0]["tool_calls"][0]["ok"]
    assert fast[0]["tool_budget"]["turns"] == 1
    time.sleep(1.0)  # the abandoned call finishes in its thread: the record it left stays as it was
    assert slow["tool_calls"][0]["ok"] is False and slow["tool_budget"]["turns"] == 0
    m = task.metrics(rows.completions, rows.examples)
    assert m["tool/timeouts"] == 0.5 and m["accuracy"] == 0.5 and m["turns"] == 1.5
    task, rows, seconds = run()
    assert seconds >= 1.0 and not any(ex["episode_timed_out"] for ex in rows.examples)
    assert task.metrics(rows.completions, rows.examples)["tool/timeouts"] == 0.0


def test_options_are_checked():
    for bad in (-1, "1", True, float("inf")):
        with pytest.raises(ValueError, match=r"zoom_qa: step_timeout must be a number of seconds >= 0"):
            _task(step_timeout=bad)
    with pytest.raises(ValueError, match="there is no tool|unknown|not registered|no tool"):
        _task(tools={"teleport": {}})
    with pytest.raises(ValueError, match="max_turns must be an int >= 0"):
        _task(max_turns=-1)
    with pytest.raises(ValueError, match="over_turn_masking must be true or false"):
        _task(over_turn_masking="yes")


def test_trajectory_grpo_takes_each_trajectorys_reward_once():
    """Two trajectories of one prompt: A has 2 rows scoring 2.0 each, B 1 row scoring 0.0. With
    the final-step return R(A) = 2, R(B) = 0: A = +1/sqrt(2) per row of A (mean 1, unbiased std
    sqrt(2)), B = -1/sqrt(2). The sum return would give A a return of 4."""
    rewards = torch.tensor([2.0, 2.0, 0.0])
    kwargs = dict(group_ids=torch.tensor([0, 0, 0]), episode_ids=torch.tensor([0, 0, 1]),
                  step_indices=torch.tensor([0, 1, 0]), eps=0.0)
    final = episode_grpo(rewards, episode_return="final", **kwargs)
    assert torch.allclose(final, torch.tensor([1.0, 1.0, -1.0]) / 2 ** 0.5, atol=1e-6)
    summed = episode_grpo(rewards, **kwargs)
    assert torch.allclose(summed, torch.tensor([1.0, 1.0, -1.0]) / 2 ** 0.5, atol=1e-6)  # normalised alike here
    uneven = torch.tensor([1.0, 2.0, 2.0, 0.0])  # final: A -> 2, B -> 2 (its step 1): no spread, all 0
    k2 = dict(group_ids=torch.zeros(4, dtype=torch.long), episode_ids=torch.tensor([0, 0, 1, 1]),
              step_indices=torch.tensor([0, 1, 1, 0]))
    assert episode_grpo(uneven, episode_return="final", **k2).tolist() == [0.0] * 4
    assert episode_grpo(uneven, **k2).abs().sum() > 0  # sums 3 and 2 differ
    with pytest.raises(ValueError, match="episode_return must be one of"):
        episode_grpo(rewards, episode_return="last", **kwargs)


def test_curiosity_counts_a_trajectory_once_not_per_turn():
    """Group of 3 trajectories: one used a tool over 3 turn rows, two did not. RaPR = 1/3, not
    3/5: the curiosity bonus is max(0.5 - 1/3, 0) on the tool rows."""
    used = {"episode_id": 0, "tool_calls": [{"ok": True, "turn": 1}]}
    rows = [used, used, used, {"episode_id": 1}, {"episode_id": 2}]
    out = REWARDS.get("pixel_reasoner_curiosity")([""] * 5, rows, threshold=0.5, group_ids=[0] * 5)
    assert out == pytest.approx([0.5 - 1 / 3] * 3 + [0.0, 0.0])


def test_episode_metrics_report_only_what_the_rows_carry():
    rows = Rollouts(group_ids=torch.zeros(2, dtype=torch.long), action_mask=torch.ones(2, 1),
                    completions=["a", "b"], examples=[{"episode_id": 0, "step_index": 0, "turns": 2},
                                                      {"episode_id": 0, "step_index": 1, "turns": 2}])
    assert episode_metrics(rows) == {}


# -- the real tiny VLM: the mask against one interleaved sequence, and a training step -------------
def _tiny_policy(path, *overrides):
    from conftest import make_config
    from mmrl.vlm.policy import VLMPolicy

    return VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", "rollout.max_completion_length=256",
                                 *overrides))


def _scripted(policy, script):
    """``policy`` whose rollouts teacher-force ``script(turn, example)`` as on-policy samples (the
    random tiny model never writes a tool call by itself); everything else is the real policy's."""
    calls = []

    def rollout(examples, prompts, n, mode, need_old_logps=False, need_ref_logps=False, stop=()):
        turn = len(calls)
        calls.append(prompts)
        batch = policy.rollout_given(examples, prompts, [script(turn, ex) for ex in examples],
                                     need_old_logps, need_ref_logps, stop=stop)
        batch.off_policy = None
        return batch

    policy.rollout = rollout
    return policy


def test_turn_rows_are_the_model_tokens_of_the_interleaved_sequence(random_tiny_dir):
    """A hand-built trajectory (zoom call, the crop, the answer): in the one interleaved sequence
    of the whole conversation, each turn row's prompt is a prefix and its completion the tokens
    right after it, so the model's tokens sit exactly there and every other token (the tool's
    response, its image) is context. The rows' log-probs equal that sequence's log-probs at those
    positions (float32), and the action mask counts exactly the model's tokens."""
    from mmrl.tools.interaction import conversation

    policy = _scripted(_tiny_policy(random_tiny_dir), zoom_then_answer)
    task = _task(tools_in_prompt=False)
    rows = rollout_task(policy, task, [task.examples("eval")[0]], 1, "train", need_old_logps=True)
    assert len(rows) == 2 and not rows.truncated.any()
    ex = rows.examples[0]
    assert [c["ok"] for c in ex["tool_calls"]] == [True]
    turn0, turn1 = zoom_then_answer(0, ex), zoom_then_answer(1, ex)
    first = policy.prepare_examples([task.examples("eval")[0]])[0]
    from mmrl.tools import ToolBudget, ToolState, run_turn
    obs, _ = run_turn(turn0, task.make_tools(), ToolState([first["image"]], first), ToolBudget())
    whole = conversation(task, first, [(turn0, obs)]) + [{"role": "assistant", "content": turn1}]
    enc, _ = policy.encode_prompts([whole])
    ids = enc["input_ids"][0]
    with torch.no_grad():
        logits = policy.module(**{k: v for k, v in enc.items()}).logits.float()[0]
    # the distribution the policy samples from: the vision tokens it never writes are banned
    logits[:, sorted(policy.suppressed_ids)] = float("-inf")
    token_logps = torch.log_softmax(logits[:-1] / policy.cfg.rollout.temperature, -1).gather(-1, ids[1:, None])[:, 0]
    mask = torch.zeros(len(ids))
    for row in range(2):
        p, c = rows.payload["prompt_ids"][row], rows.payload["completion_ids"][row]
        assert torch.equal(ids[:len(p) + len(c)], torch.cat([p, c])), f"turn {row} is not a prefix"
        mask[len(p):len(p) + len(c)] = 1
        n = int(rows.action_mask[row].sum())
        assert n == len(c)
        assert torch.allclose(rows.old_logps[row, :n], token_logps[len(p) - 1:len(p) - 1 + n], atol=1e-5)
    # the tool's response (its tags and image) lies between the turns, all of it context
    between = ids[len(rows.payload["prompt_ids"][0]) + len(rows.payload["completion_ids"][0]):
                  len(rows.payload["prompt_ids"][1])]
    pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (between == pad).sum() > 0 and mask.sum() == rows.action_mask.sum()


@pytest.mark.slow
def test_a_training_step_on_tool_rows_moves_the_weights(random_tiny_dir, tmp_path):
    """The trainer on zoom_qa with trajectory-level GRPO: each prompt's two trajectories differ
    (one answers right after zooming, one wrong without), so the rows get non-zero advantages and
    one update changes the weights; the metrics and rewards count trajectories."""
    from conftest import make_config
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy

    cfg = make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "task.name=zoom_qa",
                      "task.options.canvas_size=256", "task.options.distractors=2", "task.options.tools_in_prompt=false",
                      "algo.advantage=episode_grpo", "algo.advantage_kwargs.episode_return=final",
                      "train.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_completion_length=256",
                      "train.learning_rate=1e-3", "train.steps=1", "eval.before=false", f"log.output_dir={tmp_path}",
                      "log.progress=false", "log.save_rollouts_every=0")
    counter = iter(range(1000))

    def script(turn, ex):
        if ex["_k"] % 2 == 0:
            return zoom_then_answer(turn, ex)
        return "<think>guess</think><answer>x</answer>"

    policy = VLMPolicy(cfg)
    real_prepare = policy.prepare_examples
    policy.prepare_examples = lambda exs: [{**e, "_k": next(counter)} for e in real_prepare(exs)]
    _scripted(policy, script)
    trainer = Trainer(cfg, policy)
    policy.configure_optimizer(cfg.train, cfg.train.steps)
    before = {n: p.detach().clone() for n, p in policy.module.named_parameters() if p.requires_grad}
    batch, metrics = trainer.rollout_step(0)
    assert len(batch) == 6  # per prompt: a 2-turn and a 1-turn trajectory
    assert metrics["accuracy"] == 0.5 and metrics["turns"] == 1.5 and metrics["tool/right_with_tool"] == 1.0
    # with several processes the metrics read the gathered batch: the task's metric keys travel in it
    from mmrl.core.batch.whole import light

    task = trainer.task
    assert task.rollout_metrics(light(batch, task.metric_keys)) == task.rollout_metrics(batch)
    assert task.rollout_metrics(light(batch))["accuracy"] == 0.0  # what 2 processes logged before
    adv = batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0]
    right = torch.tensor([ex["_k"] % 2 == 0 for ex in batch.examples])
    assert (adv[right] > 0).all() and (adv[~right] < 0).all()
    trainer.update(batch, 0)
    moved = sum(not torch.equal(before[n], p) for n, p in policy.module.named_parameters() if n in before)
    assert moved > 0


# -- the grid layout, zoom_cell and the warm start's turn examples -----------------------------------
def _grid_task(**options):
    return make_task("zoom_qa", canvas_size=448, grid=4, glyph_scale=3, distractors=7, thinking=False,
                     tools={"zoom_cell": {"grid": 4}}, tools_in_prompt=False, max_turns=1, **options)


def test_zoom_cell_returns_the_named_cell_and_refuses_other_names():
    from PIL import Image

    from mmrl.tools import ToolArgumentError, ToolState, cell_name, make_tool

    image = Image.new("RGB", (448, 400))
    tool = make_tool("zoom_cell", grid=4)
    obs = tool({"cell": "b3"}, ToolState([image]))
    assert obs.box == (224, 100, 336, 200) and obs.image.size == (112, 100)  # row B, column 3
    assert cell_name((230, 120, 250, 150), 4, 448, 400) == "B3"
    for bad in ("E1", "A5", "A0", "3B", "", None, 7):
        with pytest.raises(ToolArgumentError, match="must name a cell of the 4x4 grid"):
            tool({"cell": bad}, ToolState([image]))
    small = Image.new("RGB", (112, 112))  # a 28 px cell, resized up to min_pixels as zoom_in resizes
    assert make_tool("zoom_cell", grid=4, min_pixels=112 * 112)({"cell": "A1"}, ToolState([small])).image.size == (112, 112)


def test_grid_layout_one_digit_per_cell_and_the_reference_zooms_on_the_targets_cell():
    from mmrl.tools import ToolBudget, ToolState, cell_name, run_turn

    task = _grid_task()
    for i in range(5):
        ex = task.examples("train")[i]
        boxes = [ex["target_box"], *ex["distractor_boxes"]]
        cells = [cell_name(b, 4, 448, 448) for b in boxes]
        assert len(boxes) == 8 and len(set(cells)) == 8  # one framed digit per cell
        for b, c in zip(boxes, cells):  # each frame lies inside its cell
            r, col = "ABCD".index(c[0]), int(c[1]) - 1
            assert col * 112 <= b[0] and b[2] <= (col + 1) * 112 and r * 112 <= b[1] and b[3] <= (r + 1) * 112
        call, answer = task.reference_turns(ex)
        assert answer == f"<answer>{ex['answer']}</answer>"
        obs, [rec] = run_turn(call, task.make_tools(), ToolState([ex["image"]], ex), ToolBudget())
        x1, y1, x2, y2 = rec["box"]
        t = ex["target_box"]
        assert rec["ok"] and x1 <= t[0] and t[2] <= x2 and y1 <= t[1] and t[3] <= y2


def test_the_warm_starts_turn_examples_replay_the_reference_trajectory():
    """reference_look_rate 0.5: by the example's id, some references zoom then answer, the others
    answer at once. Turn example 2k is turn 0 of example k, 2k + 1 its turn 1 (or turn 0 again for
    a one-turn reference); the second turn's prompt holds the call and the cell's image."""
    task = _grid_task(reference_look_rate=0.5)
    turns = task.sft_examples("train")
    assert len(turns) == 2 * len(task.examples("train"))
    looked = 0
    for k in range(20):
        ex = task.examples("train")[k]
        first, second = turns[2 * k], turns[2 * k + 1]
        if task.looks(ex):
            looked += 1
            assert task.target(first).startswith("<tool_call>") and task.target(second) == f"<answer>{ex['answer']}</answer>"
            messages = task.build_prompt(second)
            assert [m["role"] for m in messages] == ["user", "assistant", "user"]
            assert messages[1]["content"] == task.target(first)
            assert messages[2]["content"][1]["image"].size == (112, 112)
        else:
            assert task.target(first) == task.target(second) == f"<answer>{ex['answer']}</answer>"
            assert [m["role"] for m in task.build_prompt(second)] == ["user"]
    assert 5 <= looked <= 15


def test_the_picture_shows_the_crop_on_the_image_and_the_zoomed_view_beside_it():
    task = _grid_task()
    ex = task.examples("eval")[0]
    rows = rollout_task(ScriptedPolicy(lambda turn, e: task.reference_turns(e)[turn]), task, [ex], 1, "eval")
    picture = task.visualize(rows.examples[-1], rows.completions[-1])
    assert picture.height >= 448 and picture.width > picture.height  # the canvas, then the zoomed cell
    x1, y1, x2, y2 = (int(v) for v in rows.examples[-1]["tool_calls"][0]["box"])
    right = picture.crop((picture.width - (picture.width - 452), 0, picture.width, picture.height))
    cell = ex["image"].crop((x1, y1, x2, y2)).resize(right.size)
    assert right.getcolors(1 << 16) and sorted(right.getcolors(1 << 16))[-1][1] == sorted(cell.getcolors(1 << 16))[-1][1]
    assert task.visualize({**rows.examples[-1], "tool_calls": []}, "").size == ex["image"].size


def test_a_saved_rollout_shows_the_turn_the_trajectory_and_its_calls():
    task = _task()
    rows = rollout_task(ScriptedPolicy(zoom_then_answer), task, [task.examples("train")[0]], 1, "train")
    first = task.record(rows.examples[0], rows.completions[0])
    assert first["turn"] == 0 and first["trajectory"] == rows.examples[0]["trajectory"]
    assert [c["name"] for c in first["tool_calls"]] == ["zoom_in"] and first["tool_calls"][0]["ok"]
    assert "box" not in first["tool_calls"][0] and first["answer"] == rows.examples[0]["answer"]
