"""Modality-free RL: rollout batch, advantages, objective, trainer loop, checkpoints, logging."""
