"""Scoring trajectories that call tools ("thinking with images"): the trajectory record, DeepEyes'
reward, the grounding of crops, Pixel Reasoner's curiosity terms and tool-use metrics.

**The trajectory record** (written by the multi-turn rollout engine on each example it rolls out,
read by the rewards here; :func:`mmrl.tools.run_turn` builds the records):

- ``ex["trajectory"]``: the whole trajectory as text: the assistant turns in order, each tool
  turn between them marked ``<tool_response>...</tool_response>`` (an image as ``<image>``, an
  error observation as its text). The agent loop (:mod:`mmrl.tools.interaction`) makes every
  turn a row whose completion is that turn alone, so the scores here read ``ex["trajectory"]``
  when it is there (:func:`trajectory_of`) and the completion otherwise;
- ``ex["tool_calls"]``: one dict per call, in order, with the keys of
  :data:`mmrl.tools.RECORD_KEYS`: ``turn`` (1, 2, ...), ``name`` (None when unreadable),
  ``arguments`` (dict or None), ``ok`` (the tool ran and its observation was returned), ``error``
  (the error observation's text, or None), ``box`` (for crop tools: the region shown, original
  pixels ``[x1, y1, x2, y2]``, else None), ``image_size`` (``[w, h]`` of a returned image, else None);
- ``ex["tool_budget"]`` (optional): :meth:`mmrl.tools.ToolBudget.summary`;
- for grounding: ``ex["target_box"]`` (one box) or ``ex["target_boxes"]`` (several), original pixels.

An example with no ``tool_calls`` is a trajectory that called no tool (a single-turn completion).
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from mmrl.measures.boxes import box_iou
from mmrl.parsing import answer_correct, normalize

# DeepEyes' reward weights (verl/utils/reward_score/vl_agent.py, compute_score, "reward 2")
DEEPEYES_ACC, DEEPEYES_FORMAT, DEEPEYES_TOOL = 0.8, 0.2, 1.2
DEEPEYES_MAX_ANSWER = 1000  # an answer of 1000+ characters scores 0 and is a format error
# Pixel Reasoner's constants (its released code, experience_maker.py, for images): H, alpha, N, beta
CURIOSITY_H, CURIOSITY_ALPHA, PENALTY_N, PENALTY_BETA = 0.3, 0.5, 1, 0.05
_LETTER_RE = re.compile(r"^\(?([A-Za-z])\)?(?:[.:)]\s*(.*))?$", re.DOTALL)


def tool_calls_of(ex: Any) -> list[dict]:
    """``ex["tool_calls"]`` (the records of a trajectory), [] when the example has none."""
    calls = ex.get("tool_calls") if isinstance(ex, dict) else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, (list, tuple)) else []


def trajectory_of(completion: Any, ex: Any) -> Any:
    """The trajectory's whole text: ``ex["trajectory"]`` (a row of a multi-turn rollout) or the
    completion itself (a trajectory given as one text)."""
    text = ex.get("trajectory") if isinstance(ex, dict) else None
    return text if isinstance(text, str) else completion


def images_returned(ex: Any) -> int:
    """How many tool images the trajectory got back (DeepEyes counts the vision blocks of its
    tool responses, one per returned image)."""
    return sum(1 for c in tool_calls_of(ex) if c.get("ok") and c.get("image_size") is not None)


def operations(ex: Any) -> int:
    """n_vo: the visual operations (tool calls) a trajectory made, failed ones included."""
    return len(tool_calls_of(ex))


def crop_boxes(ex: Any) -> list[tuple[float, ...]]:
    """The regions of the successful crop calls, in order (original pixels)."""
    out = []
    for c in tool_calls_of(ex):
        box = c.get("box")
        if c.get("ok") and isinstance(box, (list, tuple)) and len(box) == 4:
            out.append(tuple(float(v) for v in box))
    return out


# -- DeepEyes -----------------------------------------------------------------------------------
def option_letter_answer(pred: str, options: Sequence[str]) -> Optional[str]:
    """The option a multiple-choice answer names by letter ("B", "(B)", "B. red"), or None."""
    m = _LETTER_RE.match(pred.strip())
    if m is None:
        return None
    i = ord(m.group(1).upper()) - ord("A")
    return str(options[i]) if 0 <= i < len(options) else None


def rule_judge(pred: str, truth: Any, options: Optional[Sequence[str]] = None) -> float:
    """mmrl's rule in place of DeepEyes' LLM judge: 1.0 when the answer equals the ground truth
    after normalisation (numbers as numbers, :func:`mmrl.parsing.answer_correct`), or names by
    letter the option that is the ground truth; else 0.0. DeepEyes asks Qwen2.5-72B-Instruct
    whether the two answers are "consistent" ('pink' vs 'it is pink' counts); the rule is stricter."""
    if truth is None:
        return 0.0
    if answer_correct(pred, truth):
        return 1.0
    if options:
        named = option_letter_answer(pred, options)
        if named is not None and normalize(named) == normalize(str(truth)):
            return 1.0
    return 0.0


def deepeyes_answer(completion: Any, ex: dict) -> Optional[str]:
    """The answer DeepEyes' ``compute_score`` judges: ``text.split("<answer>")[-1].split("</answer>")[0]``
    of the whole trajectory, stripped; None without a ground truth or text."""
    completion = trajectory_of(completion, ex)
    if not isinstance(ex, dict) or ex.get("answer") is None or not isinstance(completion, str):
        return None
    return completion.split("<answer>")[-1].split("</answer>")[0].strip()


def deepeyes_parts(completion: Any, ex: dict, accuracy: Optional[float] = None) -> Optional[dict[str, float]]:
    """DeepEyes' ``compute_score`` (verl/utils/reward_score/vl_agent.py): its accuracy, format and
    tool terms for one trajectory, accuracy by :func:`rule_judge` unless ``accuracy`` gives a judge's
    verdict on :func:`deepeyes_answer` (DeepEyes' LLM judge: the ``deepeyes`` reward). None without
    a ground truth (``ex["answer"]``).

    format error: unequal counts of ``<think>`` and ``</think>`` in the trajectory; unequal counts
    of ``<answer>`` and ``</answer>`` after the last ``</think>``; an answer of 1000+ characters
    (which also scores accuracy 0). The answer is ``text.split("<answer>")[-1].split("</answer>")[0]``,
    stripped (with no answer tag: the whole text). DeepEyes' third check, unequal counts of
    vision-start and vision-end markers, tests its own decoding and has no counterpart here.
    tool: 1 when the answer is right (accuracy > 0.5) and a tool image came back.

    verl's port (``recipe/deepeyes/deepeyes.py``) differs: it takes the first answer block, calls a
    missing one a format error and falls back to other text, and detects tool use by the
    ``<tool_call>`` / ``<tool_response>`` tags; this follows DeepEyes' own repository."""
    truth = ex.get("answer") if isinstance(ex, dict) else None
    completion = trajectory_of(completion, ex)
    if truth is None or not isinstance(completion, str):
        return None
    error = completion.count("<think>") != completion.count("</think>")
    after_think = completion.split("</think>")[-1].strip()
    error |= after_think.count("<answer>") != after_think.count("</answer>")
    answer = deepeyes_answer(completion, ex)
    if accuracy is None:  # else the judge's verdict on this answer (the ``deepeyes`` reward's LLM judge)
        accuracy = rule_judge(answer, truth, ex.get("options"))
    if len(answer) >= DEEPEYES_MAX_ANSWER:
        accuracy, error = 0.0, True
    tool = 1.0 if images_returned(ex) > 0 and accuracy > 0.5 else 0.0
    return {"accuracy": accuracy, "format": -1.0 if error else 0.0, "tool": tool}


def deepeyes_total(parts: dict[str, float]) -> float:
    """0.8 * accuracy + 0.2 * format + 1.2 * tool of :func:`deepeyes_parts`, in [-0.2, 2.0]."""
    return DEEPEYES_ACC * parts["accuracy"] + DEEPEYES_FORMAT * parts["format"] + DEEPEYES_TOOL * parts["tool"]


def deepeyes_score(completion: Any, ex: dict) -> Optional[float]:
    """DeepEyes' reward with the rule as judge (:func:`deepeyes_total` of :func:`deepeyes_parts`)."""
    parts = deepeyes_parts(completion, ex)
    return None if parts is None else deepeyes_total(parts)


# -- grounding of crops (mmrl's own measure) ----------------------------------------------------
def target_boxes(ex: Any) -> list[tuple[float, ...]]:
    """The annotated target region(s) of an example: ``target_boxes`` or ``target_box``."""
    if not isinstance(ex, dict):
        return []
    boxes = ex.get("target_boxes")
    if boxes is None and ex.get("target_box") is not None:
        boxes = [ex["target_box"]]
    out = []
    for b in boxes or []:
        if isinstance(b, (list, tuple)) and len(b) == 4:
            out.append(tuple(float(v) for v in b))
    return out


def crop_iou(ex: Any, which: str = "best") -> Optional[float]:
    """IoU of the trajectory's crop regions with the target region(s): the best crop (``best``)
    or the last one (``last``), against its best-matching target; 0.0 with no successful crop,
    None for an example with no target."""
    if which not in ("best", "last"):
        raise ValueError(f"crop_iou: which must be 'best' or 'last', got {which!r}")
    targets = target_boxes(ex)
    if not targets:
        return None
    crops = crop_boxes(ex)
    if not crops:
        return 0.0
    crops = crops if which == "best" else crops[-1:]
    return max(box_iou(c, t) for c in crops for t in targets)


# -- Pixel Reasoner's curiosity-driven reward ----------------------------------------------------
def _groups(group_ids, n: int) -> list:
    if group_ids is None:
        return [0] * n
    try:  # a tensor or array of ids
        ids = list(group_ids.tolist())
    except AttributeError:
        ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"{len(ids)} group ids for {n} completions")
    return [tuple(g) if isinstance(g, list) else g for g in ids]


def rapr(examples: Sequence[Any], group_ids=None) -> list[float]:
    """RaPR(x) of each sample's group: the share of the group's trajectories that made at least
    one visual operation. Without ``group_ids`` the batch is one group. The rows of one trajectory
    (a multi-turn rollout's turns, which share ``episode_id``) count once."""
    groups = _groups(group_ids, len(examples))
    used: dict = {}
    for i, (g, ex) in enumerate(zip(groups, examples)):
        trajectory = ex.get("episode_id", ("row", i)) if isinstance(ex, dict) else ("row", i)
        used.setdefault(g, {})[trajectory] = 1.0 if operations(ex) > 0 else 0.0
    return [sum(used[g].values()) / len(used[g]) for g in groups]


def curiosity_terms(examples: Sequence[Any], group_ids=None, threshold: float = CURIOSITY_H) -> list[float]:
    """r_curiosity = max(H - RaPR(x), 0) * 1[y made a visual operation], per sample."""
    return [max(threshold - r, 0.0) * (1.0 if operations(ex) > 0 else 0.0)
            for r, ex in zip(rapr(examples, group_ids), examples)]


def overuse(ex: Any, limit: int = PENALTY_N) -> float:
    """max(n_vo - N, 0): the visual operations beyond N; Pixel Reasoner's
    r_penalty = min(N - n_vo, 0) is its negative."""
    return float(max(operations(ex) - limit, 0))


def tool_use_metrics(examples: Sequence[Any]) -> dict[str, float]:
    """Per batch: ``tool/rapr`` (share of trajectories with a tool call), ``tool/calls`` (calls per
    trajectory), ``tool/error_rate`` (failed calls / calls), ``tool/images`` (tool images per
    trajectory), ``tool/turns`` (tool turns per trajectory)."""
    n = max(1, len(examples))
    calls = [tool_calls_of(ex) for ex in examples]
    total = sum(len(c) for c in calls)
    return {
        "tool/rapr": sum(1.0 for c in calls if c) / n,
        "tool/calls": total / n,
        "tool/error_rate": sum(1 for cs in calls for c in cs if not c.get("ok")) / max(1, total),
        "tool/images": sum(images_returned(ex) for ex in examples) / n,
        "tool/turns": sum(len({c.get("turn") for c in cs}) for cs in calls) / n,
    }
