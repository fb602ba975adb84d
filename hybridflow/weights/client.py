"""The learner's handle on one replica's WeightSyncService (gRPC)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc
import numpy as np

from hybridflow.errors import DeliveryFailed, Unavailable
from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.config import ChannelConfig
from hybridflow.types import WeightUpdateReport
from hybridflow.v1 import common_pb2, weight_sync_pb2, weight_sync_pb2_grpc
from hybridflow.weights.convert import (
    FRAMING_BYTES,
    group_spec_to_proto,
    iter_weight_chunks,
    replica_description_from_proto,
)
from hybridflow.weights.spec import GroupSpec, ReplicaDescription

if TYPE_CHECKING:
    import torch


class GrpcWeightSyncClient:
    """Streams whole weights to a replica, or drives its part of a torch.distributed sync."""

    def __init__(self, address: str, config: ChannelConfig | None = None) -> None:
        self.address = address
        self._config = config or ChannelConfig()
        self._channel = make_channel(address, self._config)
        self._stub = weight_sync_pb2_grpc.WeightSyncServiceStub(self._channel)
        self._wire_dtype: str | None = None
        """The dtype the replica holds its weights in ("" its layout does not say)."""

    def send(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> WeightUpdateReport:
        """The gRPC transport: every tensor, streamed in chunks in the replica's dtype (its
        ``Describe``, asked once), then their fingerprints; returns once applied/staged.
        ``DeliveryFailed`` when the replica's check of a tensor refused it (ABORTED)."""
        start = time.perf_counter()
        if self._wire_dtype is None:
            self._wire_dtype = self._replica_dtype()
        try:
            reply = self._stub.UpdateWeights(
                iter_weight_chunks(
                    named_tensors, policy_version, self._chunk_bytes(), self._wire_dtype
                ),
                timeout=self._config.timeout_s,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.ABORTED:
                raise DeliveryFailed(f"replica {self.address}: {exc.details()}") from exc
            raise
        return WeightUpdateReport(
            reply.policy_version, reply.num_bytes, time.perf_counter() - start
        )

    def _chunk_bytes(self) -> int:
        """``chunk_bytes``, less what a message's framing adds where the message limit would
        otherwise not hold a whole chunk (a 1 MiB chunk under a 1 MiB limit)."""
        return min(self._config.chunk_bytes, self._config.max_message_bytes - FRAMING_BYTES)

    def _replica_dtype(self) -> str:
        """The dtype its ``Describe`` names; "" (send as they are) from a receiver that has no
        ``Describe`` (a bare ``UpdateWeights`` sink)."""
        try:
            return self.describe().layout.dtype
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                return ""
            raise

    def tensor_parallel_size(self) -> int:
        """Destination ranks this replica brings to a weight-sync group."""
        reply = self._stub.Describe(common_pb2.Empty(), timeout=self._config.timeout_s)
        return int(reply.tensor_parallel_size) or 1

    def describe(self) -> ReplicaDescription:
        """Its TP size and weight layout (family and placements, from the model it loaded)."""
        reply = self._stub.Describe(common_pb2.Empty(), timeout=self._config.timeout_s)
        return replica_description_from_proto(reply)

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str:
        """Blocks until the weight-sync group has formed; returns the replica's plan hash."""
        reply = self._stub.JoinWeightSync(
            group_spec_to_proto(spec, replica_index), timeout=spec.timeout_s + 10
        )
        return str(reply.plan_hash)

    def receive_weights(self, policy_version: int, timeout_s: float) -> int:
        """Blocks while the replica receives one sync; returns the bytes it received.
        ``DeliveryFailed`` when its check found a slice other than was sent (ABORTED)."""
        try:
            reply = self._stub.ReceiveWeights(
                weight_sync_pb2.ReceiveWeightsRequest(policy_version=policy_version),
                timeout=timeout_s,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.ABORTED:
                raise DeliveryFailed(exc.details() or "") from exc
            raise
        return int(reply.num_bytes)

    def probe_logprobs(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int], timeout_s: float
    ) -> tuple[np.ndarray, int]:
        """(log-probs of ``response_ids`` after ``prompt_ids`` under the weights the replica
        serves, temperature 1; that policy version)."""
        reply = self._stub.ProbeLogprobs(
            weight_sync_pb2.ProbeLogprobsRequest(
                prompt_ids=list(prompt_ids), response_ids=list(response_ids)
            ),
            timeout=timeout_s,
        )
        return np.asarray(reply.logprobs, dtype=np.float32), int(reply.policy_version)

    def close(self) -> None:
        self._channel.close()


def split_target(target: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) → (host, port); ValueError naming the target."""
    host, sep, port_text = target.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"target {target!r}: expected host:port")
    return host, int(port_text)


def check_targets(targets: Sequence[str], allowed_hosts: Sequence[str]) -> None:
    """ValueError naming the first target that is not host:port on an allowed host."""
    if not targets:
        raise ValueError("targets: at least one replica address is required")
    allowed = set(allowed_hosts)
    for target in targets:
        host, _ = split_target(target)
        if host not in allowed:
            raise ValueError(
                f"target {target!r}: host {host!r} is not in weight_sync.allowed_hosts "
                f"{sorted(allowed)}"
            )


def probe_replica(address: str, config: ChannelConfig | None, timeout_s: float) -> None:
    """Raises ``Unavailable`` naming ``address`` unless its WeightSyncService answers
    Describe within ``timeout_s`` (no retries: a dead replica is reported at once)."""
    channel = make_channel(address, config)
    try:
        _describe(channel, address, timeout_s)
    finally:
        channel.close()


def _describe(channel: grpc.Channel, address: str, timeout_s: float) -> None:
    try:
        weight_sync_pb2_grpc.WeightSyncServiceStub(channel).Describe(
            common_pb2.Empty(), timeout=timeout_s
        )
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        raise Unavailable(
            f"replica {address} did not answer within weight_sync.connect_timeout_s="
            f"{timeout_s:g}s ({code.name if code else 'error'}); not publishing"
        ) from exc


class ReplicaProber:
    """``probe_replica`` over one kept channel per replica: a publish's liveness probe is then
    one round trip, not a connection (a new channel cost ~4 ms of every async step's
    publish here). A probe that fails drops its channel, so the next one connects afresh
    (to a restarted replica on the same address, say)."""

    def __init__(self) -> None:
        self._channels: dict[tuple[str, int], grpc.Channel] = {}
        self._lock = threading.Lock()

    def __call__(self, address: str, config: ChannelConfig | None, timeout_s: float) -> None:
        key = (address, id(config))
        with self._lock:
            kept = self._channels.get(key)
            channel = kept if kept is not None else make_channel(address, config)
            self._channels[key] = channel
        try:
            _describe(channel, address, timeout_s)
        except Unavailable:
            with self._lock:
                if self._channels.get(key) is channel:
                    del self._channels[key]
            channel.close()
            raise

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
