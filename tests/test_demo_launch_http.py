"""The demo's Launch tab over HTTP, as anyone who reaches the port can call it (issue 34, item 1):
an uploaded ``.py`` named as a plugin, and paths outside the served directories (directly, by
``..`` or by a symlink inside them) are each refused with a message, before any process starts:
nothing is executed and no file is read. Beyond loopback the demo needs a password (or an
explicit ``--no-auth``, and then has no Launch tab). No training here: the fast lane."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("gradio", reason="the demo needs gradio: pip install -e '.[demo]'")

from mmrl.demo.exposure import ExposureRefused, decide, is_loopback, parse_auth  # noqa: E402

SECRET = "SECRET-FIELD-7731"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(root: Path, **kwargs):
    from mmrl.demo.app import launch_app

    port = _free_port()
    kwargs.setdefault("block", False)
    app, play, launcher = launch_app(root / "runs", port=port, upload_dir=root / "uploads",
                                     model_roots=[root / "models"], **kwargs)
    return f"http://127.0.0.1:{port}", app, launcher


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A demo serving runs/, uploads/ and models/ (which holds a symlink to a folder outside),
    beside a secret file it must never read."""
    root = tmp_path_factory.mktemp("demo-http")
    for d in ("runs", "uploads", "models", "outside"):
        (root / d).mkdir()
    (root / "outside" / "secret.json").write_text(json.dumps([{"question": SECRET, "answer": "1"}]))
    (root / "models" / "escape").symlink_to(root / "outside", target_is_directory=True)
    (root / "uploads" / "link.json").symlink_to(root / "outside" / "secret.json")
    url, app, launcher = _serve(root)
    yield {"url": url, "root": root, "launcher": launcher}
    launcher.close()
    app.close()


def _upload(url: str, filename: str, content: bytes, headers: dict | None = None) -> str:
    """POST /gradio_api/upload, as the page's upload widget does; the path the server stored it at."""
    boundary = "mmrlboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{filename}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(f"{url}/gradio_api/upload", data=body, method="POST", headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}", **(headers or {})})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.load(r)[0]


def _call(url: str, api: str, *data, headers: dict | None = None) -> list:
    """Gradio's HTTP API: POST /gradio_api/call/<api>, then read the event stream of the result."""
    request = urllib.request.Request(f"{url}/gradio_api/call/{api}", data=json.dumps({"data": list(data)}).encode(),
                                     method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=30) as r:
        event = json.load(r)["event_id"]
    request = urllib.request.Request(f"{url}/gradio_api/call/{api}/{event}", headers=headers or {})
    with urllib.request.urlopen(request, timeout=60) as r:
        stream = r.read().decode()
    lines = stream.splitlines()
    assert "event: complete" in lines, stream
    return json.loads(lines[lines.index("event: complete") + 1].removeprefix("data: "))


def _launch(url: str, overrides: str, name: str, recipe: str = "vlm/counting_tiny", **kw) -> str:
    """The Launch tab's Start over HTTP; the status line it answers."""
    _log, status = _call(url, "launch_start", recipe, overrides, name, **kw)
    return status


def _refused(server, overrides: str, name: str, *words: str) -> str:
    status = _launch(server["url"], overrides, name)
    assert status.startswith("**error:**"), status
    assert all(w in status for w in words), status
    assert SECRET not in status
    launcher, runs = server["launcher"], server["root"] / "runs"
    assert launcher.running() == [] and launcher.status(name)["state"] == "not started"
    assert not (runs / name).exists()  # no run directory, no launch.log, no process
    return status


@pytest.mark.slow
def test_an_uploaded_plugin_is_refused_and_never_runs(server):
    marker = server["root"] / "plugin-ran"
    path = _upload(server["url"], "evil.py", f"open({str(marker)!r}, 'w').write('ran')\n".encode())
    assert Path(path).is_file() and Path(path).is_relative_to(server["root"] / "uploads")
    for i, overrides in enumerate((f"plugins=['{path}'] train.steps=1", f"train.steps=1 plugins=[{path}]",
                                   f"'plugins+=[{path}]'", f"\"train.steps=1\nplugins: ['{path}']\"",
                                   f"\"task.name=counting\nplugins: ['{path}']\"", f"'train={{steps: 1}}'")):
        _refused(server, overrides, f"plugin-{i}", "override")
    assert "plugins is never accepted" in _refused(server, f"plugins=['{path}'] train.steps=1", "plugin", "plugins")
    time.sleep(1.0)  # had anything started, it would have imported the plugin by now
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("key", ["task.options.eval_path", "task.options.train_path", "task.options.image_root",
                                 "model.path", "log.output_dir"])
def test_path_overrides_pointing_outside_are_refused(server, key):
    outside = server["root"] / "outside" / ("secret.json" if key.endswith("_path") else "")
    status = _refused(server, f"{key}={outside} train.steps=1", f"out-{key}", key)
    assert "set by the launch tab" in status if key == "log.output_dir" else \
        "outside the directories this demo serves" in status


@pytest.mark.parametrize("key", ["task.options.eval_path", "model.path"])
@pytest.mark.parametrize("escape", ["runs/../outside/secret.json", "models/escape/secret.json", "uploads/link.json",
                                    "models/escape"])
def test_dotdot_and_symlinks_inside_the_served_directories_are_refused(server, key, escape):
    status = _refused(server, f"{key}={server['root'] / escape}", f"esc-{len(escape)}", key,
                      "outside the directories this demo serves")
    assert str(server["root"] / "runs") in status  # the message names what is served


def test_a_recipe_whose_model_lies_outside_is_refused(server):
    status = _launch(server["url"], "train.steps=1", "big", recipe="vlm/qwen2_5_vl_3b_counting")
    assert status.startswith("**error:**") and "model.path=/models/Qwen2.5-VL-3B-Instruct" in status
    assert "--models" in status and not (server["root"] / "runs" / "big").exists()


def test_a_path_inside_the_served_directories_is_accepted(server, tmp_path):
    """Accepted overrides reach the run canonical and quoted (a stand-in for python prints its
    arguments and the directory it runs in: the run's own)."""
    data = _upload(server["url"], "data.json", json.dumps([{"question": "q", "answer": "1"}]).encode())
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\npwd\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    launcher = server["launcher"]
    real, launcher.python = launcher.python, str(fake)
    try:
        status = _launch(server["url"], f"task.options.eval_path={data} train.steps=1 algo.advantage=rloo", "ok")
        assert not status.startswith("**error:**"), status
        deadline = time.monotonic() + 30
        while launcher.status("ok")["state"] == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        launcher.python = real
    log = (server["root"] / "runs" / "ok" / "launch.log").read_text().splitlines()
    assert log[0] == str((server["root"] / "runs" / "ok").resolve())
    assert log[1:6] == ["-m", "mmrl", "train", "vlm", str(Path(log[5]))] and log[5].endswith("counting_tiny.yaml")
    assert log[6:9] == [f"task.options.eval_path='{data}'", "train.steps=1", "algo.advantage='rloo'"]


@pytest.mark.slow
def test_with_a_password_anonymous_requests_are_refused(tmp_path):
    for d in ("runs", "uploads", "models"):
        (tmp_path / d).mkdir()
    url, app, launcher = _serve(tmp_path, auth=("ada", "lovelace"))
    try:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            _upload(url, "evil.py", b"print(1)\n")
        with pytest.raises(urllib.error.HTTPError, match="401"):
            _launch(url, "train.steps=1", "x")
        login = urllib.request.Request(f"{url}/login", method="POST",
                                       data=urllib.parse.urlencode({"username": "ada", "password": "lovelace"}).encode())
        with urllib.request.urlopen(login, timeout=30) as r:
            cookie = "; ".join(c.split(";")[0] for c in r.headers.get_all("Set-Cookie"))
        path = _upload(url, "evil.py", b"print(1)\n", headers={"Cookie": cookie})
        status = _launch(url, f"plugins=[{path}]", "x", headers={"Cookie": cookie})
        assert "plugins is never accepted" in status  # logged in, and still only the allow-list
    finally:
        launcher.close()
        app.close()


@pytest.mark.slow
def test_without_a_password_the_launch_tab_has_no_handlers(tmp_path):
    from mmrl.demo.app import build_app

    apis = lambda app: {fn.api_name for fn in app.fns.values()}  # noqa: E731
    on, _, _ = build_app(tmp_path / "runs", tmp_path / "uploads")
    off, _, _ = build_app(tmp_path / "runs", tmp_path / "uploads", launch=False)
    assert {"launch_start", "launch_stop"} <= apis(on)
    assert not any("launch" in str(name) for name in apis(off))


def test_beyond_loopback_needs_a_password_or_an_explicit_no_auth():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "192.168.1.20", "no-such-host.invalid"))
    local = decide("127.0.0.1", False, None, False)
    assert local.launch and local.warning is None and local.auth is None
    for host, share in (("0.0.0.0", False), ("127.0.0.1", True), ("192.168.1.20", True)):
        with pytest.raises(ExposureRefused, match="--auth user:password .*MMRL_DEMO_AUTH.*--no-auth"):
            decide(host, share, None, False)
        protected = decide(host, share, ("ada", "pw"), False)
        assert protected.auth == ("ada", "pw") and protected.launch and "password" in protected.warning
        open_ = decide(host, share, None, True)
        assert open_.auth is None and not open_.launch and "WITHOUT a password" in open_.warning
    assert "gradio.live" in decide("127.0.0.1", True, ("a", "b"), False).warning
    assert parse_auth("ada:pw:with:colons") == ("ada", "pw:with:colons") and parse_auth(None) is None
    for bad in ("ada", "ada:", ":pw"):
        with pytest.raises(ValueError, match="user:password"):
            parse_auth(bad)


def test_mmrl_demo_refuses_a_public_bind_without_a_password(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mmrl.cli import app

    monkeypatch.delenv("MMRL_DEMO_AUTH", raising=False)
    runner = CliRunner()
    for args, said in ((["--host", "0.0.0.0"], "--no-auth"), (["--share"], "--auth user:password"),
                       (["--host", "0.0.0.0", "--auth", "ada"], "user:password")):
        result = runner.invoke(app, ["demo", "--runs", str(tmp_path / "runs"), *args])
        assert result.exit_code == 2, result.output
        assert said in " ".join(result.output.split())
    assert not (tmp_path / "runs").exists()  # nothing was served


def test_the_before_after_summary_is_rounded(tmp_path):
    from mmrl.demo.app import _summary_table

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  steps: 2\n")
    (run / "summary.json").write_text(json.dumps({"before": {"accuracy": 1.1100000143051147, "n": 64},
                                                  "after": {"accuracy": 0.6666666865348816, "n": 64}}))
    table = _summary_table(tmp_path, "r")
    assert table.values.tolist() == [["accuracy", 1.11, 0.6667], ["n", 64, 64]]


@pytest.mark.slow
def test_the_banner_points_at_the_command_line_flags(tmp_path, capsys, monkeypatch):
    """Gradio's own banner says "set `share=True` in `launch()`"; `mmrl demo` users have flags."""
    import gradio

    monkeypatch.setattr(gradio.Blocks, "block_thread", lambda self: None)  # serve, print, return
    for d in ("runs", "uploads", "models"):
        (tmp_path / d).mkdir()
    url, app, _ = _serve(tmp_path, block=True)
    app.close()
    out = capsys.readouterr().out
    assert f"mmrl demo: {url}" in out and "mmrl demo --share --auth user:password" in out
    assert "share=True" not in out


# -- interpolations (issue 51, item 1) ---------------------------------------------------------------

ENV_SECRET = "ENV-SECRET-5309"


def _stream(url: str, api: str, *data) -> str:
    """The whole answer of an API call as text, whatever event ends it (Gradio's own refusals too)."""
    request = urllib.request.Request(f"{url}/gradio_api/call/{api}", data=json.dumps({"data": list(data)}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        event = json.load(r)["event_id"]
    with urllib.request.urlopen(f"{url}/gradio_api/call/{api}/{event}", timeout=60) as r:
        return r.read().decode()


@pytest.mark.slow
def test_an_interpolation_in_a_request_is_refused_before_anything_resolves_it(server, monkeypatch):
    """`${oc.env:...}` in a path once made the failed run's message (page and launch.log) show the
    variable; every spelling that reaches OmegaConf as `${` is refused, and no run starts."""
    monkeypatch.setenv("DEMO_SECRET", ENV_SECRET)
    up, runs = server["root"] / "uploads", server["root"] / "runs"
    (up / "${oc.env:DEMO_SECRET}").mkdir(exist_ok=True)  # a folder of that name, and a link to it
    if not (up / "plain").is_symlink():
        (up / "plain").symlink_to(up / "${oc.env:DEMO_SECRET}", target_is_directory=True)
    for i, overrides in enumerate((
            f"model.path={up}/${{oc.env:DEMO_SECRET}}",
            f"task.options.eval_path={up}/${{oc.env:DEMO_SECRET}}.json train.steps=1",
            f"model.path={up}/$\\{{oc.env:DEMO_SECRET}}",          # the shell's escape: `$\{` reads as `${`
            f"model.path={up}/'$'{{oc.env:DEMO_SECRET}}",          # quotes split `$` from `{`
            f"'model.path={up}/\\${{oc.env:DEMO_SECRET}}'",        # OmegaConf's own escape, resolved on a reload
            f"model.path={up}/${{oc.decode:${{oc.env:DEMO_SECRET}}}}",
            f"\"model.path={up}/${{oc.env:DEMO_SECRET}}\"",
            f"model.path={up}/plain",                               # no `${` sent; the link resolves to one
            "train.steps=${oc.env:DEMO_SECRET}", "algo.advantage=${oc.env:DEMO_SECRET}")):
        status = _refused(server, overrides, f"interp-{i}", "interpolation", "**error:**")
        assert ENV_SECRET not in status
    status = _launch(server["url"], "train.steps=1", "${oc.env:DEMO_SECRET}")
    assert status.startswith("**error:**") and "interpolation" in status and ENV_SECRET not in status
    answer = _stream(server["url"], "launch_start", "${oc.env:DEMO_SECRET}", "train.steps=1", "interp-recipe")
    assert ENV_SECRET not in answer and "interp-recipe" not in {p.name for p in runs.iterdir()}
    assert server["launcher"].running() == []
    assert not any(ENV_SECRET in p.read_text(errors="replace") for p in runs.rglob("*") if p.is_file())


# -- the runs cap (item 4) ---------------------------------------------------------------------------

def _sleeper(tmp_path: Path) -> str:
    """A stand-in for python that trains for a minute: what a long run looks like to the launcher."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.slow
def test_the_launch_tab_starts_at_most_max_runs_and_says_so(server, tmp_path):
    launcher, url = server["launcher"], server["url"]
    with urllib.request.urlopen(f"{url}/config", timeout=30) as r:
        assert "At most 1 run started here train at once" in r.read().decode()
    real, launcher.python = launcher.python, _sleeper(tmp_path)
    try:
        assert not _launch(url, "train.steps=1", "cap-a").startswith("**error:**")
        status = _launch(url, "train.steps=1", "cap-b")
        assert status.startswith("**error:**") and "cap-a" in status and "at most 1 at once" in status, status
        assert "--max-runs" in status and launcher.running() == ["cap-a"]
        assert not (server["root"] / "runs" / "cap-b").exists()
        _call(url, "launch_stop", "cap-a")
        assert not _launch(url, "train.steps=1", "cap-b").startswith("**error:**")  # one ended: room again
        assert launcher.running() == ["cap-b"]
    finally:
        launcher.close()
        launcher.python = real


# -- the served directories (items 2 and 3) -----------------------------------------------------------

def _get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            body = r.read()
            return 200 if b"root:" not in body else -1  # -1: /etc/passwd itself came back
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow
def test_uploads_go_to_a_private_directory_not_a_planted_link(tmp_path, monkeypatch):
    """`$TMPDIR/mmrl-demo-uploads` was a fixed name another user could create as a link to `/`
    before the demo started; the demo then served /etc/passwd. Now each demo makes its own."""
    import tempfile

    from mmrl.demo.app import launch_app

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / "mmrl-demo-uploads").symlink_to("/", target_is_directory=True)  # planted by "another user"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    (tmp_path / "runs").mkdir()
    port = _free_port()
    app, play, launcher = launch_app(tmp_path / "runs", port=port, block=False)
    url = f"http://127.0.0.1:{port}"
    try:
        uploads = play.upload_dir
        assert uploads.parent == tmp and uploads.name.startswith("mmrl-demo-uploads-") and not uploads.is_symlink()
        assert uploads.stat().st_mode & 0o777 == 0o700 and uploads.stat().st_uid == os.getuid()
        assert Path(_upload(url, "a.json", b"[]")).is_relative_to(uploads)
        for path in ("/etc/passwd", f"{tmp}/mmrl-demo-uploads/etc/passwd", f"{uploads}/../mmrl-demo-uploads/etc/passwd"):
            assert _get_status(f"{url}/gradio_api/file={path}") == 403, path
        status = _launch(url, f"task.options.eval_path={tmp}/mmrl-demo-uploads/etc/passwd", "planted")
        assert status.startswith("**error:**") and "outside the directories this demo serves" in status
        assert "/" not in [str(r) for r in launcher.roots.roots]
    finally:
        launcher.close()
        app.close()


@pytest.mark.slow
def test_a_served_directory_that_is_a_link_or_another_users_is_refused_at_start(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mmrl.cli import app
    from mmrl.demo.app import build_app
    from mmrl.demo.paths import RootRefused

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(RootRefused, match=f"upload directory {tmp_path / 'link'} is a symbolic link .*real"):
        build_app(tmp_path / "runs", tmp_path / "link")
    runner = CliRunner()
    monkeypatch.delenv("MMRL_DEMO_AUTH", raising=False)
    for args, said in ((["--runs", str(tmp_path / "link")], "runs directory (--runs)"),
                       (["--runs", str(tmp_path / "runs"), "--models", str(tmp_path / "link")], "symbolic link"),
                       (["--runs", str(tmp_path / "runs"), "--models", str(tmp_path / "none")], "does not exist"),
                       (["--runs", str(tmp_path / "runs"), "--max-runs", "0"], "max-runs")):
        result = runner.invoke(app, ["demo", *args])
        out = " ".join(result.output.split())
        assert result.exit_code == 2 and said in out and "Traceback" not in out, result.output
    if os.getuid() != 0:
        pytest.skip("making a directory another user owns needs root; the link cases above ran")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(RootRefused, match=f"{theirs} is owned by another user \\(uid 65534\\)"):
        build_app(tmp_path / "runs", tmp_path / "uploads", model_roots=[theirs])


@pytest.mark.slow
def test_a_run_or_a_run_file_that_links_outside_the_runs_directory_is_not_read(tmp_path):
    """docs/demo.md: a symlink out of the served directories is refused. A run directory linking
    out is not listed nor shown; a run's file linking out reads as absent; a link to a run inside
    the runs directory is a run."""
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    for d in (runs / "good", outside / "theirs"):
        d.mkdir(parents=True)
    (outside / "theirs" / "config.yaml").write_text(f"task:\n  name: {SECRET}\n")
    (outside / "theirs" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5, SECRET: 1.0}) + "\n")
    (outside / "theirs" / "launch.log").write_text(f"{SECRET}\n")
    (outside / "summary.json").write_text(json.dumps({"before": {SECRET: 1.0}}))
    (runs / "good" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.25}) + "\n")
    (runs / "good" / "config.yaml").symlink_to(outside / "theirs" / "config.yaml")
    (runs / "good" / "summary.json").symlink_to(outside / "summary.json")
    (runs / "evil").symlink_to(outside / "theirs", target_is_directory=True)
    (runs / "alias").symlink_to(runs / "good", target_is_directory=True)
    (tmp_path / "uploads").mkdir()
    url, app, launcher = _serve_runs(tmp_path)
    try:
        answer = _stream(url, "refresh_all", None)
        assert SECRET not in answer and "evil" not in answer and "good" in answer and "alias" in answer
        for name in ("good", "alias"):
            answer = _stream(url, "show", name)
            assert "event: complete" in answer and SECRET not in answer and "0.25" in answer
        answer = _stream(url, "show", "evil")  # not offered: Gradio's dropdown or run_path refuses it
        assert SECRET not in answer and ("event: complete" not in answer or "**error:**" in answer)
        _log, status = _call(url, "poll", "evil")  # the Launch tab follows any name typed in
        assert status.startswith("**error:**") and "outside" in status and SECRET not in status + str(_log)
    finally:
        app.close()


def _serve_runs(root: Path):
    from mmrl.demo.app import launch_app

    port = _free_port()
    app, _play, launcher = launch_app(root / "runs", port=port, upload_dir=root / "uploads", block=False)
    return f"http://127.0.0.1:{port}", app, launcher
