"""Domain exceptions: what a service refuses or fails with, on both sides of the wire.

Servicers map them to gRPC status codes (``hybridflow.rpc.errors``); the gRPC clients turn
status codes back into them (``hybridflow.rpc.client_errors``), so the coordinator and the
schedule handle a failed call without knowing about gRPC, and the in-process twins of the
services raise the same classes. ``ValueError`` stays the one for bad input
(INVALID_ARGUMENT; a client raises ``BadRequest``, a ValueError); ``ServiceError`` is the
base of what is not the caller's fault. Imports nothing.
"""

from __future__ import annotations


class BadRequest(ValueError):
    """The service refused the request as invalid (INVALID_ARGUMENT): retrying it elsewhere
    cannot help."""


class ServiceError(RuntimeError):
    """A call to a service failed for a reason other than bad input."""


class Unavailable(ServiceError):
    """The service cannot serve now: unreachable, restarting, past its deadline, or its
    engine died (UNAVAILABLE / DEADLINE_EXCEEDED). Another replica, or a retry once it is
    back, may succeed."""


class FailedPrecondition(ServiceError):
    """The request is well-formed but the service's state refuses it (no checkpoint directory
    configured, a weight version that goes backwards): FAILED_PRECONDITION."""


class AlreadyExists(ServiceError):
    """The request would overwrite something that exists (a checkpoint): ALREADY_EXISTS."""


class ResourceExhausted(ServiceError):
    """A per-request limit of the service's config is exceeded, or the service is at its
    concurrency limit and sheds the call (alive, but busy): RESOURCE_EXHAUSTED, with the
    limit's config key in the message."""


class CheckpointRejected(FailedPrecondition):
    """A checkpoint that cannot be loaded into this job: it does not fit (another model shape,
    no critic where the algorithm needs one): FAILED_PRECONDITION. The message is one line
    naming the file or the state-dict key and what differs. A resume tries the next older
    checkpoint."""


class CheckpointCorrupt(CheckpointRejected):
    """A checkpoint whose files do not match its manifest (missing, truncated, other bytes)
    or that has no manifest: DATA_LOSS, naming the file."""


class DeliveryFailed(ServiceError):
    """A weight sync did not take effect on a replica: a slice landed other than it was sent
    (the default check), the engine left a tensor unloaded, or its log-probs on the learner's
    probe differ from the learner's (ABORTED). The message names the replica, the version
    and the tensor or the difference; the job must not train on as if it had."""
