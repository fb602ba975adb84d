"""The gRPC variant: learner rank 0 streams full tensors to one receiver over loopback.

Rank 0 (sender) holds every parameter in full, as the learner's rank 0 does after
``full_state_dict_items`` (the FSDP all-gather that produces them is not timed here, which
favours gRPC), and calls ``WeightSyncService.UpdateWeights`` through ``GrpcWeightSyncClient``:
``iter_weight_chunks`` on the way out, the project's server (``start_server``) and
``receive_weights`` into its preallocated flat buffer on the way in. The receiver's servicer
does the real receive and keeps the views; it does not copy them into a model (the real
servicer's ``load_weights`` would add one memcpy). A sync is timed on the sender from the call
to the reply, which the server sends after the whole stream is in. The two processes meet
through the orchestrator's TCPStore. This module knows these two roles only.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from benchmarks.weight_sync.dist_worker import memory_kib
from benchmarks.weight_sync.spec import VariantSpec

ADDRESS_KEY = "grpc/address"
DONE_KEY = "grpc/done"
SENDER, RECEIVER = 0, 1


def run_grpc_rank(spec: VariantSpec, rank: int, results: Any) -> None:
    """Process entry point: rank 0 sends, rank 1 serves; puts ``(rank, report)`` on results."""
    import torch

    torch.set_num_threads(1)
    try:
        report = _send(spec) if rank == SENDER else _receive(spec)
    except Exception:  # the orchestrator reports it; a dead rank must not look like a hang
        report = {"error": traceback.format_exc()}
    results.put((rank, report))


def _store(spec: VariantSpec) -> Any:
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = dist.TCPStore("127.0.0.1", spec.store_port, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"bench/{spec.model}/{spec.label}/", store)


def _max_bytes(model_bytes: int) -> int:
    return max(model_bytes + 2**20, 64 * 2**20)


def _send(spec: VariantSpec) -> dict[str, Any]:
    from benchmarks.weight_sync.models import full_tensors, get_model, topology_of
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.weights.client import GrpcWeightSyncClient

    topology = topology_of(get_model(spec.model))
    store = _store(spec)
    baseline = memory_kib()
    named = list(full_tensors(topology).items())
    store.wait([ADDRESS_KEY])
    address = store.get(ADDRESS_KEY).decode()
    config = ChannelConfig(
        max_message_bytes=_max_bytes(topology.num_bytes),
        timeout_s=spec.timeout_s,
        chunk_bytes=spec.chunk_bytes,
    )
    config.validate()
    sender = GrpcWeightSyncClient(address, config)
    starts, ends, reply = [], [], None
    for i in range(spec.num_warmup + spec.num_syncs):
        t0 = time.perf_counter()
        reply = sender.send(named, policy_version=i + 1)
        t1 = time.perf_counter()
        if i >= spec.num_warmup:
            starts.append(t0)
            ends.append(t1)
    sender.close()
    memory = memory_kib()
    store.set(DONE_KEY, "1")
    assert reply is not None
    return {
        "rank": SENDER,
        "role": "sender",
        "starts": starts,
        "ends": ends,
        "bytes_sent": topology.num_bytes,
        "bytes_received": 0,
        "reply_bytes": reply.num_bytes,
        "memory": memory,
        "memory_baseline": baseline,
    }


def _receive(spec: VariantSpec) -> dict[str, Any]:
    import torch

    from benchmarks.weight_sync.models import full_tensors, get_model, topology_of
    from hybridflow.rpc.config import ServerConfig
    from hybridflow.rpc.server import start_server
    from hybridflow.v1 import weight_sync_pb2_grpc

    servicer_cls = _servicer_class()
    topology = topology_of(get_model(spec.model))
    max_bytes = _max_bytes(topology.num_bytes)
    servicer = servicer_cls(max_bytes)
    store = _store(spec)
    running = start_server(
        ServerConfig(max_message_bytes=max_bytes, max_workers=2),
        lambda server: weight_sync_pb2_grpc.add_WeightSyncServiceServicer_to_server(
            servicer, server
        ),
        [servicer_cls.SERVICE_NAME],
    )
    try:
        store.set(ADDRESS_KEY, running.address)
        store.wait([DONE_KEY])
        memory = memory_kib()
    finally:
        running.stop(1.0)
    expected = full_tensors(topology)
    got = dict(servicer.last)
    verified = list(got) == list(expected) and all(
        torch.equal(got[k], v) for k, v in expected.items()
    )
    return {
        "rank": RECEIVER,
        "role": "receiver",
        "bytes_sent": 0,
        "bytes_received": servicer.last_num_bytes,
        "num_updates": servicer.num_updates,
        "memory": memory,
        "verified": verified,
    }


def _servicer_class() -> Any:
    """Built lazily so this module imports without grpc (the spawn target lives here)."""
    import grpc

    from hybridflow.v1 import weight_sync_pb2, weight_sync_pb2_grpc
    from hybridflow.weights.convert import receive_weights

    class WeightReceiver(weight_sync_pb2_grpc.WeightSyncServiceServicer):
        """UpdateWeights only: the real ``receive_weights``; keeps the last tensors."""

        SERVICE_NAME = weight_sync_pb2.DESCRIPTOR.services_by_name["WeightSyncService"].full_name

        def __init__(self, max_bytes: int) -> None:
            self.max_bytes = max_bytes
            self.last: list[tuple[str, Any]] = []
            self.last_num_bytes = 0
            self.num_updates = 0

        def UpdateWeights(  # noqa: N802 (grpc method name)
            self, request_iterator: Any, context: grpc.ServicerContext
        ) -> weight_sync_pb2.UpdateWeightsResponse:
            start = time.perf_counter()
            self.last = []  # drop the previous buffer first, as a model swap would
            version, tensors, num_bytes = receive_weights(request_iterator, self.max_bytes)
            self.last, self.last_num_bytes = tensors, num_bytes
            self.num_updates += 1
            return weight_sync_pb2.UpdateWeightsResponse(
                policy_version=version,
                num_bytes=num_bytes,
                duration_s=time.perf_counter() - start,
            )

    return WeightReceiver
