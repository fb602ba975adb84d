from hybridflow.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class EpisodeTask(_message.Message):
    __slots__ = ("prompt", "has_ground_truth", "ground_truth", "data_source", "extra_info_json")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    HAS_GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    has_ground_truth: bool
    ground_truth: str
    data_source: str
    extra_info_json: str
    def __init__(self, prompt: _Optional[str] = ..., has_ground_truth: _Optional[bool] = ..., ground_truth: _Optional[str] = ..., data_source: _Optional[str] = ..., extra_info_json: _Optional[str] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("episode_id", "env", "task")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    env: str
    task: EpisodeTask
    def __init__(self, episode_id: _Optional[str] = ..., env: _Optional[str] = ..., task: _Optional[_Union[EpisodeTask, _Mapping]] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("messages", "error", "instance")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    error: str
    instance: str
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., error: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("episode_id", "action")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    action: str
    def __init__(self, episode_id: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("messages", "reward", "done", "info_json", "error", "instance")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    reward: float
    done: bool
    info_json: str
    error: str
    instance: str
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ..., info_json: _Optional[str] = ..., error: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class EnvironmentInfo(_message.Message):
    __slots__ = ("envs", "num_live", "max_episodes", "num_started", "num_finished", "num_errored", "num_hung", "instance")
    ENVS_FIELD_NUMBER: _ClassVar[int]
    NUM_LIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODES_FIELD_NUMBER: _ClassVar[int]
    NUM_STARTED_FIELD_NUMBER: _ClassVar[int]
    NUM_FINISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_ERRORED_FIELD_NUMBER: _ClassVar[int]
    NUM_HUNG_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedScalarFieldContainer[str]
    num_live: int
    max_episodes: int
    num_started: int
    num_finished: int
    num_errored: int
    num_hung: int
    instance: str
    def __init__(self, envs: _Optional[_Iterable[str]] = ..., num_live: _Optional[int] = ..., max_episodes: _Optional[int] = ..., num_started: _Optional[int] = ..., num_finished: _Optional[int] = ..., num_errored: _Optional[int] = ..., num_hung: _Optional[int] = ..., instance: _Optional[str] = ...) -> None: ...
