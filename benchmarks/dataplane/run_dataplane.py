"""Data plane at wire speed: TrainStep and Generate payloads against a bare gRPC byte stream.

Both sides run in one process pair (client here, a real gRPC server in a child process), the
same bytes each way, timed alternately:

- TrainStep: ``GrpcLearnerClient.train_step`` (domain samples → TrainBatch → 1 MiB chunks)
  into a real ``LearnerServicer`` (assemble, parse, samples as array views, vocabulary and
  finiteness checks) whose learner answers at once. Bare: the same serialized bytes as Chunk
  messages into a buffer on the same server (``assemble_chunks``, nothing else).
- Generate: ``GrpcRolloutClient.generate`` against a real ``RolloutServicer`` over a
  ``LocalRollout`` whose engine hands back the same precomputed completions at once (so the
  time is request, limits, packing, the response stream and the client's decode into
  ``Completion`` objects). Bare: the same response bytes streamed back as Chunk messages and
  joined by the client.

    python benchmarks/dataplane/run_dataplane.py [--sequences 512] [--tokens 1024]

Do not run it while anything else uses the CPU: the ratios are only meaningful side by side.
It also runs from an older checkout (copy it there) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

VOCAB = 101
MIB = 2**20
SINK = "hybridflow.bench.Bytes"
"""Bytes-only methods on the same servers: Push (client → server), Pull (server → client)."""


def _arrays(num: int, length: int, seed: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, size=(num, length), dtype=np.int32)
    logprobs = -rng.random((num, length), dtype=np.float32)
    return ids, logprobs


def train_samples(num: int, prompt_tokens: int, response_tokens: int) -> list[Any]:
    from hybridflow.types import TrainSample

    prompts, _ = _arrays(num, prompt_tokens, 0)
    responses, logprobs = _arrays(num, response_tokens, 1)
    return [
        TrainSample(prompts[i], responses[i], logprobs[i], float(i % 2), i // 8, 0)
        for i in range(num)
    ]


class CannedEngine:
    """An engine that returns the same completions at once (the transport is what is timed)."""

    policy_version = 0
    eos_token_id = 2
    vocab_size = VOCAB
    tensor_parallel_size = 1
    between_steps = None

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._made: dict[tuple[int, int], Any] = {}

    def generate(self, prompts: Any, params: Any, should_stop: Any = None) -> Any:
        key = (len(prompts), params.n)
        if key not in self._made:
            self._made[key] = self._make(len(prompts), params.n)
        return self._made[key]

    def _make(self, num_prompts: int, n: int) -> Any:
        from hybridflow.types import Completion

        ids, logprobs = _arrays(num_prompts * n, self.tokens, 2)
        return [
            [Completion(ids[p * n + j], logprobs[p * n + j], "length", 0) for j in range(n)]
            for p in range(num_prompts)
        ]

    def load_weights(self, named_tensors: Any, policy_version: int) -> None:
        raise NotImplementedError

    dead_reason = None

    def on_dead(self, callback: Any) -> None:
        return None

    def close(self) -> None:
        return None


def _bytes_handler(max_bytes: int, chunk: int, payloads: dict[str, bytes]) -> Any:
    import grpc

    from hybridflow.rpc.codec import assemble_chunks, iter_chunks
    from hybridflow.v1 import common_pb2

    def push(chunks: Any, context: Any) -> Any:
        assemble_chunks(chunks, max_bytes)
        return common_pb2.Empty()

    def pull(request: Any, context: Any) -> Any:
        yield from iter_chunks(payloads["generate"], chunk)

    return grpc.method_handlers_generic_handler(
        SINK,
        {
            "Push": grpc.stream_unary_rpc_method_handler(
                push,
                request_deserializer=common_pb2.Chunk.FromString,
                response_serializer=common_pb2.Empty.SerializeToString,
            ),
            "Pull": grpc.unary_stream_rpc_method_handler(
                pull,
                request_deserializer=common_pb2.Empty.FromString,
                response_serializer=common_pb2.Chunk.SerializeToString,
            ),
        },
    )


def _server(out: Any, stop: Any, args: dict[str, Any]) -> None:
    """Learner and rollout servicers plus the bare byte methods (child process)."""
    from hybridflow.rpc.config import ServerConfig
    from hybridflow.rpc.server import start_server
    from hybridflow.services.learner.servicer import SERVICE_NAME as LEARNER
    from hybridflow.services.learner.servicer import LearnerServicer
    from hybridflow.services.rollout import convert
    from hybridflow.services.rollout.local import LocalRollout
    from hybridflow.services.rollout.requests import RequestLimits
    from hybridflow.services.rollout.servicer import SERVICE_NAME as ROLLOUT
    from hybridflow.services.rollout.servicer import RolloutServicer
    from hybridflow.types import SamplingParams, TrainStepResult
    from hybridflow.v1 import learner_pb2, learner_pb2_grpc, rollout_pb2, rollout_pb2_grpc

    max_bytes, chunk = args["max_bytes"], args["chunk"]

    def dispatch(command: str, call_args: tuple[Any, ...]) -> Any:
        if command != "train_step":
            raise ValueError(f"data-plane benchmark server: no {command}")
        return TrainStepResult(0, {"num_samples": float(len(call_args[0]))})

    learner = LearnerServicer(
        dispatch,
        lambda: learner_pb2.LearnerInfo(model="bench", algorithm="grpo", world_size=1),
        VOCAB,
        max_bytes,
        chunk,
    )
    engine = CannedEngine(args["tokens"])
    rollout = RolloutServicer(
        LocalRollout(engine, "bench"),  # type: ignore[arg-type]
        prompts_per_message=args["per_message"],
        max_bytes=max_bytes,
        limits=RequestLimits(max_tokens_per_request=1 << 30),
    )
    params = SamplingParams(max_new_tokens=args["tokens"], n=args["n"])
    groups = engine.generate([[3]] * args["prompts"], params)
    flat = [c for g in groups for c in g]
    reply = rollout_pb2.GenerateResponse(  # the bytes one full reply carries
        request_id="bench", first_prompt_index=0, num_prompts=len(groups)
    )
    reply.completions.CopyFrom(convert.completions_to_proto(flat))
    payloads = {"generate": reply.SerializeToString()}

    def register(server: Any) -> None:
        learner_pb2_grpc.add_LearnerServiceServicer_to_server(learner, server)
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(rollout, server)
        server.add_generic_rpc_handlers((_bytes_handler(max_bytes, chunk, payloads),))

    running = start_server(
        ServerConfig(max_message_bytes=max_bytes, allow_unauthenticated=True),
        register,
        [LEARNER, ROLLOUT],
    )
    out.put((running.address, len(payloads["generate"])))
    stop.wait()
    running.stop(1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1024, help="response tokens per sequence")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--n", type=int, default=8, help="completions per prompt (Generate)")
    parser.add_argument(
        "--per-message", type=int, default=64, help="rollout.prompts_per_message (Generate)"
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--out", default="", help="results directory (default results/dataplane_<time>)"
    )
    ns = parser.parse_args()

    import numpy as np

    from hybridflow.rpc.channel import make_channel
    from hybridflow.rpc.codec import assemble_chunks, iter_chunks
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.services.learner import convert
    from hybridflow.services.learner.client import GrpcLearnerClient
    from hybridflow.services.rollout.client import GrpcRolloutClient
    from hybridflow.types import SamplingParams
    from hybridflow.v1 import common_pb2

    if ns.sequences % ns.n:
        parser.error("--sequences must be a multiple of --n")
    prompts = ns.sequences // ns.n
    samples = train_samples(ns.sequences, ns.prompt_tokens, ns.tokens)
    train_payload = convert.batch_to_proto(samples).SerializeToString()
    chunk = MIB
    max_bytes = max(8 * len(train_payload), 256 * MIB)
    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    args = {
        "max_bytes": max_bytes,
        "chunk": chunk,
        "tokens": ns.tokens,
        "n": ns.n,
        "prompts": prompts,
        "per_message": ns.per_message,
    }
    proc = ctx.Process(target=_server, args=(queue, stop, args), daemon=True)
    proc.start()
    try:
        address, generate_bytes = queue.get(timeout=180)
        channel_cfg = ChannelConfig(max_message_bytes=max_bytes, chunk_bytes=chunk, timeout_s=120)
        learner = GrpcLearnerClient(address, channel_cfg)
        rollout = GrpcRolloutClient(address, channel_cfg)
        channel = make_channel(address, channel_cfg)
        push = channel.stream_unary(
            f"/{SINK}/Push",
            request_serializer=common_pb2.Chunk.SerializeToString,
            response_deserializer=common_pb2.Empty.FromString,
        )
        pull = channel.unary_stream(
            f"/{SINK}/Pull",
            request_serializer=common_pb2.Empty.SerializeToString,
            response_deserializer=common_pb2.Chunk.FromString,
        )
        prompt_ids = [np.array([3 + i % 50], dtype=np.int32) for i in range(prompts)]
        params = SamplingParams(max_new_tokens=ns.tokens, n=ns.n)

        def train_step() -> None:
            assert learner.train_step(samples).metrics["num_samples"] == len(samples)

        def generate() -> None:
            groups = rollout.generate(prompt_ids, params, "bench")
            assert sum(len(c.token_ids) for g in groups for c in g) == ns.sequences * ns.tokens

        def bare_push() -> None:
            push(iter_chunks(train_payload, chunk), timeout=120)

        def bare_pull() -> None:
            assert (
                len(assemble_chunks(pull(common_pb2.Empty(), timeout=120), max_bytes))
                == generate_bytes
            )

        timings: dict[str, list[float]] = {
            k: [] for k in ("train_step", "push", "generate", "pull")
        }
        for fn, _key in (
            (train_step, "train_step"),
            (bare_push, "push"),
            (generate, "generate"),
            (bare_pull, "pull"),
        ):
            fn()  # warm-up
        for _ in range(ns.repeats):  # alternate, so drift hits both sides alike
            for fn, key in (
                (train_step, "train_step"),
                (bare_push, "push"),
                (generate, "generate"),
                (bare_pull, "pull"),
            ):
                start = time.perf_counter()
                fn()
                timings[key].append(time.perf_counter() - start)
        channel.close()
        learner.close()
        rollout.close()
    finally:
        stop.set()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()

    med = {k: float(np.median(v)) for k, v in timings.items()}
    mb = {
        "train_step": len(train_payload),
        "push": len(train_payload),
        "generate": generate_bytes,
        "pull": generate_bytes,
    }
    rates = {k: mb[k] / med[k] / 1e6 for k in med}
    summary = {
        "sequences": ns.sequences,
        "tokens": ns.tokens,
        "prompt_tokens": ns.prompt_tokens,
        "repeats": ns.repeats,
        "train_payload_bytes": len(train_payload),
        "generate_payload_bytes": generate_bytes,
        "median_s": med,
        "mb_per_s": rates,
        "train_step_over_bare": rates["train_step"] / rates["push"],
        "generate_over_bare": rates["generate"] / rates["pull"],
        "machine": platform.processor() or platform.machine(),
    }
    out = Path(ns.out or REPO / "results" / f"dataplane_{time.strftime('%Y%m%d_%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"TrainStep {rates['train_step']:.0f} MB/s vs bare stream {rates['push']:.0f} MB/s "
        f"({summary['train_step_over_bare']:.2f}); Generate {rates['generate']:.0f} MB/s vs bare "
        f"stream {rates['pull']:.0f} MB/s ({summary['generate_over_bare']:.2f}); "
        f"{len(train_payload) / 1e6:.1f} MB / {generate_bytes / 1e6:.1f} MB per call; {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
