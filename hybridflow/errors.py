"""Domain exceptions that servicers map to gRPC status codes (``hybridflow.rpc.errors``).

``ValueError`` stays the one for bad input (INVALID_ARGUMENT); this module adds what is not
the caller's fault. Imports nothing.
"""

from __future__ import annotations


class Unavailable(RuntimeError):
    """The service cannot serve (its engine died): UNAVAILABLE, with the cause as message."""


class FailedPrecondition(RuntimeError):
    """The request is well-formed but the service's state refuses it (no checkpoint directory
    configured, a weight version that goes backwards): FAILED_PRECONDITION."""


class AlreadyExists(RuntimeError):
    """The request would overwrite something that exists (a checkpoint): ALREADY_EXISTS."""


class ResourceExhausted(RuntimeError):
    """A per-request limit of the service's config is exceeded: RESOURCE_EXHAUSTED, with the
    limit's config key in the message."""
