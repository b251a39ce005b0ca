"""The built-in ``synthetic_gui`` environment: solvable by its scripted solver, not by chance,
deterministic, and its screens, elements and actions behave as its module docstring says."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from mmrl.envs import SyntheticGUI, make_env
from mmrl.envs.gui_screens import APPS, DECOYS, NAMES
from mmrl.measures.screen import point_in_box
from mmrl.registry import ENVS


def _task(env, kind, start=0, **goal):
    """The first train task of ``kind`` (with the given goal fields) from index ``start``."""
    for i in range(start, start + 2000):
        t = env.tasks("train")[i]
        if t["kind"] == kind and all(t.get(k) == v for k, v in goal.items()):
            return t
    raise AssertionError(f"no {kind} task with {goal}")


def _click(el):
    x1, y1, x2, y2 = el["box"]
    return {"action": "click", "point": [(x1 + x2) / 2, (y1 + y2) / 2]}


def _el(obs, name):
    return next(e for e in obs.elements if e["name"] == name)


def _run_expert(env, task):
    obs, steps, info = env.reset(task), 0, {}
    while (action := env.expert_action()) is not None:
        obs, reward, done, info = env.step(action)
        steps += 1
        assert info["valid"], (task, action, info)
        assert steps <= env.max_steps
    return steps, info.get("success", False), reward


def test_registered_and_made_by_name():
    assert "synthetic_gui" in ENVS.names()
    env = make_env("synthetic_gui")
    assert isinstance(env, SyntheticGUI) and env.max_steps == 6
    assert env.reset(env.tasks("train")[0]).image.size == (112, 224)


@pytest.mark.parametrize("split,count,dialog_prob", [("train", 300, 0.0), ("eval", 200, 0.0), ("train", 150, 1.0)])
def test_the_scripted_solver_solves_every_task(split, count, dialog_prob):
    env = make_env("synthetic_gui", dialog_prob=dialog_prob)
    lengths = defaultdict(list)
    for task in env.tasks(split)[:count]:
        steps, success, reward = _run_expert(env, task)
        assert success and reward == 1.0 and steps <= 5, (task, steps)
        lengths[task["kind"]].append(steps)
    assert set(lengths) == {"toggle", "open_message", "form"}
    print({k: round(sum(v) / len(v), 2) for k, v in lengths.items()})


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_the_solver_opens_the_app_by_name_for_its_share_of_tasks(share):
    """``solver_open_app``: the share of tasks (by seed, whatever their kind) whose solver's first
    action is ``open_app`` rather than a click on the icon; every task is solved either way."""
    env = make_env("synthetic_gui", solver_open_app=share)
    firsts = {kind: [] for kind in ("toggle", "open_message", "form")}
    for task in env.tasks("train")[:300]:
        env.reset(task)
        first = env.expert_action()
        firsts[task["kind"]].append(first["action"] == "open_app")
        if first["action"] == "open_app":
            assert first["app"] == {"toggle": "Settings", "open_message": "Messages", "form": "Contacts"}[task["kind"]]
        assert _run_expert(env, task)[1]
    for kind, by_name in firsts.items():
        assert abs(sum(by_name) / len(by_name) - share) <= 0.12, (kind, sum(by_name) / len(by_name))
    with pytest.raises(ValueError, match="solver_open_app must be in"):
        make_env("synthetic_gui", solver_open_app=1.5)


def _random_action(rng, width, height):
    """A seeded random policy: mostly clicks anywhere, else any other action with plausible arguments."""
    if rng.random() < 0.6:
        return {"action": "click", "point": [rng.uniform(0, width), rng.uniform(0, height)]}
    return rng.choice([
        {"action": "long_press", "point": [rng.uniform(0, width), rng.uniform(0, height)]},
        {"action": "type", "text": rng.choice(NAMES)},
        {"action": "scroll", "direction": rng.choice(["up", "down", "left", "right"])},
        {"action": "open_app", "app": rng.choice(APPS + DECOYS)},
        {"action": "navigate_back"}, {"action": "navigate_home"}, {"action": "wait"},
        {"action": "terminate", "status": rng.choice(["success", "failure"])},
    ])


def test_a_random_policy_rarely_succeeds():
    env, rng, wins = make_env("synthetic_gui"), random.Random(0), 0
    episodes = 300
    for task in env.tasks("train")[:episodes]:
        obs = env.reset(task)
        for _ in range(env.max_steps):
            obs, reward, done, info = env.step(_random_action(rng, *obs.image.size))
            if done:
                wins += info["success"]
                break
    rate = wins / episodes
    # measured 0.003 (1 / 300; 0.000-0.007 over seeds 0-9, with or without dialogs)
    assert rate < 0.05, f"random policy success rate {rate:.3f} ({wins} / {episodes})"


def test_same_task_same_pixels_and_states_other_seeds_other_layouts():
    env = make_env("synthetic_gui", dialog_prob=0.5)
    for task in env.tasks("eval")[:20]:
        runs = []
        for _ in range(2):
            obs = [env.reset(task)]
            while (a := env.expert_action()) is not None:
                obs.append(env.step(a)[0])
            runs.append([(o.image.tobytes(), o.state_key, o.elements) for o in obs])
        assert runs[0] == runs[1]
    homes = {tuple((e["name"], e["box"]) for e in env.reset(t).elements) for t in env.tasks("train")[:30]}
    assert len(homes) == 30
    for task in env.tasks("train")[:10]:  # dialog_prob picks which apps ask, nothing else
        assert env.reset(task).image.tobytes() == make_env("synthetic_gui").reset(task).image.tobytes()
    orders = {tuple(e["name"] for e in env.random_screen(random.Random(s)).elements) for s in range(40)}
    assert len(orders) > 10


def test_elements_lie_inside_the_screen_and_random_screens_cover_every_kind():
    env, rng, kinds = make_env("synthetic_gui"), random.Random(1), set()
    for _ in range(200):
        obs = env.random_screen(rng)
        width, height = obs.image.size
        assert obs.instruction == "" and obs.elements
        assert len({e["name"] for e in obs.elements}) == len(obs.elements)
        for e in obs.elements:
            x1, y1, x2, y2 = e["box"]
            assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, e
            assert e["role"] and e["name"]
        fields = dict(part.split("=", 1) for part in obs.state_key.split("|"))
        kinds.add("dialog" if fields["dialog"] == "1" else fields["screen"])
    assert kinds == {"home", "settings", "messages", "message", "contacts", "app", "dialog"}
    a, b = random.Random(7), random.Random(7)
    x, y = env.random_screen(a), env.random_screen(b)
    assert x.image.tobytes() == y.image.tobytes() and x.state_key == y.state_key


def test_random_screen_leaves_the_episode_alone():
    env = make_env("synthetic_gui")
    obs = env.reset(env.tasks("train")[0])
    env.random_screen(random.Random(3))
    assert env.reset(env.tasks("train")[0]).state_key == obs.state_key
    assert env.expert_action() is not None


def test_state_keys_follow_the_state():
    env = make_env("synthetic_gui")
    home = env.reset(_task(env, "toggle", setting="Bluetooth"))
    settings, *_ = env.step(_click(_el(home, "Settings app")))
    on, *_ = env.step(_click(_el(settings, "Bluetooth toggle")))  # accomplished: the episode ends
    assert len({home.state_key, settings.state_key, on.state_key}) == 3
    env.reset(_task(env, "toggle", setting="Wi-Fi"))  # keys equal exactly when states are
    settings, *_ = env.step({"action": "open_app", "app": "Settings"})
    first, *_ = env.step(_click(_el(settings, "Bluetooth toggle")))
    again, *_ = env.step(_click(_el(first, "Bluetooth toggle")))
    back, *_ = env.step(_click(_el(again, "Bluetooth toggle")))
    assert again.state_key != first.state_key and back.state_key == first.state_key
    assert again.state_key == settings.state_key and back.image.tobytes() == first.image.tobytes()
    env.step(_click(_el(back, "Bluetooth toggle")))
    home2, *_ = env.step({"action": "navigate_home"})
    assert home2.state_key == env.reset(env._task).state_key


def test_unreadable_and_invalid_actions_pay_the_penalty():
    env = make_env("synthetic_gui", invalid_action_penalty=0.25)
    obs = env.reset(_task(env, "form"))
    for action in (None, {"action": "fly"}, {"action": "type", "text": "Ada"}, {"action": "open_app", "app": "Nope"}):
        obs2, reward, done, info = env.step(action)
        assert (info["valid"], reward, done, info["success"]) == (False, -0.25, False, False), action
        assert obs2.state_key == obs.state_key and isinstance(info["message"], str)
    contacts, reward, _, info = env.step({"action": "open_app", "app": " contacts "})
    assert info["valid"] and reward == 0.0 and "Name field" in [e["name"] for e in contacts.elements]
    assert not env.step({"action": "type", "text": "Ada"})[3]["valid"]  # the field is not focused yet
    _, reward, _, info = env.step({"action": "click", "point": [-5, -5]})  # off every element: valid, useless
    assert info["valid"] and reward == 0.0


def test_navigation_back_home_open_app_and_scroll():
    env = make_env("synthetic_gui")
    obs = env.reset(_task(env, "open_message", sender="Ada"))
    msgs, *_ = env.step({"action": "open_app", "app": "MESSAGES"})
    shown = [e["name"] for e in msgs.elements if e["role"] == "list item"]
    assert len(shown) == 5 and msgs.elements[0]["name"] == "Back button"
    down, *_ = env.step({"action": "scroll", "direction": "down"})
    rest = [e["name"] for e in down.elements if e["role"] == "list item"]
    assert len(rest) == 5 and not set(rest) & set(shown)
    assert env.step({"action": "scroll", "direction": "down"})[0].state_key == down.state_key  # at the end
    assert env.step({"action": "scroll", "direction": "left"})[0].state_key == down.state_key
    up, *_ = env.step({"action": "scroll", "direction": "up"})
    assert up.state_key == msgs.state_key
    other = next(e for e in up.elements if e["role"] == "list item" and e["name"] != "Message from Ada")
    opened, _, done, info = env.step(_click(other))
    assert not done and "screen=message|" in opened.state_key and opened.elements == [_el(opened, "Back button")]
    assert env.step({"action": "navigate_back"})[0].state_key == msgs.state_key  # message -> messages
    home, _, _, info = env.step(_click(_el(msgs, "Back button")))  # the Back button: -> home
    assert home.state_key == obs.state_key
    assert env.step({"action": "navigate_back"})[0].state_key == obs.state_key  # home stays home
    assert env.step({"action": "scroll", "direction": "down"})[3]["valid"]
    decoy = next(e for e in obs.elements if e["name"].split()[0] in DECOYS)
    app, *_ = env.step(_click(decoy))
    assert "screen=app|" in app.state_key and [e["name"] for e in app.elements] == ["Back button"]
    assert env.step({"action": "navigate_home"})[0].state_key == obs.state_key
    assert env.step({"action": "wait"})[0].state_key == obs.state_key
    _, reward, done, info = env.step({"action": "terminate", "status": "success"})
    assert done and reward == 0.0 and not info["success"] and env.expert_action() is None
    with pytest.raises(RuntimeError):
        env.step({"action": "wait"})


def test_the_dialog_blocks_until_dismissed():
    env = make_env("synthetic_gui", dialog_prob=1.0)
    env.reset(_task(env, "toggle"))
    dialog, *_ = env.step({"action": "open_app", "app": "Settings"})
    assert [e["name"] for e in dialog.elements] == ["Allow button", "Deny button"] and "dialog=1" in dialog.state_key
    for action in ({"action": "navigate_home"}, {"action": "open_app", "app": "Messages"},
                   {"action": "scroll", "direction": "down"}, {"action": "click", "point": [98, 70]}):
        assert env.step(action)[0].state_key == dialog.state_key, action
    settings, *_ = env.step({"action": "navigate_back"})  # back = Deny: dismissed, still in Settings
    assert "dialog=0" in settings.state_key and "screen=settings" in settings.state_key
    env.step({"action": "navigate_home"})
    assert "dialog=0" in env.step({"action": "open_app", "app": "Settings"})[0].state_key  # asked once
    contacts, *_ = env.step({"action": "open_app", "app": "Contacts"})
    assert "dialog=1" in contacts.state_key
    form, *_ = env.step(_click(_el(contacts, "Allow button")))
    assert "Submit button" in [e["name"] for e in form.elements]


def test_the_form_types_replaces_and_submits():
    env = make_env("synthetic_gui")
    task = _task(env, "form", name="Bob")
    env.reset(task)
    form, *_ = env.step({"action": "open_app", "app": "Contacts"})
    env.step(_click(_el(form, "Name field")))
    env.step({"action": "type", "text": "Ada"})
    typed, *_ = env.step({"action": "type", "text": "  bOB "})
    assert "text='  bOB '" in typed.state_key and "focus=1" in typed.state_key
    env.step({"action": "type", "text": "Ada"})
    _, reward, done, info = env.step(_click(_el(form, "Submit button")))
    assert (reward, done, info["success"]) == (0.0, False, False)
    env.step(_click(_el(form, "Name field")))
    env.step({"action": "type", "text": "  bOB "})
    _, reward, done, info = env.step(_click(_el(form, "Submit button")))
    assert (reward, done, info["success"]) == (1.0, True, True)


def test_clicks_on_element_edges_count():
    env = make_env("synthetic_gui")
    task = env.tasks("train")[5]
    home = env.reset(task)
    checked = 0
    for el in home.elements:
        x1, y1, x2, y2 = el["box"]
        for point in ((x1, y1), (x2, y2), (x1, (y1 + y2) / 2), ((x1 + x2) / 2, y2)):
            first = next(e for e in home.elements if point_in_box(point, e["box"]))  # ties: the first listed
            env.reset(task)
            obs, *_ = env.step({"action": "click", "point": list(point)})
            assert f"app={first['name'].removesuffix(' app')}|" in obs.state_key, (el, point)
            checked += first is el
        outside = (x1 - 0.5, y1 - 0.5)
        if not any(point_in_box(outside, e["box"]) for e in home.elements):
            env.reset(task)
            assert "screen=home" in env.step({"action": "click", "point": list(outside)})[0].state_key
    assert checked >= len(home.elements) * 2


def test_large_cells_render_labels():
    big = make_env("synthetic_gui", cell=56)
    task = big.tasks("train")[0]
    labelled = big.reset(task)
    plain = make_env("synthetic_gui", cell=56, labels=False).reset(task)
    assert labelled.image.size == (224, 448) and big.labels
    assert labelled.image.tobytes() != plain.image.tobytes() and labelled.state_key == plain.state_key
    assert not make_env("synthetic_gui").labels and make_env("synthetic_gui", labels=True).labels
    assert [e["box"] for e in labelled.elements] == [tuple(2 * v for v in e["box"])
                                                    for e in make_env("synthetic_gui").reset(task).elements]


def test_options_splits_and_task_specs_are_checked():
    with pytest.raises(ValueError, match="valid options: .*cell"):
        make_env("synthetic_gui", colour="red")
    for bad in ({"task_kinds": ["fly"]}, {"task_kinds": []}, {"cell": 8}, {"labels": "maybe"}, {"dialog_prob": 2}):
        with pytest.raises(ValueError):
            make_env("synthetic_gui", **bad)
    env = make_env("synthetic_gui", task_kinds=["form"], train_size=50)
    with pytest.raises(ValueError, match="valid splits"):
        env.tasks("test")
    assert len(env.tasks("train")) == 50 and len(make_env("synthetic_gui").tasks("eval")) == 200
    specs = env.tasks("train")[:20]
    assert all(t["kind"] == "form" and t["instruction"] == f"Enter the name {t['name']} and submit" for t in specs)
    assert [t["seed"] for t in specs[:2]] == [1_000_003, 1_000_004]
    assert make_env("synthetic_gui").tasks("eval")[0]["seed"] == 2_000_006
    toggles = [t for t in make_env("synthetic_gui").tasks("train")[:100] if t["kind"] == "toggle"]
    assert {t["instruction"].split()[1] for t in toggles} == {"on", "off"}
