"""The optional dependencies, and the install line that brings a missing one.

The base install leaves out what pulls a CUDA build of torch or a server (see pyproject's
``[project.optional-dependencies]``). A feature that needs one fails with Python's own
``No module named 'torchvision'`` from deep inside a library; :func:`install_hint` turns that into
the command that fixes it, the same way for every command and every optional module.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["EXTRA_OF_MODULE", "install_hint"]

# Top-level module -> the extra of pyproject.toml that installs it.
EXTRA_OF_MODULE = {
    "torchvision": "video", "decord": "video", "av": "video", "qwen_vl_utils": "video",
    "open_clip": "clip",
    "vllm": "vllm",
    "gradio": "demo",
    "trl": "bench",
    "pytest": "dev", "hypothesis": "dev", "playwright": "dev",
}
_NO_MODULE = re.compile(r"No module named '([^']+)'")


def install_hint(exc: ImportError) -> Optional[str]:
    """``error text; pip install "mmrl[EXTRA]"`` for a missing optional module, else None."""
    name = exc.name or ""
    if not name:
        m = _NO_MODULE.search(str(exc))
        name = m.group(1) if m else ""
    extra = EXTRA_OF_MODULE.get(name.split(".")[0])
    if extra is None:
        return None
    return f"{exc} (part of mmrl's optional \"{extra}\" dependencies): pip install \"mmrl[{extra}]\""
