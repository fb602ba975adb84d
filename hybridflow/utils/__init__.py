"""Small utilities: verl-compatible names (``mock``: the seed's mocks), pure file logic
shared by services (``manifest``: checkpoint integrity; ``disk``: disk-full messages), and the
``--config/--set`` command line every process shares (``config_args``; no yaml at import, so
``--help`` stays instant)."""
