"""The Tinker-compatible training service: the official ``tinker`` SDK's HTTP API (sessions,
LoRA training clients, futures) in front of the tenant engine, so a user's own training loop
drives training (docs/tinker.md; the wire: docs/tinker-wire.md).

``operations`` (futures, order, exactly once) and ``service`` (sessions, models, calls) are
transport-free; ``convert`` is the SDK's protobuf; ``app`` is the HTTP; ``server`` starts it.
Importing this package imports nothing heavy.
"""
