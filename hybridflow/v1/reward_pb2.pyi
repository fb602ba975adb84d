from hybridflow.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreItem(_message.Message):
    __slots__ = ("data_source", "response", "has_ground_truth", "ground_truth", "prompt", "extra_info_json")
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    HAS_GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    data_source: str
    response: str
    has_ground_truth: bool
    ground_truth: str
    prompt: str
    extra_info_json: str
    def __init__(self, data_source: _Optional[str] = ..., response: _Optional[str] = ..., has_ground_truth: _Optional[bool] = ..., ground_truth: _Optional[str] = ..., prompt: _Optional[str] = ..., extra_info_json: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ...) -> None: ...

class ScoreResult(_message.Message):
    __slots__ = ("score", "error", "components", "outcome")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    score: float
    error: str
    components: _containers.ScalarMap[str, float]
    outcome: str
    def __init__(self, score: _Optional[float] = ..., error: _Optional[str] = ..., components: _Optional[_Mapping[str, float]] = ..., outcome: _Optional[str] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results", "num_errors")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    NUM_ERRORS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScoreResult]
    num_errors: int
    def __init__(self, results: _Optional[_Iterable[_Union[ScoreResult, _Mapping]]] = ..., num_errors: _Optional[int] = ...) -> None: ...

class RewardInfo(_message.Message):
    __slots__ = ("scorers", "num_scored", "num_errors", "components", "num_truncated")
    SCORERS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCORED_FIELD_NUMBER: _ClassVar[int]
    NUM_ERRORS_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    scorers: _containers.RepeatedScalarFieldContainer[str]
    num_scored: int
    num_errors: int
    components: _containers.RepeatedScalarFieldContainer[str]
    num_truncated: int
    def __init__(self, scorers: _Optional[_Iterable[str]] = ..., num_scored: _Optional[int] = ..., num_errors: _Optional[int] = ..., components: _Optional[_Iterable[str]] = ..., num_truncated: _Optional[int] = ...) -> None: ...
