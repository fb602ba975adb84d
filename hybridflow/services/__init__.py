"""The services: rollout (generate), reward (score), learner (train)."""
