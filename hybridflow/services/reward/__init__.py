"""Reward service: scores responses in batches, picking a scorer by ``data_source``.

Pure parts: ``config`` (RewardConfig), ``rules`` (arith / gsm8k / MATH answer checks),
``registry`` (data_source → scorer, user scorers by import path) and ``scorers``
(``RewardScorer.score_batch`` with per-item error isolation). The grpc servicer, client and
``__main__`` wrap these; importing this package imports neither grpc nor torch.
"""
