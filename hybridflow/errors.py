"""Domain exceptions that servicers map to gRPC status codes (``hybridflow.rpc.errors``).

``ValueError`` stays the one for bad input (INVALID_ARGUMENT); this module adds what is not
the caller's fault. Imports nothing.
"""

from __future__ import annotations


class Unavailable(RuntimeError):
    """The service cannot serve (its engine died): UNAVAILABLE, with the cause as message."""
