"""Image-side helpers shared by tasks, rewards and policies (public: plugins may import them):
coordinate spaces (:mod:`~mmrl.media.coords`), the one conversion of decoded images to RGB
(:mod:`~mmrl.media.pixels`), gallery drawing (:mod:`~mmrl.media.draw`),
image perturbations (:mod:`~mmrl.media.perturb`) and per-frame scoring of clips by image rewards
(:mod:`~mmrl.media.clips`)."""
