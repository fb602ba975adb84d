"""The learner's SPMD group: process-group setup from torchrun's env, and the command relay.

HybridFlow's hybrid model: one controller outside (rank 0 serves gRPC), many inside (every
rank runs the same commands on its shard). ``CommandRelay.call`` on rank 0 broadcasts a command
and runs it locally; the other ranks sit in ``CommandRelay.serve`` running the same commands in
the same order until "shutdown". Commands must be deterministic on every rank (same validation,
same collectives). This module knows nothing about models, losses or gRPC.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hybridflow.errors import CheckpointRejected

log = logging.getLogger(__name__)

SHUTDOWN = "shutdown"
"""The command that ends ``serve`` on every rank (the handler runs it first)."""

Handler = Callable[[str, Any], Any]
"""Runs one command: ``handler(command, payload) -> result``."""


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the group."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def is_distributed(self) -> bool:
        """True when more than one rank shares the work."""
        return self.world_size > 1


def current_dist_info() -> DistInfo:
    """Rank and world size of the initialised default group, else a single rank."""
    if dist.is_available() and dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)
    return DistInfo(0, 1, 0)


def init_from_env(device: str = "cpu") -> DistInfo:
    """Initialise the default group from torchrun's env (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    Without those variables (a plain ``python -m`` start) nothing is initialised and the
    process is a single rank. gloo on CPU, NCCL on CUDA (which also selects cuda:LOCAL_RANK).
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo(0, 1, 0)
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl", init_method="env://")
        else:
            dist.init_process_group("gloo", init_method="env://")
    return current_dist_info()


def control_group() -> dist.ProcessGroup | None:
    """A gloo group for relayed commands (objects travel over CPU even when training on NCCL)."""
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


class CommandRelay:
    """Runs each command on every rank: rank 0 calls, the others serve.

    With one rank (or no process group) ``call`` just runs the handler. Results come from the
    caller's own handler; the other ranks' results are dropped, except that an iterator result
    is exhausted there (it may drive collectives, e.g. full-weight gathers).
    """

    def __init__(
        self, handler: Handler | None = None, group: dist.ProcessGroup | None = None, src: int = 0
    ) -> None:
        self.handler = handler
        self.group = group
        self.src = src
        self._distributed = dist.is_available() and dist.is_initialized()

    def _world_size(self) -> int:
        return dist.get_world_size(self.group) if self._distributed else 1

    def _broadcast(self, message: tuple[str, Any] | None) -> tuple[str, Any]:
        box: list[Any] = [message]
        dist.broadcast_object_list(box, src=self.src, group=self.group)
        result = box[0]
        assert result is not None, "relay broadcast delivered nothing"
        return result  # type: ignore[no-any-return]

    def call(self, command: str, payload: Any = None) -> Any:
        """Rank 0: broadcast ``(command, payload)`` to the group, then run it here."""
        handler = self._require_handler()
        if self._world_size() > 1:
            if dist.get_rank() != self.src:
                raise RuntimeError("CommandRelay.call runs on the source rank only")
            self._broadcast((command, payload))
        return handler(command, payload)

    def shutdown(self) -> None:
        """Rank 0: tell the serving ranks to stop (and run "shutdown" here, with payload ``()``)."""
        self.call(SHUTDOWN, ())

    def serve(self, handler: Handler | None = None) -> None:
        """Other ranks: run broadcast commands until "shutdown".

        A ``ValueError`` (bad input) or a refused checkpoint (``CheckpointRejected``: every rank
        refuses together) is logged and serving continues: validation is the same on every
        rank, so rank 0 raised it too and reports it to its client. Anything else ends
        the rank (torchrun then tears the group down).
        """
        if handler is not None:
            self.handler = handler
        run = self._require_handler()
        while True:
            command, payload = self._broadcast(None)
            try:
                result = run(command, payload)
            except (ValueError, CheckpointRejected) as exc:
                log.warning("relayed command %r rejected: %s", command, exc)
                continue
            if isinstance(result, Iterator):
                for _ in result:
                    pass
            if command == SHUTDOWN:
                return

    def _require_handler(self) -> Handler:
        if self.handler is None:
            raise RuntimeError(
                "CommandRelay needs a handler (pass one to the constructor or serve)"
            )
        return self.handler


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place SUM over the default group (no-op on a single rank)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """In-place MAX over the default group (no-op on a single rank)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order (just ``[obj]`` on a single rank)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
