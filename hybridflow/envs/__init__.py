"""Environments for multi-turn episodes: the contract (``base``), the built-in environments,
and the tool-call format they parse. Pure Python: no torch, no grpc, no tokenizer."""
