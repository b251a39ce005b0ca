"""Dataset readers and deterministic synthetic generators."""
