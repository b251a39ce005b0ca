"""``synthetic_gui``: a small phone whose tasks a ~1M-parameter VLM can learn with RL on a CPU.

Why it looks as it does: the tiny default model sees one token per 28-px cell and knows the
coloured shapes of :mod:`mmrl.data.scenes`, and cannot read small text. So every element to find
is marked by a fixed (colour, shape) icon in one grid cell (a message row and the Name field are
wider, clickable anywhere), text labels are drawn only for real models (large cells), and
positions depend on the task seed, so the agent has to look at the screen. Drawing and the element lists are in :mod:`mmrl.envs.gui_screens`.

Screens (4 x 8 cells; row 0 a status bar with Wi-Fi / Bluetooth indicators; an app's row 1 a
header with a Back button in column 0):

- ``home``: Settings, Messages, Contacts and 1-3 decoy apps (Camera, Clock, Music) at random
  cells of rows 1-6. A decoy opens an empty ``app`` screen.
- ``settings``: Wi-Fi, Bluetooth, Airplane mode, Dark mode in shuffled rows: icon (column 0),
  label, switch (column 3; the switch cell is the clickable "... toggle"). Settings are
  independent (airplane mode does not turn the radios off; dark mode does not recolour).
- ``messages``: 10 messages (senders Ada ... Jo, shuffled), 5 rows visible; a row is clickable
  over its whole width; ``scroll`` down / up moves a page (5 rows).
- ``message``: one message open.
- ``contacts``: a Name field (columns 0-2 of a row) and a Submit button. Clicking the field
  focuses it, ``type`` replaces its text (invalid with no focused field), Submit submits.
- the ``dialog`` "Allow notifications?" (Allow / Deny buttons), shown over an app the first time
  it is opened, for each app with probability ``dialog_prob`` (by the seed). While it is up,
  only Allow, Deny and navigate_back (= Deny) do anything; both buttons dismiss it for good.

Actions (:mod:`mmrl.measures.gui`): a click hits the first element whose box holds the point,
edges included (:func:`~mmrl.measures.screen.point_in_box`), and does nothing elsewhere;
``long_press``, ``wait`` and left / right scrolls do nothing; ``navigate_back``: message ->
messages -> home, other apps -> home; ``navigate_home`` goes home; ``open_app`` opens an app of
the home screen by its exact name (any case), an unknown name is invalid; ``terminate`` ends the
episode. Unreadable (None) and invalid actions give ``info["valid"] = False`` and reward
``-invalid_action_penalty``.

Tasks (all start on the home screen, solvable in at most 5 steps; ``max_steps = 6``):

- ``toggle``: "Turn on Bluetooth" / "Turn off Wi-Fi" (the setting starts the other way);
- ``open_message``: "Open the message from Bob" (half need a scroll) or "Open the third message"
  (first to fifth of the list as it first shows);
- ``form``: "Enter the name Ada and submit" (accomplished on submitting it; any case, stripped).

The step that accomplishes the task ends the episode with reward 1 and ``info["success"]``.

Options: ``cell`` (28: pixels of a cell; the screen is 4 x 8 cells), ``labels`` ("auto": text
when cell >= 40; true / false), ``task_kinds``, ``train_size`` (100000), ``eval_size`` (200),
``dialog_prob`` (0.0), ``invalid_action_penalty`` (0.0), ``solver_open_app`` (0.5: the share of
tasks whose scripted solver opens the app by name rather than by its icon). Splits: train (seed 1),
eval (seed 2).
"""

from __future__ import annotations

import random
from typing import Any, Optional

from mmrl.envs.base import Env, Observation, register_env
from mmrl.envs.gui_screens import APPS, COLS, DECOYS, NAMES, ROWS, SETTINGS, VISIBLE, Phone, elements, render
from mmrl.measures.gui import normalize_action
from mmrl.measures.screen import point_in_box
from mmrl.task import SyntheticExamples

KINDS = ("toggle", "open_message", "form")
ORDINALS = ("first", "second", "third", "fourth", "fifth")
SPLIT_SEEDS = {"train": 1, "eval": 2}
GOAL_APP = {"toggle": "Settings", "open_message": "Messages", "form": "Contacts"}
APP_SCREENS = {"Settings": "settings", "Messages": "messages", "Contacts": "contacts"}  # decoys: "app"


@register_env("synthetic_gui")
class SyntheticGUI(Env):
    """The synthetic phone (see the module docstring)."""

    max_steps = 6

    def default_options(self) -> dict[str, Any]:
        return {"cell": 28, "labels": "auto", "task_kinds": list(KINDS), "train_size": 100_000, "eval_size": 200,
                "dialog_prob": 0.0, "invalid_action_penalty": 0.0, "solver_open_app": 0.5}

    def __init__(self, **options: Any):
        super().__init__(**options)
        o = self.options
        kinds = o["task_kinds"] = [o["task_kinds"]] if isinstance(o["task_kinds"], str) else list(o["task_kinds"])
        if not kinds or any(k not in KINDS for k in kinds):
            raise ValueError(f"synthetic_gui: task_kinds must be a non-empty list of {list(KINDS)}, got {kinds!r}")
        if isinstance(o["cell"], bool) or not isinstance(o["cell"], int) or o["cell"] < 16:
            raise ValueError(f"synthetic_gui: cell must be an integer >= 16 (pixels), got {o['cell']!r}")
        if o["labels"] not in ("auto", True, False):
            raise ValueError(f"synthetic_gui: labels must be 'auto', true or false, got {o['labels']!r}")
        for key in ("dialog_prob", "solver_open_app"):
            if not 0.0 <= float(o[key]) <= 1.0:
                raise ValueError(f"synthetic_gui: {key} must be in [0, 1], got {o[key]!r}")
        self.cell = o["cell"]
        self.labels = self.cell >= 40 if o["labels"] == "auto" else o["labels"]
        self.size = (COLS * self.cell, ROWS * self.cell)  # (width, height) of a screenshot
        self._phone: Optional[Phone] = None
        self._task: dict = {}
        self._done = True
        self._submitted: Optional[str] = None  # the text submitted by this step, if any

    # -- tasks -------------------------------------------------------------------------------------
    def tasks(self, split: str) -> SyntheticExamples:
        if split not in SPLIT_SEEDS:
            raise ValueError(f"synthetic_gui: unknown split {split!r}; valid splits: {sorted(SPLIT_SEEDS)}")
        return SyntheticExamples(self.make_task, self.options[f"{split}_size"], SPLIT_SEEDS[split])

    def make_task(self, seed: int) -> dict:
        """The task spec of ``seed``: ``{"kind", "instruction", "seed", <goal fields>}``, goals
        ``setting``/``on`` (toggle), ``sender`` or ``ordinal`` (open_message), ``name`` (form)."""
        rng = random.Random(seed)
        kind = rng.choice(self.options["task_kinds"])
        spec: dict[str, Any] = {"kind": kind, "seed": seed}
        if kind == "toggle":
            spec.update(setting=rng.choice(SETTINGS), on=rng.random() < 0.5)
            spec["instruction"] = f"Turn {'on' if spec['on'] else 'off'} {spec['setting']}"
        elif kind == "open_message" and rng.random() < 0.5:
            spec["sender"] = rng.choice(NAMES)
            spec["instruction"] = f"Open the message from {spec['sender']}"
        elif kind == "open_message":
            spec["ordinal"] = rng.randint(1, len(ORDINALS))
            spec["instruction"] = f"Open the {ORDINALS[spec['ordinal'] - 1]} message"
        else:
            spec["name"] = rng.choice(NAMES)
            spec["instruction"] = f"Enter the name {spec['name']} and submit"
        return spec

    def _layout(self, task: dict) -> Phone:
        """The phone of ``task["seed"]``, from its own random stream so the layout is the seed's
        alone (``dialog_prob`` only picks which apps ask), the goal's setting the other way round."""
        seed = int(task["seed"])
        rng = random.Random(f"synthetic_gui:{seed}")
        apps = list(APPS) + rng.sample(DECOYS, rng.randint(1, len(DECOYS)))
        home = dict(zip(apps, rng.sample(range(COLS, 7 * COLS), len(apps))))  # rows 1-6
        field_row, ask = rng.randint(2, 5), float(self.options["dialog_prob"])
        phone = Phone(seed=seed, home=home, order=rng.sample(SETTINGS, len(SETTINGS)),
                      senders=rng.sample(NAMES, len(NAMES)), field_row=field_row,
                      submit=(rng.randrange(COLS), rng.randint(field_row + 1, 6)),
                      dialog_cols=tuple(rng.sample(range(COLS), 2)),
                      asks={a for a in APPS + DECOYS if rng.random() < ask and a in home},  # 6 draws always
                      toggles={s: rng.random() < 0.5 for s in SETTINGS})
        if task.get("kind") == "toggle":
            phone.toggles[task["setting"]] = not task["on"]
        return phone

    # -- the episode -------------------------------------------------------------------------------
    def reset(self, task: dict) -> Observation:
        self._task, self._phone, self._done = dict(task), self._layout(task), False
        return self._observe()

    def step(self, action: Optional[dict]) -> tuple[Observation, float, bool, dict]:
        if self._phone is None or self._done:
            raise RuntimeError("synthetic_gui: step() before reset() or after the episode ended")
        act = normalize_action(action)  # None for None and for anything unreadable
        self._submitted = None
        valid, message = self._apply(act)
        success = self._accomplished()
        self._done = success or (act is not None and act["action"] == "terminate")
        reward = (1.0 if success else 0.0) - (0.0 if valid else float(self.options["invalid_action_penalty"]))
        return self._observe(), reward, self._done, {"success": success, "valid": valid, "message": message}

    def _observe(self, instruction: Optional[str] = None) -> Observation:
        p = self._phone
        return Observation(image=render(p, self.cell, self.labels),
                           instruction=self._task.get("instruction", "") if instruction is None else instruction,
                           elements=[e for e, _ in elements(p, self.cell)], state_key=p.key())

    def _apply(self, act: Optional[dict]) -> tuple[bool, str]:
        """Apply an action to the phone: (valid, what happened)."""
        p = self._phone
        if act is None:
            return False, "unreadable action"
        kind = act["action"]
        if kind == "click":
            target = next((t for e, t in elements(p, self.cell) if point_in_box(act["point"], e["box"])), None)
            return (True, "nothing there") if target is None else self._press(target)
        if kind == "type":
            if p.dialog or p.screen != "contacts" or not p.focus:
                return False, "no focused field to type into"
            p.text = act["text"]
            return True, f"typed {act['text']!r}"
        if kind == "open_app":
            app = next((a for a in p.home if a.lower() == act["app"].strip().lower()), None)
            if app is None:
                return False, f"no app named {act['app']!r}"
            if p.dialog:
                return True, "the dialog is in the way"
            return True, self._open(app)
        if kind == "navigate_back":
            return self._press(("deny",) if p.dialog else ("back",))
        if kind == "navigate_home":
            if p.dialog:
                return True, "the dialog is in the way"
            return True, self._go_home()
        if kind == "scroll":
            if p.dialog or p.screen != "messages" or act["direction"] not in ("up", "down"):
                return True, "nothing scrolls"
            page = VISIBLE if act["direction"] == "down" else -VISIBLE
            p.scroll = min(max(p.scroll + page, 0), len(p.senders) - VISIBLE)
            return True, f"scrolled {act['direction']}"
        if kind == "terminate":
            return True, f"terminated ({act['status']})"
        return True, "nothing happens"  # wait, long_press

    def _press(self, target: tuple) -> tuple[bool, str]:
        """What clicking an element (its target, see :func:`~mmrl.envs.gui_screens.elements`) does."""
        p, what = self._phone, target[0]
        if what == "open":
            return True, self._open(target[1])
        if what in ("allow", "deny"):
            p.dialog = False
            p.asks.discard(p.app)
            return True, f"{'allowed' if what == 'allow' else 'denied'} notifications"
        if what == "back":
            if p.screen == "message":
                p.screen, p.opened = "messages", -1
                return True, "back to the messages"
            return True, ("already home" if p.screen == "home" else self._go_home())
        if what == "toggle":
            p.toggles[target[1]] = not p.toggles[target[1]]
            return True, f"{target[1]} {'on' if p.toggles[target[1]] else 'off'}"
        if what == "read":
            p.screen, p.opened = "message", target[1]
            return True, f"opened the message from {p.senders[target[1]]}"
        if what == "focus":
            p.focus = True
            return True, "focused the Name field"
        p.focus, self._submitted = False, p.text  # submit
        return True, f"submitted {p.text!r}"

    def _open(self, app: str) -> str:
        p = self._phone
        p.screen, p.app, p.scroll, p.opened, p.focus = APP_SCREENS.get(app, "app"), app, 0, -1, False
        p.dialog = app in p.asks
        return f"opened {app}" + (" (a dialog asks)" if p.dialog else "")

    def _go_home(self) -> str:
        p = self._phone
        p.screen, p.app, p.scroll, p.opened, p.focus, p.dialog = "home", "", 0, -1, False, False
        return "went home"

    def _goal_index(self) -> int:
        t = self._task
        return self._phone.senders.index(t["sender"]) if "sender" in t else int(t["ordinal"]) - 1

    def _accomplished(self) -> bool:
        p, t = self._phone, self._task
        if t["kind"] == "toggle":
            return p.toggles[t["setting"]] == bool(t["on"])
        if t["kind"] == "open_message":
            return p.screen == "message" and not p.dialog and p.opened == self._goal_index()
        return self._submitted is not None and self._submitted.strip().lower() == str(t["name"]).strip().lower()

    # -- the scripted solver and grounding screens ----------------------------------------------------
    def expert_action(self) -> Optional[dict]:
        """The next action of a scripted solver from the current state (clicks at element centres);
        None when the episode is over. Takes 2-5 steps from the home screen. It opens the goal app
        by clicking its icon, or, for a share ``solver_open_app`` of the tasks (by the task's seed),
        by name (``open_app``, as in AndroidControl's episodes): a warm start imitating it knows
        both ways, and RL can find out which one works more often for it."""
        if self._phone is None or self._done:
            return None
        p, t = self._phone, self._task

        def click(target: tuple) -> dict:
            x1, y1, x2, y2 = next(e["box"] for e, tg in elements(p, self.cell) if tg == target)
            return {"action": "click", "point": [(x1 + x2) / 2, (y1 + y2) / 2]}

        if p.dialog:
            return click(("allow",))
        app = GOAL_APP[t["kind"]]
        if p.screen == "home":
            # its own stream: the task seed's first draws chose the task (string seeds are hashed)
            if random.Random(f"open_app/{t['seed']}").random() < float(self.options["solver_open_app"]):
                return {"action": "open_app", "app": app}
            return click(("open", app))
        if p.app != app:
            return {"action": "navigate_home"}
        if t["kind"] == "toggle":
            return click(("toggle", t["setting"]))
        if t["kind"] == "open_message":
            i = self._goal_index()
            if p.screen == "message":  # the wrong one
                return {"action": "navigate_back"}
            if not p.scroll <= i < p.scroll + VISIBLE:
                return {"action": "scroll", "direction": "down" if i >= p.scroll + VISIBLE else "up"}
            return click(("read", i))
        if p.text.strip().lower() == str(t["name"]).strip().lower():
            return click(("submit",))
        return {"action": "type", "text": t["name"]} if p.focus else click(("focus",))

    def random_screen(self, rng: random.Random) -> Observation:
        """A random reachable screen (any kind, the dialog included; random layout, toggles,
        scroll, focus and text) with an empty instruction, for screen-grounding tasks that ask to
        click one of its elements. Deterministic given ``rng``'s state; leaves this env's episode
        alone."""
        env = type(self)(**self.options)
        env.reset(env.make_task(rng.randrange(2**31)))
        p = env._phone
        p.toggles = {s: rng.random() < 0.5 for s in SETTINGS}
        screen = rng.choice(("home", "settings", "messages", "message", "contacts", "app", "dialog"))
        if screen == "dialog":
            env._open(rng.choice(sorted(p.home)))
        elif screen == "app":
            env._open(rng.choice(sorted(a for a in p.home if a in DECOYS)))
        elif screen != "home":
            env._open({"message": "Messages"}.get(screen, screen.capitalize()))
            p.scroll = rng.choice((0, len(p.senders) - VISIBLE)) if screen.startswith("message") else 0
            if screen == "message":
                p.screen, p.opened = "message", rng.randrange(len(p.senders))
            if screen == "contacts":
                p.focus, p.text = rng.random() < 0.5, rng.choice(("",) + NAMES)
        p.dialog = screen == "dialog"  # over any app, whatever dialog_prob
        return env._observe(instruction="")
