"""Vision-language policies: loading, processing, rollouts, log-probs, the tiny default."""
