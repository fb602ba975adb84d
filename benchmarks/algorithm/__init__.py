"""Algorithm suite: GRPO, Dr. GRPO and PPO convergence at the same budget."""
