from hybridflow.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProbeLogprobsRequest(_message.Message):
    __slots__ = ("prompt_ids", "response_ids")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    response_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., response_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ProbeLogprobsResponse(_message.Message):
    __slots__ = ("logprobs", "policy_version")
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_version: int
    def __init__(self, logprobs: _Optional[_Iterable[float]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class WeightSyncInfo(_message.Message):
    __slots__ = ("tensor_parallel_size", "policy_version", "family", "layout_digest", "layout", "dtype")
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    tensor_parallel_size: int
    policy_version: int
    family: str
    layout_digest: str
    layout: _containers.RepeatedCompositeFieldContainer[ParamLayout]
    dtype: str
    def __init__(self, tensor_parallel_size: _Optional[int] = ..., policy_version: _Optional[int] = ..., family: _Optional[str] = ..., layout_digest: _Optional[str] = ..., layout: _Optional[_Iterable[_Union[ParamLayout, _Mapping]]] = ..., dtype: _Optional[str] = ...) -> None: ...

class ParamLayout(_message.Message):
    __slots__ = ("name", "shape", "placement", "split_dim", "num_blocks", "max_shards", "dest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    SPLIT_DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_SHARDS_FIELD_NUMBER: _ClassVar[int]
    DEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    placement: str
    split_dim: int
    num_blocks: int
    max_shards: int
    dest: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., placement: _Optional[str] = ..., split_dim: _Optional[int] = ..., num_blocks: _Optional[int] = ..., max_shards: _Optional[int] = ..., dest: _Optional[str] = ...) -> None: ...

class JoinWeightSyncRequest(_message.Message):
    __slots__ = ("store_host", "store_port", "group_name", "backend", "num_src_ranks", "replica_tp_sizes", "replica_index", "bucket_bytes", "executor", "timeout_s", "delta", "check_samples")
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
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CHECK_SAMPLES_FIELD_NUMBER: _ClassVar[int]
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
    delta: bool
    check_samples: int
    def __init__(self, store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., group_name: _Optional[str] = ..., backend: _Optional[str] = ..., num_src_ranks: _Optional[int] = ..., replica_tp_sizes: _Optional[_Iterable[int]] = ..., replica_index: _Optional[int] = ..., bucket_bytes: _Optional[int] = ..., executor: _Optional[str] = ..., timeout_s: _Optional[float] = ..., delta: _Optional[bool] = ..., check_samples: _Optional[int] = ...) -> None: ...

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

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("policy_version", "num_bytes", "duration_s")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    num_bytes: int
    duration_s: float
    def __init__(self, policy_version: _Optional[int] = ..., num_bytes: _Optional[int] = ..., duration_s: _Optional[float] = ...) -> None: ...
