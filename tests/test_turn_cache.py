"""The turn cache (mmrl/vlm/turn_cache.py): a trajectory's next turn reuses the keys/values of the
conversation so far, and changes nothing but the work done.

On the tiny zoom model, 3-turn zoom trajectories (a zoom after each of the first two messages, so
every later prompt holds a new tool image) run through the agent loop with the cache and with
``rollout.turn_cache=false``: the same completions (greedy, and sampled from one seed), and each
turn's log-probs equal a one-pass forward of the whole conversation (float32, 1e-5); with the cache
most prompt tokens of the later turns are taken from the store. The store's matching is checked on
hand-built sequences (an image that differs, or that the prefix would cut, ends the reuse)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrl import make_task
from mmrl.core.agent_loop import LoopOptions, Reply, run_agent_loop
from mmrl.registry import load_plugins
from mmrl.tools import run_turn
from mmrl.tools.interaction import ToolConversation, conversation
from mmrl.vlm.turn_cache import Entry, Image, Tokens, TurnStore, cached_width

load_plugins()
ZOOM = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl-zoom"
OPTIONS = dict(canvas_size=224, grid=2, detail="pattern", pattern_size=80, distractors=3, distractor_pattern="same",
               thinking=False, tools={"zoom_cell": {"grid": 2}}, tools_in_prompt=False)


class ZoomEveryTurn(ToolConversation):
    """The zoom call runs after each of the first ``looks`` messages whatever they say (the tiny
    model seldom calls twice), so every trajectory has ``looks + 1`` turns."""

    looks = 2

    def answer(self, batch, row):
        text = batch.completions[row]
        if len(self.turns) == self.looks:
            self.turns.append((text, []))
            return Reply(done=True)
        observations, _ = run_turn(self.task.zoom_call(self.example), self.tools, self.state, self.budget, 3)
        self.turns.append((text, observations))
        return Reply()


def _policy(turn_cache: bool, temperature: float, *overrides: str):
    from conftest import make_config
    from mmrl.vlm.policy import VLMPolicy

    return VLMPolicy(make_config(f"model.path={ZOOM}", "train.device=cpu", "rollout.max_completion_length=16",
                                 f"rollout.temperature={temperature}", f"rollout.turn_cache={str(turn_cache).lower()}",
                                 *overrides))


def _trajectories(policy, task, reused: list | None = None):
    """Two trajectories of each of two examples; ``reused`` collects (reused, prompt tokens) per call."""
    specs = [task.examples("eval")[i] for i in range(2)]
    interactions = [ZoomEveryTurn(task, ex) for ex in policy.prepare_examples([e for e in specs for _ in range(2)])]
    if reused is not None:
        _count_reuse(policy, reused)
    torch.manual_seed(0)
    rows = run_agent_loop(policy, interactions, 2, LoopOptions(max_turns=3), "train", need_old_logps=True)
    return rows, interactions


def _count_reuse(policy, reused: list) -> None:
    """Record, per generate call, the prompt tokens the store held and all prompt tokens."""
    engine = policy.engine
    real = engine.prefilled

    def counted(turns, inputs, rows, gen_kwargs):
        matches = turns.match(rows, [len(r.ids) - 1 for r in rows])
        reused.append((sum(m for _, m in matches), sum(len(r.ids) for r in rows)))
        return real(turns, inputs, rows, gen_kwargs)

    engine.prefilled = counted


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_turns_with_the_cache_sample_and_score_as_without(temperature):
    task = make_task("zoom_qa", **OPTIONS)
    reused: list = []
    cached, _ = _trajectories(_policy(True, temperature), task, reused)
    whole, _ = _trajectories(_policy(False, temperature), task)
    assert len(cached) == 12  # 4 trajectories x 3 turns
    assert cached.completions == whole.completions
    for a, b in zip(cached.payload["prompt_ids"] + cached.payload["completion_ids"],
                    whole.payload["prompt_ids"] + whole.payload["completion_ids"]):
        assert torch.equal(a, b)
    assert torch.allclose(cached.old_logps, whole.old_logps, atol=1e-5)
    # the first turn has nothing to reuse; each later one takes most of its prompt from the store
    assert reused[0][0] == 0 and len(reused) == 3
    for hit, total in reused[1:]:
        assert hit > 0.6 * total, reused


@pytest.mark.slow
def test_a_three_turn_trajectory_scores_as_one_pass_of_the_whole_conversation():
    """Each turn's rows (log-probs under the cache-generated completions) equal a one-pass
    forward of the trajectory's whole conversation at the model's tokens, float32, 1e-5 (greedy:
    rollout.temperature=0 scores unscaled logits)."""
    task = make_task("zoom_qa", **OPTIONS)
    policy = _policy(True, 0.0)
    rows, interactions = _trajectories(policy, task)
    for e, it in enumerate(interactions):
        mine = [r for r in range(len(rows)) if rows.examples[r]["episode_id"] == e]
        assert len(mine) == 3
        *before, (last, _) = it.turns
        whole = conversation(task, it.example, before) + [{"role": "assistant", "content": last}]
        enc, _ = policy.encode_prompts([whole])
        ids = enc["input_ids"][0]
        with torch.no_grad():
            logits = policy.module(**enc).logits.float()[0]
        logits[:, sorted(policy.suppressed_ids)] = float("-inf")  # never sampled, masked when scoring
        logps = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
        for r in mine:
            p, c = rows.payload["prompt_ids"][r], rows.payload["completion_ids"][r]
            n = len(c)
            if r != mine[-1]:  # the last message ends the conversation: its tokens are the text's
                assert torch.equal(ids[:len(p) + n], torch.cat([p, c]))
            assert torch.allclose(rows.old_logps[r, :n], logps[len(p) - 1:len(p) - 1 + n], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_groups_prompt_is_computed_once_and_samples_as_without(temperature):
    """rollout.group_prefill: 3 prompts x 4 samples give the completions (greedy, and sampled from one
    seed) and old log-probs of the plain generate, and the language model reads 9 prompts fewer:
    the plain call feeds 12 rows of W prompt columns, then one token a row per later step; the
    shared one 3 rows of W - 1 columns, then each row's last prompt column, then the same steps."""
    task = make_task("zoom_qa", **OPTIONS)
    batches, fed, width = {}, {}, {}
    for share in (True, False):
        policy = _policy(False, temperature, f"rollout.group_prefill={str(share).lower()}")
        examples = policy.prepare_examples([task.examples("eval")[i] for i in range(3)])
        prompts = [task.prompt(e) for e in examples]
        width[share] = policy.encode_prompts([p for p in prompts for _ in range(4)])[0]["input_ids"].shape[1]
        shapes = []
        hook = policy.module.model.language_model.register_forward_hook(
            lambda _m, _args, kwargs, _out: shapes.append(kwargs["inputs_embeds"].shape[:2]), with_kwargs=True)
        torch.manual_seed(0)
        batches[share] = policy.rollout(examples, prompts, 4)
        hook.remove()
        fed[share] = sum(rows * columns for rows, columns in shapes)
        batches[share].old_logps = policy.score(batches[share], reference=False)
    shared, plain = batches[True], batches[False]
    assert shared.completions == plain.completions and len(set(plain.completions)) > 3 * (temperature > 0)
    assert torch.allclose(shared.old_logps, plain.old_logps, atol=1e-5)
    W = width[True]
    assert fed[False] - fed[True] == 12 * W - (3 * (W - 1) + 12) == 9 * (W - 1)


@pytest.mark.slow
def test_the_cache_is_open_only_inside_the_agent_loop():
    policy = _policy(True, 0.0)
    assert "turn_cache" in policy.capabilities and policy.engine.turns is None
    with policy.turn_cache():
        assert policy.engine.turns is not None
    assert policy.engine.turns is None
    with _policy(False, 0.0).turn_cache() as _:
        pass
    off = _policy(False, 0.0)
    with off.turn_cache():
        assert off.engine.turns is None  # rollout.turn_cache=false: every turn reads it all


# -- the store's matching, by hand -----------------------------------------------------------------
def _image(start, value, tokens=4):
    return Image(start, start + tokens, torch.full((16, 3), float(value)), torch.tensor([1, 4, 4]))


def _entry(ids, images):
    tokens = Tokens(torch.tensor(ids), images)
    kv = [torch.arange(len(ids), dtype=torch.float32).view(1, -1, 1)]
    return Entry(tokens, kv, kv)


def test_the_store_reuses_the_longest_prefix_with_the_same_images():
    # ids: 1 2 [9 9 9 9] 3 4 5 -- an image (placeholders 9) at positions 2..5
    store = TurnStore()
    same = _entry([1, 2, 9, 9, 9, 9, 3, 4, 5], [_image(2, 0.5)])
    other = _entry([1, 2, 9, 9, 9, 9, 3, 4, 5, 6], [_image(2, 0.25)])  # longer, but another image
    store.entries = [other, same]
    query = Tokens(torch.tensor([1, 2, 9, 9, 9, 9, 3, 4, 5, 6, 7]), [_image(2, 0.5)])
    [(entry, length)] = store.match([query], [10])
    assert entry is same and length == 9  # all of `same`; `other`'s image differs from position 2
    # a prefix that would cut the image stops before it
    short = _entry([1, 2, 9, 9], [])
    store.entries = [short]
    assert store.match([query], [10]) == [(short, 2)]
    # the limit (the prompt's last token is always fed) caps the reuse
    store.entries = [same]
    assert store.match([query], [5])[0][1] == 2


def test_the_cached_columns_do_not_cut_an_image():
    # two rows left-padded by 0 and 3; row 1's image sits at its tokens 1..4 (columns 4..7)
    rows = [Tokens(torch.zeros(10), []), Tokens(torch.zeros(7), [_image(1, 0.0)])]
    assert cached_width(rows, [0, 3], [8, 4]) == 4  # min(0 + 8, 3 + 4) = 7 cuts row 1's image: its start, 3 + 1
    assert cached_width(rows, [0, 3], [5, 6]) == 4  # min(5, 9) = 5 cuts it too
    assert cached_width(rows, [0, 3], [3, 8]) == 3  # min(3, 11) = 3: row 1's image lies after column 3
    assert cached_width(rows, [0, 3], [9, 7]) == 9  # min(9, 10) = 9: the image (columns 4..7) lies before
