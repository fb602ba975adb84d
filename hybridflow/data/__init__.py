"""Datasets: the built-in arithmetic task (``arith``) and verl-format file loaders."""
