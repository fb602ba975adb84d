"""Batch transfer MB/s: a TrainBatch through the learner's chunked gRPC stream against raw TCP.

gRPC TrainStep: ``GrpcLearnerClient.train_step`` (encode, serialize, 1 MiB chunks) into a
real ``LearnerServicer`` on a real server in another process (assemble into a preallocated
buffer, parse, convert, token-id checks); its learner answers at once, so the time is the
transfer path. gRPC byte stream: the same serialized bytes as Chunk messages into a
preallocated buffer on the same server (the transport without the TrainBatch codec). TCP: the
same bytes over a loopback socket into a preallocated buffer in another process, acknowledged
by one byte. Encode and decode are also timed alone in this process.
Knows the learner's client, servicer and codec; nothing of training.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import socket
from typing import Any

from benchmarks.integration.config import TransferBench
from benchmarks.integration.timing import DetailedLog, stats, timed

MIB = 2**20
VOCAB = 101
SINK_SERVICE = "hybridflow.bench.ByteSink"
"""A bytes-only chunk stream on the same server: the transport without the TrainBatch codec."""


def make_samples(cfg: TransferBench) -> list[Any]:
    from hybridflow.types import TrainSample

    rng = random.Random(0)
    return [
        TrainSample(
            prompt_ids=[rng.randrange(3, VOCAB) for _ in range(cfg.prompt_tokens)],
            response_ids=[rng.randrange(3, VOCAB) for _ in range(cfg.response_tokens)],
            rollout_logprobs=[-rng.random() for _ in range(cfg.response_tokens)],
            reward=float(i % 2),
            group_id=i // 8,
            policy_version=0,
        )
        for i in range(cfg.num_samples)
    ]


def _grpc_server(out: Any, stop: Any, max_bytes: int, chunk_bytes: int) -> None:
    """A real learner servicer whose learner answers at once (child process)."""
    import grpc

    from hybridflow.rpc.codec import assemble_chunks
    from hybridflow.rpc.config import ServerConfig
    from hybridflow.rpc.server import start_server
    from hybridflow.services.learner.servicer import SERVICE_NAME, LearnerServicer
    from hybridflow.types import TrainStepResult
    from hybridflow.v1 import common_pb2, learner_pb2, learner_pb2_grpc

    def dispatch(command: str, args: tuple[Any, ...]) -> Any:
        if command != "train_step":
            raise ValueError(f"transfer benchmark server: no {command}")
        return TrainStepResult(0, {"num_samples": float(len(args[0]))})

    servicer = LearnerServicer(
        dispatch,
        lambda: learner_pb2.LearnerInfo(model="bench", algorithm="grpo", world_size=1),
        VOCAB,
        max_bytes,
        chunk_bytes,
    )

    def sink(chunks: Any, context: Any) -> Any:
        assemble_chunks(chunks, max_bytes)  # into one preallocated buffer, nothing else
        return common_pb2.Empty()

    sink_handler = grpc.method_handlers_generic_handler(
        SINK_SERVICE,
        {
            "Push": grpc.stream_unary_rpc_method_handler(
                sink,
                request_deserializer=common_pb2.Chunk.FromString,
                response_serializer=common_pb2.Empty.SerializeToString,
            )
        },
    )

    def register(server: Any) -> None:
        learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server)
        server.add_generic_rpc_handlers((sink_handler,))

    running = start_server(ServerConfig(max_message_bytes=max_bytes), register, [SERVICE_NAME])
    out.put(running.address)
    stop.wait()
    running.stop(1.0)


def _tcp_server(out: Any) -> None:
    """Receives length-prefixed payloads into a preallocated buffer, acks each (child)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        out.put(srv.getsockname()[1])
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            buf = bytearray()
            while True:
                header = _recv_exact(conn, bytearray(8))
                if header is None:
                    return
                size = int.from_bytes(header, "little")
                if len(buf) < size:
                    buf = bytearray(size)
                if _recv_exact(conn, memoryview(buf)[:size]) is None:
                    return
                conn.sendall(b"k")


def _recv_exact(conn: socket.socket, view: Any) -> Any:
    view = memoryview(view)
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:], len(view) - got)
        if n == 0:
            return None
        got += n
    return view


def run(cfg: TransferBench, log: DetailedLog) -> dict[str, Any]:
    from hybridflow.rpc.codec import iter_chunks, receive_message
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.services.learner import convert
    from hybridflow.services.learner.client import GrpcLearnerClient
    from hybridflow.v1 import learner_pb2

    samples = make_samples(cfg)
    chunk = cfg.chunk_kib * 1024
    payload = b"".join(convert.batch_pieces(samples))  # what the client streams
    size = len(payload)
    max_bytes = max(4 * size, 64 * MIB)
    mb = size / 1e6

    enc_s, _ = timed(
        lambda: len(b"".join(convert.batch_pieces(samples))),
        cfg.repeats, cfg.warmup, log, "transfer", "encode", lambda n: {"bytes": n},
    )  # fmt: skip
    dec_s, _ = timed(
        lambda: len(convert.batch_from_proto(
            receive_message(iter_chunks(payload, chunk), learner_pb2.TrainBatch, max_bytes)
        )),
        cfg.repeats, cfg.warmup, log, "transfer", "decode", lambda n: {"samples": n},
    )  # fmt: skip

    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    grpc_proc = ctx.Process(target=_grpc_server, args=(queue, stop, max_bytes, chunk), daemon=True)
    tcp_proc = ctx.Process(target=_tcp_server, args=(queue,), daemon=True)
    try:
        grpc_proc.start()
        address = queue.get(timeout=120)
        client = GrpcLearnerClient(
            address, ChannelConfig(max_message_bytes=max_bytes, chunk_bytes=chunk)
        )
        grpc_s, _ = timed(
            lambda: client.train_step(samples).metrics["num_samples"],
            cfg.repeats, cfg.warmup, log, "transfer", "grpc_train_step", lambda n: {"bytes": size},
        )  # fmt: skip
        client.close()
        from hybridflow.rpc.channel import make_channel
        from hybridflow.v1 import common_pb2

        channel = make_channel(
            address, ChannelConfig(max_message_bytes=max_bytes, chunk_bytes=chunk)
        )
        push = channel.stream_unary(
            f"/{SINK_SERVICE}/Push",
            request_serializer=common_pb2.Chunk.SerializeToString,
            response_deserializer=common_pb2.Empty.FromString,
        )
        stream_s, _ = timed(
            lambda: push(iter_chunks(payload, chunk), timeout=120) and size,
            cfg.repeats, cfg.warmup, log, "transfer", "grpc_byte_stream", lambda n: {"bytes": size},
        )  # fmt: skip
        channel.close()
        tcp_proc.start()
        port = queue.get(timeout=120)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            # No Nagle: the small header and the 1-byte ack must not wait for delayed ACKs.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            header = size.to_bytes(8, "little")
            ack = bytearray(1)

            def send() -> int:
                sock.sendall(header)
                sock.sendall(payload)
                if _recv_exact(sock, ack) is None:
                    raise RuntimeError("raw TCP receiver closed early")
                return size

            tcp_s, _ = timed(send, cfg.repeats, cfg.warmup, log, "transfer", "raw_tcp",
                             lambda n: {"bytes": n})  # fmt: skip
    finally:
        stop.set()
        for proc in (grpc_proc, tcp_proc):
            if proc.pid is not None:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    grpc_med, tcp_med = stats(grpc_s)["median_s"], stats(tcp_s)["median_s"]
    stream_med = stats(stream_s)["median_s"]
    return {
        "payload_bytes": size,
        "num_samples": cfg.num_samples,
        "chunk_bytes": chunk,
        "encode": {**stats(enc_s), "mb_per_s": mb / stats(enc_s)["median_s"]},
        "decode": {**stats(dec_s), "mb_per_s": mb / stats(dec_s)["median_s"]},
        "grpc_train_step": {**stats(grpc_s), "mb_per_s": mb / grpc_med},
        "grpc_byte_stream": {**stats(stream_s), "mb_per_s": mb / stream_med},
        "raw_tcp": {**stats(tcp_s), "mb_per_s": mb / tcp_med},
        "grpc_over_tcp_mb_per_s": tcp_med / grpc_med,
        "grpc_stream_over_tcp_mb_per_s": tcp_med / stream_med,
    }
