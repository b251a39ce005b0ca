"""How the commands explain themselves: the usage line of a recipe with overrides, and example
epilogs (plain click help: rich markup would swallow ``[CONFIG.yaml]`` and ``mmrl[video]``)."""

from __future__ import annotations

ARGS_METAVAR = "CONFIG.yaml KEY=VALUE"
ARGS_HELP = ("a recipe (a YAML file, or a shipped name from `mmrl list` such as vlm/grounding_tiny), then "
             "dotted key=value overrides such as algo.beta=0.04 train.steps=200")


def examples(*lines: str) -> str:
    """A help epilog of example commands (its first line, a lone backspace, tells click to keep the
    lines as written)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
