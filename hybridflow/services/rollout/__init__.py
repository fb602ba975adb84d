"""Rollout service: engines that sample completions (token ids, log-probs) for prompts."""
