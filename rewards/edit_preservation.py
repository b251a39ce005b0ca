"""``edit_preservation``: how much of the source an edit kept outside the region it was asked to change.

1 - the mean absolute pixel difference (RGB in [0, 1]) between the result and the source over the
pixels outside the example's edit region (``ex["mask"]``, an (H, W) bool array, True where the edit
may change pixels): MagicBrush's L1 ("MagicBrush: A Manually Annotated Dataset for
Instruction-Guided Image Editing", Zhang et al., 2023) restricted to the unedited region, as
PIE-Bench ("PnP Inversion", Ju et al., 2024) restricts its background-preservation metrics (PSNR,
MSE, SSIM, LPIPS) to the pixels outside the edit mask. No LPIPS: it is computable on a CPU and needs
no weights. An example without a mask is scored on the whole image, uniformly weighted: the edit
itself then costs its own pixels' share, so the score is comparable between samples of one
instruction (a GRPO group) but not across instructions. Computed by
:func:`mmrl.measures.edits.masked_preservation` (the task's ``preservation`` metric too).
"""

from __future__ import annotations

from PIL import Image

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.edits import masked_preservation


@register_reward("edit_preservation", media="image")
def edit_preservation(completions, examples) -> list:
    """In [0, 1]; None for a completion that is not a PIL image or an example without a source
    image (``ex["source"]``)."""
    def score(image, ex):
        source = ex.get("source") if isinstance(ex, dict) else None
        if not isinstance(image, Image.Image) or not isinstance(source, Image.Image):
            return None
        return masked_preservation(image, source, ex.get("mask"))

    return score_each("edit_preservation", completions, examples, score, items="images")
