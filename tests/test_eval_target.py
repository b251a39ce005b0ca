"""`mmrl eval` on a mistyped run directory names the runs there, not the 33 recipes (issue 51 item 20)."""

from __future__ import annotations

from conftest import mmrl_in_process


def _runs(tmp_path, *names):
    for name in names:
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text("task:\n  name: counting\n")
    (tmp_path / "runs" / "not-a-run").mkdir()  # no config.yaml, no checkpoints: not listed


def test_a_mistyped_run_directory_lists_the_runs_and_the_closest(tmp_path):
    _runs(tmp_path, "counting-20261206-101500", "exp1")
    for target in ("runs/counting-20261206-10150", "counting-20261206-10150"):  # a path, and a bare name
        r = mmrl_in_process("eval", target, cwd=tmp_path)
        err = " ".join(r.stderr.split())
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert (f"no run directory '{target}'; did you mean runs/counting-20261206-101500? "
                "(runs in runs/: counting-20261206-101500, exp1); a recipe is also accepted (`mmrl list` shows them)"
                in err), err
        assert "vlm/counting_tiny" not in err and "not-a-run" not in err


def test_a_mistyped_recipe_still_gets_the_recipes(tmp_path):
    _runs(tmp_path, "exp1")
    r = mmrl_in_process("eval", "vlm/countin_tiny", cwd=tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "did you mean 'vlm/counting_tiny'?" in err and "runs in" not in err
