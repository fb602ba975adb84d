"""Replicas that join and leave a running job: what a ``scale`` request may ask, checked up
front (pure: no threads, no I/O), and how the control API reports each replica.

A request adds replicas at new addresses and drains others. It is refused whole, before
anything changes, when an address is not one ``HOST:PORT``, is named twice, is added while
it already serves the job (joining, serving, failed or draining), or is removed while it
does not; when it would leave no replica serving (the joining ones do not count: they may
never come); or when the job would hold more than ``MAX_REPLICAS`` replicas. What happens
next is the dispatchers' (``dispatch.py``): an added replica serves once its catch-up sync
passed its check, a drained one after its request in flight ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_REPLICAS = 256
"""Replicas one job holds at most (added ones included): each has a dispatcher thread and a
weight-sync group on every learner rank."""

LIVE = ("joining", "serving", "failed", "draining")
"""Replica states that still belong to the job (``ReplicaDispatcher.state``)."""


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica as the control API reports it."""

    address: str
    state: str
    """``ReplicaDispatcher.state``: joining, serving, failed, draining, removed, stopped or
    lost."""
    policy_version: int
    """The version last published to it."""


def check_scale(add: Sequence[str], remove: Sequence[str], states: Mapping[str, str]) -> None:
    """Raises ``ValueError`` naming what is wrong with a request to add ``add`` and drain
    ``remove``, given each known replica's state by address (``states``; a replica removed
    earlier may be added again)."""
    if not add and not remove:
        raise ValueError("scale: name at least one replica to add or to remove")
    named = [*add, *remove]
    for address in named:
        _check_address(address)
    twice = sorted({a for a in named if named.count(a) > 1})
    if twice:
        raise ValueError(f"scale: {twice} named more than once")
    live = {a: s for a, s in states.items() if s in LIVE}
    for address in add:
        if address in live:
            raise ValueError(f"scale: {address} is already a replica of this job ({live[address]})")
    for address in remove:
        if address not in live:
            raise ValueError(
                f"scale: {address} is not a replica of this job; its replicas: {sorted(live)}"
            )
    serving_after = [a for a, s in live.items() if s == "serving" and a not in remove]
    if remove and not serving_after:
        raise ValueError(
            "scale: that would leave no replica serving; add one first and remove the others "
            "once it serves (hybridflow-coordinator status shows each replica's state)"
        )
    if len(live) + len(add) > MAX_REPLICAS:
        raise ValueError(
            f"scale: {len(live)} replicas and {len(add)} more exceed the bound of {MAX_REPLICAS}"
        )


def _check_address(address: str) -> None:
    """One ``HOST:PORT`` with a named host (not a wildcard) and a port in [1, 65535]."""
    host, sep, port = address.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (
        not sep
        or not bare
        or bare in ("0.0.0.0", "::", "*")
        or any(c in address for c in ",/ ")
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
    ):
        raise ValueError(f"scale: {address!r} is not one HOST:PORT of a rollout replica")
