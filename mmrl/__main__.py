"""``python -m mmrl`` (and ``accelerate launch -m mmrl train vlm ...``): the command line."""

from mmrl.cli import main

main()
