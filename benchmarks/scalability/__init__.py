"""Scalability suite: more replicas and learner ranks, plus simulated scale."""
