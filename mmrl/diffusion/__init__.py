"""Generator RL: SDE samplers with log-probs, model adapters, the tiny generator, the policy."""
