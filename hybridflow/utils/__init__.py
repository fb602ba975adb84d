"""Small utilities: verl-compatible names (``mock``: the seed's mocks), and pure file logic
shared by services (``manifest``: checkpoint integrity; ``disk``: disk-full messages)."""
