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

class RunAgentRequest(_message.Message):
    __slots__ = ("episode_id", "agent", "task", "replica_address", "sampling")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    agent: str
    task: EpisodeTask
    replica_address: str
    sampling: _common_pb2.SamplingParams
    def __init__(self, episode_id: _Optional[str] = ..., agent: _Optional[str] = ..., task: _Optional[_Union[EpisodeTask, _Mapping]] = ..., replica_address: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class AgentTrajectory(_message.Message):
    __slots__ = ("prompt_ids", "token_ids", "logprobs", "token_versions", "loss_mask", "finish_reason")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: bytes
    token_ids: bytes
    logprobs: bytes
    token_versions: bytes
    loss_mask: bytes
    finish_reason: str
    def __init__(self, prompt_ids: _Optional[bytes] = ..., token_ids: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ..., token_versions: _Optional[bytes] = ..., loss_mask: _Optional[bytes] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class RunAgentResponse(_message.Message):
    __slots__ = ("reward", "info_json", "trajectories", "num_requests", "breaks", "error", "replica_error", "instance")
    class BreaksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REWARD_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BREAKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ERROR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    reward: float
    info_json: str
    trajectories: _containers.RepeatedCompositeFieldContainer[AgentTrajectory]
    num_requests: int
    breaks: _containers.ScalarMap[str, int]
    error: str
    replica_error: str
    instance: str
    def __init__(self, reward: _Optional[float] = ..., info_json: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[AgentTrajectory, _Mapping]]] = ..., num_requests: _Optional[int] = ..., breaks: _Optional[_Mapping[str, int]] = ..., error: _Optional[str] = ..., replica_error: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...
