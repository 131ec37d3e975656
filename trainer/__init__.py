"""Trainer-side building blocks for RL post-training (advantages, losses, KL control)."""
