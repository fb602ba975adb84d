"""Launching the services as processes (used by deploy/launch.sh, tests and benchmarks)."""
