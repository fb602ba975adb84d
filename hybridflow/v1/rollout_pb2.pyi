from hybridflow.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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

class RolloutInfo(_message.Message):
    __slots__ = ("model", "engine", "policy_version", "eos_token_id", "vocab_size", "num_requests", "num_generated_tokens", "tensor_parallel_size", "engine_steps", "num_active_requests")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    engine: str
    policy_version: int
    eos_token_id: int
    vocab_size: int
    num_requests: int
    num_generated_tokens: int
    tensor_parallel_size: int
    engine_steps: int
    num_active_requests: int
    def __init__(self, model: _Optional[str] = ..., engine: _Optional[str] = ..., policy_version: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., vocab_size: _Optional[int] = ..., num_requests: _Optional[int] = ..., num_generated_tokens: _Optional[int] = ..., tensor_parallel_size: _Optional[int] = ..., engine_steps: _Optional[int] = ..., num_active_requests: _Optional[int] = ...) -> None: ...
