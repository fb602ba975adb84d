from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TokenBatch(_message.Message):
    __slots__ = ("token_ids", "offsets")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[bytes] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "max_new_tokens", "n", "has_seed", "seed", "stop_token_ids", "return_routed_experts", "top_k")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RETURN_ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    max_new_tokens: int
    n: int
    has_seed: bool
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    return_routed_experts: bool
    top_k: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_new_tokens: _Optional[int] = ..., n: _Optional[int] = ..., has_seed: _Optional[bool] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., return_routed_experts: _Optional[bool] = ..., top_k: _Optional[int] = ...) -> None: ...

class Completions(_message.Message):
    __slots__ = ("tokens", "logprobs", "finish_reasons", "policy_versions", "token_versions", "routed_experts")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    tokens: TokenBatch
    logprobs: Tensor
    finish_reasons: _containers.RepeatedScalarFieldContainer[FinishReason]
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    token_versions: Tensor
    routed_experts: RoutedExperts
    def __init__(self, tokens: _Optional[_Union[TokenBatch, _Mapping]] = ..., logprobs: _Optional[_Union[Tensor, _Mapping]] = ..., finish_reasons: _Optional[_Iterable[_Union[FinishReason, str]]] = ..., policy_versions: _Optional[_Iterable[int]] = ..., token_versions: _Optional[_Union[Tensor, _Mapping]] = ..., routed_experts: _Optional[_Union[RoutedExperts, _Mapping]] = ...) -> None: ...

class RoutedExperts(_message.Message):
    __slots__ = ("experts", "offsets")
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    experts: Tensor
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, experts: _Optional[_Union[Tensor, _Mapping]] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("total_bytes", "offset", "data")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    offset: int
    data: bytes
    def __init__(self, total_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorMeta(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset_bytes", "num_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset_bytes: int
    num_bytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset_bytes: _Optional[int] = ..., num_bytes: _Optional[int] = ...) -> None: ...

class WeightHeader(_message.Message):
    __slots__ = ("policy_version", "tensors", "total_bytes")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    total_bytes: int
    def __init__(self, policy_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class WeightTrailer(_message.Message):
    __slots__ = ("sums", "squares")
    SUMS_FIELD_NUMBER: _ClassVar[int]
    SQUARES_FIELD_NUMBER: _ClassVar[int]
    sums: _containers.RepeatedScalarFieldContainer[int]
    squares: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sums: _Optional[_Iterable[int]] = ..., squares: _Optional[_Iterable[int]] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("header", "data", "trailer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    header: WeightHeader
    data: bytes
    trailer: WeightTrailer
    def __init__(self, header: _Optional[_Union[WeightHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., trailer: _Optional[_Union[WeightTrailer, _Mapping]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
