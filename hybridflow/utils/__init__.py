"""verl-compatible names for small utilities (``hybridflow.utils.mock``: the seed's mocks)."""
