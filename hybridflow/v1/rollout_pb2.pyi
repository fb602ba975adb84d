from hybridflow.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JoinWeightSyncRequest(_message.Message):
    __slots__ = ("store_host", "store_port", "group_name", "backend", "num_src_ranks", "replica_tp_sizes", "replica_index", "bucket_bytes", "executor", "timeout_s")
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    NUM_SRC_RANKS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_TP_SIZES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_INDEX_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    store_host: str
    store_port: int
    group_name: str
    backend: str
    num_src_ranks: int
    replica_tp_sizes: _containers.RepeatedScalarFieldContainer[int]
    replica_index: int
    bucket_bytes: int
    executor: str
    timeout_s: float
    def __init__(self, store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., group_name: _Optional[str] = ..., backend: _Optional[str] = ..., num_src_ranks: _Optional[int] = ..., replica_tp_sizes: _Optional[_Iterable[int]] = ..., replica_index: _Optional[int] = ..., bucket_bytes: _Optional[int] = ..., executor: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class JoinWeightSyncResponse(_message.Message):
    __slots__ = ("plan_hash", "bytes_per_sync")
    PLAN_HASH_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SYNC_FIELD_NUMBER: _ClassVar[int]
    plan_hash: str
    bytes_per_sync: int
    def __init__(self, plan_hash: _Optional[str] = ..., bytes_per_sync: _Optional[int] = ...) -> None: ...

class ReceiveWeightsRequest(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompts", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompts: _common_pb2.TokenBatch
    sampling: _common_pb2.SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., prompts: _Optional[_Union[_common_pb2.TokenBatch, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "first_prompt_index", "num_prompts", "completions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_prompt_index: int
    num_prompts: int
    completions: _common_pb2.Completions
    def __init__(self, request_id: _Optional[str] = ..., first_prompt_index: _Optional[int] = ..., num_prompts: _Optional[int] = ..., completions: _Optional[_Union[_common_pb2.Completions, _Mapping]] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("policy_version", "num_bytes", "duration_s")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    num_bytes: int
    duration_s: float
    def __init__(self, policy_version: _Optional[int] = ..., num_bytes: _Optional[int] = ..., duration_s: _Optional[float] = ...) -> None: ...

class RolloutInfo(_message.Message):
    __slots__ = ("model", "engine", "policy_version", "eos_token_id", "vocab_size", "num_requests", "num_generated_tokens", "tensor_parallel_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    engine: str
    policy_version: int
    eos_token_id: int
    vocab_size: int
    num_requests: int
    num_generated_tokens: int
    tensor_parallel_size: int
    def __init__(self, model: _Optional[str] = ..., engine: _Optional[str] = ..., policy_version: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., vocab_size: _Optional[int] = ..., num_requests: _Optional[int] = ..., num_generated_tokens: _Optional[int] = ..., tensor_parallel_size: _Optional[int] = ...) -> None: ...
