"""``python -m mmrl.cli``: the command line."""

from mmrl.cli import main

main()
