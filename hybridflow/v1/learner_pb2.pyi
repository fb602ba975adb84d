from hybridflow.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainBatch(_message.Message):
    __slots__ = ("prompts", "responses", "rollout_logprobs", "rewards", "group_ids", "policy_versions", "baselines", "routed_experts", "loss_masks", "turn_rewards", "start_version", "publish_to")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BASELINES_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASKS_FIELD_NUMBER: _ClassVar[int]
    TURN_REWARDS_FIELD_NUMBER: _ClassVar[int]
    START_VERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TO_FIELD_NUMBER: _ClassVar[int]
    prompts: _common_pb2.TokenBatch
    responses: _common_pb2.TokenBatch
    rollout_logprobs: _common_pb2.Tensor
    rewards: _common_pb2.Tensor
    group_ids: _containers.RepeatedScalarFieldContainer[int]
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    baselines: _common_pb2.Tensor
    routed_experts: _common_pb2.RoutedExperts
    loss_masks: bytes
    turn_rewards: _common_pb2.Tensor
    start_version: int
    publish_to: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prompts: _Optional[_Union[_common_pb2.TokenBatch, _Mapping]] = ..., responses: _Optional[_Union[_common_pb2.TokenBatch, _Mapping]] = ..., rollout_logprobs: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., group_ids: _Optional[_Iterable[int]] = ..., policy_versions: _Optional[_Iterable[int]] = ..., baselines: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., routed_experts: _Optional[_Union[_common_pb2.RoutedExperts, _Mapping]] = ..., loss_masks: _Optional[bytes] = ..., turn_rewards: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., start_version: _Optional[int] = ..., publish_to: _Optional[_Iterable[str]] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("policy_version", "metrics", "publish_started")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_STARTED_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    metrics: _containers.ScalarMap[str, float]
    publish_started: bool
    def __init__(self, policy_version: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., publish_started: _Optional[bool] = ...) -> None: ...

class ComputeLogProbsRequest(_message.Message):
    __slots__ = ("prompts", "responses", "temperature")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    prompts: _common_pb2.TokenBatch
    responses: _common_pb2.TokenBatch
    temperature: float
    def __init__(self, prompts: _Optional[_Union[_common_pb2.TokenBatch, _Mapping]] = ..., responses: _Optional[_Union[_common_pb2.TokenBatch, _Mapping]] = ..., temperature: _Optional[float] = ...) -> None: ...

class ComputeLogProbsResponse(_message.Message):
    __slots__ = ("logprobs", "policy_version")
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    logprobs: _common_pb2.Tensor
    policy_version: int
    def __init__(self, logprobs: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class PublishWeightsRequest(_message.Message):
    __slots__ = ("targets", "catch_up")
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedScalarFieldContainer[str]
    catch_up: bool
    def __init__(self, targets: _Optional[_Iterable[str]] = ..., catch_up: _Optional[bool] = ...) -> None: ...

class PublishWeightsResponse(_message.Message):
    __slots__ = ("policy_version", "num_bytes", "duration_s")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    num_bytes: int
    duration_s: float
    def __init__(self, policy_version: _Optional[int] = ..., num_bytes: _Optional[int] = ..., duration_s: _Optional[float] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path", "policy_version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    policy_version: int
    def __init__(self, path: _Optional[str] = ..., policy_version: _Optional[int] = ...) -> None: ...

class TrainStateRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TrainStateResponse(_message.Message):
    __slots__ = ("path", "policy_version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    policy_version: int
    def __init__(self, path: _Optional[str] = ..., policy_version: _Optional[int] = ...) -> None: ...

class LearnerInfo(_message.Message):
    __slots__ = ("model", "algorithm", "policy_version", "world_size", "needs_greedy_baseline", "needs_routed_experts", "versions_per_step")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NEEDS_GREEDY_BASELINE_FIELD_NUMBER: _ClassVar[int]
    NEEDS_ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    model: str
    algorithm: str
    policy_version: int
    world_size: int
    needs_greedy_baseline: bool
    needs_routed_experts: bool
    versions_per_step: int
    def __init__(self, model: _Optional[str] = ..., algorithm: _Optional[str] = ..., policy_version: _Optional[int] = ..., world_size: _Optional[int] = ..., needs_greedy_baseline: _Optional[bool] = ..., needs_routed_experts: _Optional[bool] = ..., versions_per_step: _Optional[int] = ...) -> None: ...
