"""The command line as a user meets it (the installed ``mmrl`` entry point, in a subprocess)."""

from __future__ import annotations

import subprocess
import sys


def _mmrl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "mmrl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_mistyped_override_exits_nonzero_naming_key_and_suggestion(tmp_path):
    r = _mmrl("train", "vlm", "algo.epslion=0.3", cwd=tmp_path)
    assert r.returncode == 2
    err = " ".join(r.stderr.split())
    assert "algo.epslion" in err and "algo.epsilon" in err
    assert not (tmp_path / "runs").exists()  # failed before doing anything


def test_mistyped_yaml_key_names_file_and_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("rollout:\n  num_generation: 4\n")
    r = _mmrl("train", "vlm", str(cfg), cwd=tmp_path)
    assert r.returncode == 2
    err = " ".join(r.stderr.split())
    assert "rollout.num_generation" in err and "line 2" in err and "rollout.num_generations" in err


def test_unknown_modality_is_a_clear_error(tmp_path):
    r = _mmrl("train", "audio", cwd=tmp_path)
    assert r.returncode == 2 and "not available" in r.stderr


def test_list_shows_builtin_plugins():
    r = _mmrl("list")
    assert r.returncode == 0, r.stderr
    assert "counting" in r.stdout and "grounding" in r.stdout and "iou" in r.stdout and "grpo" in r.stdout
