"""The learner's gRPC client (``LearnerClient`` in ``hybridflow.clients``; ``LearnerCore`` is the
in-process twin). Failed calls raise ``hybridflow.errors`` classes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
import numpy as np

from hybridflow.arrays import FloatArray, TokenLike
from hybridflow.clients import LearnerClient, PendingTrainStep
from hybridflow.errors import ServiceError
from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.client_errors import translate_errors
from hybridflow.rpc.codec import pack_tokens, split_by, unpack_floats
from hybridflow.rpc.config import ChannelConfig
from hybridflow.rpc.wire import iter_piece_chunks
from hybridflow.services.learner import convert
from hybridflow.types import LearnerNeeds, TrainSample, TrainStepResult, WeightUpdateReport
from hybridflow.v1 import common_pb2, learner_pb2, learner_pb2_grpc

__all__ = ["GrpcLearnerClient", "LearnerClient"]


class GrpcLearnerClient:
    """The learner service as the coordinator calls it (``clients.Learner``): streams train
    batches in chunks and translates gRPC errors into ``hybridflow.errors``."""

    service = "learner"
    """Names the service in failed calls' messages."""

    def __init__(self, address: str, config: ChannelConfig | None = None) -> None:
        self.address = address
        self._config = config or ChannelConfig()
        self._channel = make_channel(address, self._config)
        self._stub = learner_pb2_grpc.LearnerServiceStub(self._channel)

    @translate_errors
    def train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        chunks = iter_piece_chunks(convert.batch_pieces(samples), self._config.chunk_bytes)
        reply = self._stub.TrainStep(chunks, timeout=self._config.timeout_s)
        return convert.result_from_proto(reply)

    def send_train_step(
        self, samples: list[TrainSample], start_version: int, publish_to: Sequence[str]
    ) -> PendingTrainStep:
        """``TrainsAhead``: the step's call is on its way when this returns (its batch was
        serialized here, its chunks stream from gRPC's own thread)."""
        pieces = convert.batch_pieces(samples, start_version, publish_to)
        chunks = iter_piece_chunks(pieces, self._config.chunk_bytes)
        future = self._stub.TrainStep.future(chunks, timeout=self._config.timeout_s)
        return _PendingStep(future, self._landed)

    @translate_errors
    def _landed(self, future: grpc.Future) -> TrainStepResult:
        """``send_train_step``'s reply, waited for; errors translated (the method's name in
        their message is this one)."""
        try:
            reply = future.result()
        except grpc.FutureCancelledError as exc:
            raise ServiceError(
                f"the train step to the learner at {self.address} was cancelled"
            ) from exc
        return convert.result_from_proto(reply)

    @translate_errors
    def compute_logprobs(
        self, prompts: Sequence[TokenLike], responses: Sequence[TokenLike], temperature: float
    ) -> list[FloatArray]:
        reply = self._stub.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(
                prompts=pack_tokens(prompts),
                responses=pack_tokens(responses),
                temperature=temperature,
            ),
            timeout=self._config.timeout_s,
        )
        offsets = np.zeros(len(responses) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in responses], out=offsets[1:])
        return split_by(unpack_floats(reply.logprobs, "logprobs", int(offsets[-1])), offsets)

    @translate_errors
    def publish_weights(self, targets: Sequence[str], catch_up: bool = False) -> WeightUpdateReport:
        reply = self._stub.PublishWeights(
            learner_pb2.PublishWeightsRequest(targets=list(targets), catch_up=catch_up),
            timeout=self._config.timeout_s,
        )
        return WeightUpdateReport(reply.policy_version, reply.num_bytes, reply.duration_s)

    @translate_errors
    def start_publish(self, targets: Sequence[str]) -> int:
        reply = self._stub.StartPublish(
            learner_pb2.PublishWeightsRequest(targets=list(targets)),
            timeout=self._config.timeout_s,
        )
        return int(reply.policy_version)

    @translate_errors
    def finish_publish(self) -> WeightUpdateReport:
        reply = self._stub.FinishPublish(common_pb2.Empty(), timeout=self._config.timeout_s)
        return WeightUpdateReport(reply.policy_version, reply.num_bytes, reply.duration_s)

    @translate_errors
    def save_checkpoint(self, path: str) -> str:
        reply = self._stub.SaveCheckpoint(
            learner_pb2.SaveCheckpointRequest(path=path), timeout=self._config.timeout_s
        )
        return str(reply.path)

    @translate_errors
    def save_train_state(self, name: str) -> int:
        reply = self._stub.SaveTrainState(
            learner_pb2.TrainStateRequest(name=name), timeout=self._config.timeout_s
        )
        return int(reply.policy_version)

    @translate_errors
    def load_train_state(self, name: str) -> int:
        reply = self._stub.LoadTrainState(
            learner_pb2.TrainStateRequest(name=name), timeout=self._config.timeout_s
        )
        return int(reply.policy_version)

    @translate_errors
    def info(self) -> learner_pb2.LearnerInfo:
        return self._stub.GetInfo(common_pb2.Empty(), timeout=self._config.timeout_s)

    def needs_greedy_baseline(self) -> bool:
        return bool(self.info().needs_greedy_baseline)

    def needs_routed_experts(self) -> bool:
        return bool(self.info().needs_routed_experts)

    def schedule_needs(self) -> LearnerNeeds:
        info = self.info()
        return LearnerNeeds(
            greedy_baseline=bool(info.needs_greedy_baseline),
            routed_experts=bool(info.needs_routed_experts),
            versions_per_step=max(1, int(info.versions_per_step)),
        )

    def close(self) -> None:
        self._channel.close()


class _PendingStep:
    """``PendingTrainStep`` over a gRPC future."""

    def __init__(
        self, future: grpc.Future, landed: Callable[[grpc.Future], TrainStepResult]
    ) -> None:
        self._future = future
        self._landed = landed

    def done(self) -> bool:
        return bool(self._future.done())

    def result(self) -> TrainStepResult:
        return self._landed(self._future)

    def cancel(self) -> None:
        self._future.cancel()
