"""The run directory: metrics and TensorBoard (logging), checkpoints, galleries, the episode viewer."""
