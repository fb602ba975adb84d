"""The e2e tests' shared fixtures: the Slurm test cluster (tests/slurm_cluster.py)."""

from tests.slurm_cluster import slurm_cluster  # noqa: F401 (a fixture, found by name)
