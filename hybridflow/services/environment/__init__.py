"""Environment service: runs many multi-turn episodes at once, one environment object per
episode, for a rollout loop in another process.

Pure parts: ``config`` (EnvironmentConfig, the ``environment:`` section) and ``episodes``
(``EpisodeHost``: ``hybridflow.envs.runner.LocalEnvironments`` behind the allow-list, the
bounds and the per-call timeout). ``convert``, the servicer, the client and ``__main__`` wrap
these; ``factory`` picks the in-process twin or the client. Importing this package imports
neither grpc nor torch.
"""
