"""The documentation: README.md (the front page) and the mkdocs site under docs/.

What is checked here, and what is not:

- the site builds with ``mkdocs build --strict`` (the command CI runs), and a broken link, a link to
  a section that does not exist or a page left out of the nav does fail that build (so the strict
  build is a real check, not a formality);
- every ``mmrl ...`` command shown in a code block (fenced, or indented) of README.md or docs/**/*.md *parses* with
  the real command line (typer's click command: the subcommand exists, its options and arguments
  are accepted), and every ``KEY=VALUE`` override in it is a config key that exists and takes that
  value (the overrides are loaded with ``mmrl.config.load_config``, on top of the shipped recipe the
  command names, if any). Running them is ``tests/test_docs_commands.py``'s job (each command with a
  budget suffix and the suite's stand-ins); this parse check is the fast one. Where a block shows a
  transcript (``$ mmrl ...`` followed by a ``config error: ...`` line), the error shown must be the
  error the config loader gives; an error of another kind that a transcript shows (one raised when
  the run is set up) is checked there, where the command runs.
  A command with a placeholder in angle brackets (``<run dir>``) is skipped; ``[--flag]`` is an
  optional flag and is checked with the flag;
- the README's test commands are the ones ``.ci/run`` runs, in the same order, and the copies of
  the README's blocks in the site (the test commands, the feature table) equal the README's;
- the README's relative links lead to files that exist, and the API reference covers every module
  of ``mmrl.public.PUBLIC_MODULES``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}


def _docs_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _mkdocs(config_dir: Path, site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed: pip install -e '.[docs]'")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=config_dir, capture_output=True, text=True, timeout=300)


# --------------------------------------------------------------------------- the strict build


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    r = _mkdocs(REPO, tmp_path / "site")
    problems = [line for line in r.stderr.splitlines() if not line.startswith("INFO")]
    assert r.returncode == 0, "\n".join(problems)[-4000:]  # a page outside the nav: add it to mkdocs.yml's nav
    assert (tmp_path / "site" / "index.html").is_file()
    api = (tmp_path / "site" / "api" / "task" / "index.html").read_text()
    assert "mmrl.task.Task" in api  # the API reference was generated from the docstrings


@pytest.mark.slow
def test_strict_mode_fails_on_a_broken_link_and_on_a_page_missing_from_the_nav(tmp_path):
    """The same build on a copy of the docs with a link to no page, a link to no section and a page
    outside the nav: each is a warning, so the strict build fails."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    (tmp_path / "mmrl").symlink_to(REPO / "mmrl")  # mkdocstrings reads the package from `paths: [.]`
    with open(tmp_path / "docs" / "index.md", "a") as f:
        f.write("\nSee [the page that is not there](no-such-page.md) and [its section](tasks.md#no-such-anchor).\n")
    (tmp_path / "docs" / "orphan-page.md").write_text("# Not in the nav\n")
    r = _mkdocs(tmp_path, tmp_path / "site")
    assert r.returncode != 0
    warnings = [line for line in r.stderr.splitlines() if line.startswith("WARNING")]
    assert any("no-such-page.md" in line for line in warnings), r.stderr[-4000:]
    assert any("no-such-anchor" in line for line in warnings), r.stderr[-4000:]
    assert any("orphan-page.md" in line for line in r.stderr.splitlines()), r.stderr[-4000:]


# --------------------------------------------------------------------------- commands shown in the docs


def _fenced_lines(path: Path):
    """(line number, text, following line) of each line inside a shell-like fenced block, and of
    each ``mmrl`` line of an indented code block (four spaces or more, outside fences); a line
    ending in a backslash is joined with the next."""
    lines = path.read_text().splitlines()
    fence, pending, start = None, "", 0
    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence is None and line.startswith("    ") and (pending or _INVOCATION.match(line.strip())):
            line = line.strip()  # an indented code block (a command shown under a list item)
        elif fence is None or fence not in SHELL_FENCES:
            continue
        if line.rstrip().endswith("\\"):
            pending, start = pending + line.rstrip()[:-1] + " ", start or i
            continue
        yield start or i, pending + line, lines[i] if i < len(lines) else ""
        pending, start = "", 0


# `mmrl ...`, `.venv/bin/mmrl ...`, `VAR=x mmrl ...`, `accelerate launch ... -m mmrl ...`, `$ mmrl ...`
_INVOCATION = re.compile(r"^(?:\$ )?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:(?:accelerate launch|torchrun)\b.*?-m\s+|\S*/)?mmrl(?:\s|$)")


def shown_commands() -> list[tuple[str, list[str], str]]:
    """(where, the arguments after ``mmrl``, the line after it) of every command shown in a fence."""
    out = []
    for path in _docs_pages():
        for lineno, line, following in _fenced_lines(path):
            for part in re.split(r"\s*(?:&&|;|\|\|?)\s*", line.strip()):
                if not _INVOCATION.match(part):
                    continue
                words = shlex.split(part.removeprefix("$ "), comments=True)
                at = next(i for i, w in enumerate(words) if w == "mmrl" or w.endswith("/mmrl"))
                out.append((f"{path.relative_to(REPO)}:{lineno}", words[at + 1:], following))
    return out


COMMANDS = shown_commands()


def test_the_docs_show_commands():
    """The extraction works (a change of the fences' layout must not silently check nothing)."""
    assert len(COMMANDS) >= 40
    where = {w.split(":")[0] for w, _, _ in COMMANDS}
    assert {"README.md", "docs/getting-started.md", "docs/generators.md"} <= where


def _parse(args: list[str]):
    """The click context of ``mmrl ARGS`` (click's ``make_context`` on the subcommand: parsed,
    nothing invoked) and the command's path. Typer carries its own copy of click, so its classes."""
    import typer
    import typer.core

    from mmrl.cli import app

    command = typer.main.get_command(app)
    path, rest = ["mmrl"], list(args)
    while isinstance(command, typer.core.TyperGroup):
        assert rest, f"`{' '.join(path)}` needs a subcommand"
        sub = command.get_command(command.context_class(command), rest[0])
        assert sub is not None, f"`{' '.join(path)}` has no subcommand {rest[0]!r}"
        command, path = sub, [*path, rest.pop(0)]
    try:
        ctx = command.make_context(" ".join(path), rest)
    except typer.Exit as exc:  # --help prints and exits
        assert exc.exit_code == 0
        ctx = None
    return ctx, path


def _check_overrides(ctx, where: str) -> tuple[str | None, list[str]]:
    """(shipped recipe or None, overrides) of a parsed command, each argument accounted for."""
    from mmrl.config import ConfigError, builtin_config_path

    args = list(ctx.params.get("args") or []) + list(ctx.args)
    for arg in args:  # the commands that take overrides let unknown options through to them
        assert not arg.startswith("-"), f"{where}: {arg} is not an option of this command"
    recipe = ctx.params.get("target")  # `mmrl eval TARGET`: a run directory or a recipe
    if args and "=" not in args[0] and recipe is None:
        recipe, args = args[0], args[1:]
    for arg in args:
        assert "=" in arg, f"{where}: {arg!r} is neither the recipe (first) nor a KEY=VALUE override"
    if recipe is not None and (recipe.startswith("configs/") or recipe.endswith("_tiny")):
        try:  # a shipped recipe the docs name must exist (a placeholder such as my_recipe.yaml is not one)
            return str(builtin_config_path(recipe)), args
        except ConfigError as exc:
            pytest.fail(f"{where}: {exc}")
    return None, args


@pytest.mark.parametrize("where,args,following", COMMANDS, ids=[f"{w} mmrl {' '.join(a)}"[:120] for w, a, _ in COMMANDS])
def test_every_command_shown_parses_and_names_real_config_keys(where, args, following):
    from mmrl.config import ConfigError, load_config

    if any("<" in a for a in args):
        pytest.skip("a placeholder in angle brackets")
    args = [a[1:-1] if a.startswith("[-") and a.endswith("]") else a for a in args]  # [--lora]: optional
    ctx, path = _parse(args)
    if ctx is None:  # --help
        return
    if "args" not in ctx.params and not ctx.args:
        return  # a command without config overrides: parsing is the check
    recipe, overrides = _check_overrides(ctx, where)
    if following.startswith("config error: "):  # a transcript of the error the docs show
        with pytest.raises(ConfigError) as exc:
            load_config(recipe, overrides)
        assert f"config error: {exc.value}" == following.strip(), where
        return
    try:
        load_config(recipe, overrides)
    except ConfigError as exc:
        pytest.fail(f"{where}: `{' '.join(path + args[len(path) - 1:])}`: {exc}")


# --------------------------------------------------------------------------- the README and its copies


def _block_after(text: str, heading: str) -> str:
    """The first fenced block after ``heading``."""
    m = re.search(re.escape(heading) + r"\n.*?(```[a-z]*\n.*?```)", text, re.S)
    assert m, heading
    return m.group(1)


def _commands_of(block: str) -> list[str]:
    return [" ".join(shlex.split(line, comments=True)) for line in block.splitlines()[1:-1]
            if shlex.split(line, comments=True)]


def test_ci_runs_exactly_the_readme_test_commands():
    readme = _commands_of(_block_after(README.read_text(), "## Tests"))
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    # .ci/run's own commands: top-level lines, less the shell's set-up and the chromium if-block
    ci = [" ".join(shlex.split(line, comments=True)) for line in ci_lines
          if line and not line[0].isspace() and not line.startswith(("#", "set ", "cd ", "if ", "fi"))]
    ci = [c for c in ci if c]
    chromium = [line for line in ci_lines if "apt-get install" in line]
    expected = []
    for command in readme:
        if command.startswith("apt-get install"):  # .ci/run installs it only where it is missing
            package = command.split()[-1]
            assert chromium and all(package in line for line in chromium), (command, chromium)
            continue
        expected.append("python -m " + command if command.startswith("pip install") else command)
    assert ci == expected
    assert "mkdocs build --strict --site-dir /tmp/mmrl-site" in expected


VIDEO_INSTALL = 'pip install -e ".[video]"'


def test_every_video_command_shows_the_video_install_line_with_it():
    """`mmrl train video` stops until the `video` extra is installed (issue 51, item 16): wherever a
    page shows the command, the install line is shown with it: in a code block, on a line of the
    same block above it (or on its own line); in prose or a table row, in the same paragraph or row, or
    in a code block of the page."""
    seen = 0
    for page in _docs_pages():
        lines = page.read_text().splitlines()
        fence_start = None
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fence_start = i if fence_start is None else None
                continue
            if "mmrl train video" not in line:
                continue
            seen += 1
            if fence_start is not None:
                context = lines[fence_start:i + 1]
            else:  # the paragraph (or table row) around it
                start, end = i, i
                while start > 0 and lines[start - 1].strip() and not line.startswith("|"):
                    start -= 1
                while end + 1 < len(lines) and lines[end + 1].strip() and not line.startswith("|"):
                    end += 1
                context = lines[start:end + 1]
            in_a_block = any(VIDEO_INSTALL in text for _, text, _ in _fenced_lines(page))
            assert any(VIDEO_INSTALL in c for c in context) or (fence_start is None and in_a_block), \
                f"{page.relative_to(REPO)}:{i + 1}: {line.strip()}"
    assert seen >= 6  # video.md's three, getting-started, models.md, the feature table in README and index


_WALL_TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:min|minutes)\b")
_TWO_CORES = re.compile(r"2-core|2 cores|2 CPU cores")
NOT_WALL_TIMES = ("nothing written for 10 minutes",)  # docs/demo.md: a run's idle time, not a measurement


def _with_conditions(text: str):
    """(line number, line, its context) of each line outside code fences: a paragraph is its own
    context; a table row, or a list item, is its own with the paragraph before its table or list
    (the "Measured ... (conditions):" that introduces it). A fenced line is its own context."""
    lines, out, block, before, fence = text.splitlines(), [], [], "", False

    def close():
        nonlocal block, before
        if not block:
            return
        lead = block[0][1].lstrip()
        if lead.startswith("|"):  # each row
            out.extend((i, line, before + "\n" + line) for i, line in block)
        elif lead.startswith(("- ", "* ")):  # each item, with the lines that continue it
            items: list[list] = []
            for i, line in block:
                if line.lstrip().startswith(("- ", "* ")) or not items:
                    items.append([])
                items[-1].append((i, line))
            for item in items:
                body = "\n".join(line for _, line in item)
                out.extend((i, line, before + "\n" + body) for i, line in item)
        else:
            before = "\n".join(line for _, line in block)
            out.extend((i, line, before) for i, line in block)
        block = []

    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            close()
            fence = not fence
        elif fence:
            out.append((i, line, line))
        elif line.strip():
            block.append((i, line))
        else:
            close()
    close()
    return out


def test_every_documented_wall_time_names_the_cpu_and_threads():
    """Issue 51 item 20: a wall time is a measurement with its conditions (the 2-core CPU and the
    thread count: the same run took 4 min 50 s at 2 threads and 9 min 6 s at 1). docs/performance.md's
    speed tables carry their own conditions column by column and are its owner's to keep."""
    missing = []
    for page in _docs_pages():
        if page.name == "performance.md":
            continue
        for i, line, context in _with_conditions(page.read_text()):
            if _WALL_TIME.search(line) and not any(s in line for s in NOT_WALL_TIMES) and \
                    not ("thread" in context and _TWO_CORES.search(context)):
                missing.append(f"{page.relative_to(REPO)}:{i}: {line.strip()[:100]}")
    assert not missing, "wall times without the CPU and thread count:\n" + "\n".join(missing)


def test_the_site_shows_the_readme_blocks_unchanged():
    readme = README.read_text()
    assert _block_after(readme, "## Tests") == _block_after((DOCS / "tests.md").read_text(), "# Tests")
    setup = _block_after(readme, "## Set up (two commands)")
    assert setup == _block_after((DOCS / "getting-started.md").read_text(), "## Set up (two commands)")
    assert setup == _block_after((DOCS / "index.md").read_text(), "# mmrl")

    def table(text: str) -> str:  # the README links docs/x.md, the site's index x.md
        return re.search(r"## What works today\n\n(.*?)\n\n", text, re.S).group(1).replace("](docs/", "](")

    assert table(readme) == table((DOCS / "index.md").read_text())


def test_the_readme_links_lead_somewhere():
    for target in re.findall(r"\]\(([^)]+)\)", README.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        assert (REPO / target.split("#")[0]).exists(), target
    assert len(README.read_text().splitlines()) <= 300  # the front page, not the manual


def test_the_api_reference_covers_the_public_modules():
    from mmrl.public import PUBLIC_MODULES

    shown = set(re.findall(r"^::: (\S+)", "\n".join(p.read_text() for p in (DOCS / "api").glob("*.md")), re.M))
    assert set(PUBLIC_MODULES) <= shown, sorted(set(PUBLIC_MODULES) - shown)
    assert {"mmrl.registry", "mmrl.api"} <= shown
