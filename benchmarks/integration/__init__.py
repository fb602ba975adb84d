"""Integration suite: component microbenchmarks against plain baselines."""
