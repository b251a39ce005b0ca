"""The shipped recipes (``configs/``): their names, what ``mmrl train`` modality runs each, and the
one line that says what each is for (``mmrl list``, the demo's Launch tab)."""

from __future__ import annotations

from mmrl.config import builtin_config_names, builtin_config_path

__all__ = ["DEFAULT_RECIPES", "recipe_names", "recipe_summary", "modality_of", "family_modality", "split_args"]

# What `mmrl train MODALITY` runs without a recipe: the built-in tiny default of each modality.
DEFAULT_RECIPES = {"vlm": "vlm/counting_tiny", "video": "video/video_qa_tiny", "gui": "gui/synthetic_gui_tiny",
                   "diffusion": "diffusion/composition_tiny"}
SUMMARY_CHARS = 110


def split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """``(recipe, overrides)`` of a command's arguments: the first is a recipe when it is not a
    ``key=value`` override."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)


def recipe_names() -> list[str]:
    """Shipped recipes, the tiny ones (which run on a laptop CPU) first."""
    return sorted(builtin_config_names(), key=lambda n: ("tiny" not in n, n))


def modality_of(recipe: str) -> str:
    """The ``mmrl train`` modality of a shipped recipe: its folder (``vlm``, ``video``, ``gui``,
    ``diffusion``)."""
    return recipe.split("/", 1)[0]


def family_modality(family: str) -> str:
    """The task modality that ``mmrl train FAMILY`` trains (so the policy registered for it): that of
    its default recipe's task (``video`` and ``gui`` train the VLM on clips and screens)."""
    from mmrl.config import load_config
    from mmrl.registry import TASKS

    return TASKS.get(load_config(builtin_config_path(DEFAULT_RECIPES[family])).task.name).modality


def recipe_summary(name: str) -> str:
    """The first sentence of the recipe's opening comment, cut to one line."""
    lines = []
    for line in builtin_config_path(name).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    end = text.find(". ")
    text = text[:end + 1] if end >= 0 else text
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 3].rstrip() + "..."
