"""The environment service on a real loopback socket: episodes to done, many at once, errors
kept per episode, the allow-list, auth, bounds, a hung step, and the client's
EnvironmentUnavailable when the service is gone or restarted. The episode contract runs
against the gRPC client and its in-process twin alike."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.runner import (
    EnvironmentClient,
    EnvironmentUnavailable,
    EpisodeError,
    LocalEnvironments,
)
from hybridflow.errors import BadRequest
from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.config import ChannelConfig, ServerConfig
from hybridflow.rpc.server import RunningServer, start_server
from hybridflow.services.environment.client import EnvironmentServiceClient
from hybridflow.services.environment.config import EnvironmentConfig
from hybridflow.services.environment.episodes import EpisodeHost
from hybridflow.services.environment.factory import make_environment_client
from hybridflow.services.environment.servicer import SERVICE_NAME, EnvironmentServicer
from hybridflow.v1 import common_pb2, environment_pb2, environment_pb2_grpc

GUESS = f"{__name__}:Guess"
BROKEN = f"{__name__}:Broken"
HANGS = f"{__name__}:Hangs"
COUNTING = f"{__name__}:Counting"
CHATTY = f"{__name__}:Chatty"
ALL = [GUESS, BROKEN, HANGS, COUNTING, CHATTY]


class Guess:
    """Guess the task's number; says higher/lower; done on the right answer."""

    def reset(self, task: Task) -> tuple[Message, ...]:
        self.target = int(task.ground_truth or 0)
        self.turns = 0
        return (Message("system", f"source {task.data_source}"), Message("user", task.prompt))

    def step(self, action: str) -> StepResult:
        self.turns += 1
        guess = int(action)
        if guess == self.target:
            return StepResult(reward=1.0, done=True, info={"turns": self.turns, "success": True})
        hint = "higher" if guess < self.target else "lower"
        return StepResult(observation=(Message("user", hint),), reward=-0.1)


class Broken:
    """Raises on its first step."""

    def reset(self, task: Task) -> tuple[Message, ...]:
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        raise ZeroDivisionError("env bug")


class Hangs:
    """Its step blocks until the test sets ``release``."""

    release = threading.Event()

    def reset(self, task: Task) -> tuple[Message, ...]:
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        Hangs.release.wait()
        return StepResult(done=True)


class Counting:
    """Counts the steps any of its instances took."""

    steps = 0

    def reset(self, task: Task) -> tuple[Message, ...]:
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        Counting.steps += 1
        return StepResult(observation=(Message("tool", action),))


class Chatty:
    """Answers a message longer than any bound a test sets."""

    def reset(self, task: Task) -> tuple[Message, ...]:
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        return StepResult(observation=(Message("tool", "x" * 10_000),))


def serve(
    server: ServerConfig | None = None, port: int = 0, **keys: object
) -> tuple[RunningServer, EpisodeHost]:
    config = EnvironmentConfig(envs=list(ALL), server=server or ServerConfig(port=port), **keys)  # type: ignore[arg-type]
    host = EpisodeHost(config, config.server.concurrency_limit)
    servicer = EnvironmentServicer(host)
    running = start_server(
        config.server,
        lambda s: environment_pb2_grpc.add_EnvironmentServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    return running, host


FAST = ChannelConfig(timeout_s=30, retries=0, initial_backoff_s=0.05)
"""A client that gives up on a dead service within a retry or two."""


@pytest.fixture
def service() -> Iterator[RunningServer]:
    running, host = serve()
    yield running
    running.stop(0)
    host.shutdown()


@pytest.fixture
def client(service: RunningServer) -> Iterator[EnvironmentServiceClient]:
    c = EnvironmentServiceClient(service.address, FAST)
    yield c
    c.shutdown()


@pytest.fixture(params=["grpc", "local"])
def either(request: pytest.FixtureRequest) -> Iterator[EnvironmentClient]:
    """The gRPC client of a live service, or the in-process twin."""
    if request.param == "local":
        yield LocalEnvironments()
        return
    running, host = serve()
    c = EnvironmentServiceClient(running.address, FAST)
    yield c
    c.shutdown()
    running.stop(0)
    host.shutdown()


def info(address: str) -> environment_pb2.EnvironmentInfo:
    stub = environment_pb2_grpc.EnvironmentServiceStub(make_channel(address))
    return stub.GetInfo(common_pb2.Empty(), timeout=10)


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)  # another thread's progress: nothing local to wait on


def play_guess(envs: EnvironmentClient, episode_id: str, target: int) -> list[StepResult]:
    opening = envs.reset(episode_id, GUESS, Task(f"guess {target}", str(target), "game"))
    assert opening == (Message("system", "source game"), Message("user", f"guess {target}"))
    results, low, high = [], 0, 100
    while True:
        guess = (low + high) // 2
        result = envs.step(episode_id, str(guess))
        results.append(result)
        if result.done:
            return results
        hint = result.observation[0].content
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)


def test_an_episode_runs_to_done_and_is_closed(either: EnvironmentClient) -> None:
    results = play_guess(either, "ep-1", 37)
    assert results[-1] == StepResult(
        reward=1.0, done=True, info={"turns": len(results), "success": True}
    )
    assert all(r.reward == -0.1 and not r.done for r in results[:-1])
    with pytest.raises(EpisodeError, match="not live"):
        either.step("ep-1", "37")
    either.reset("ep-1", GUESS, Task("again", "1"))  # the id is free again


def test_an_environment_that_raises_ends_its_episode_only(either: EnvironmentClient) -> None:
    either.reset("good", GUESS, Task("g", "3"))
    either.reset("bad", BROKEN, Task("b"))
    with pytest.raises(EpisodeError, match="ZeroDivisionError: env bug"):
        either.step("bad", "1")
    with pytest.raises(EpisodeError, match="not live"):
        either.step("bad", "1")
    assert either.step("good", "3").done


def test_many_episodes_at_once(client: EnvironmentServiceClient, service: RunningServer) -> None:
    with futures.ThreadPoolExecutor(max_workers=8) as pool:
        runs = [pool.submit(play_guess, client, f"ep-{i}", (7 * i) % 100) for i in range(24)]
        assert all(run.result()[-1].done for run in runs)
    got = info(service.address)
    assert (got.num_started, got.num_finished, got.num_errored, got.num_live) == (24, 24, 0, 0)
    assert list(got.envs) == ALL and got.max_episodes == 1024


def test_a_path_not_allow_listed_is_refused_and_never_imported(
    client: EnvironmentServiceClient, tmp_path: Path
) -> None:
    marker = tmp_path / "imported"
    module = tmp_path / "sneaky_env.py"
    module.write_text(f"open({str(marker)!r}, 'w').close()\nclass Env:\n    pass\n")
    with pytest.raises(BadRequest, match=r"not in environment.envs") as err:
        client.reset("ep", f"{module}:Env", Task("p"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert not marker.exists()


def test_a_missing_or_wrong_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENV_TEST_TOKEN", "s3cret")
    monkeypatch.setenv("HF_ENV_WRONG_TOKEN", "guess")
    running, host = serve(ServerConfig(auth_token_env="HF_ENV_TEST_TOKEN"))
    try:
        for variable in ("HF_ENV_NO_SUCH_VAR", "HF_ENV_WRONG_TOKEN"):
            bad = EnvironmentServiceClient(running.address, ChannelConfig(auth_token_env=variable))
            with pytest.raises(grpc.RpcError) as err:
                bad.reset("ep", GUESS, Task("p", "1"))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            bad.shutdown()
        good = EnvironmentServiceClient(
            running.address, ChannelConfig(auth_token_env="HF_ENV_TEST_TOKEN")
        )
        assert good.reset("ep", GUESS, Task("p", "1"))[-1].content == "p"
        good.shutdown()
        assert host.counts().num_started == 1
    finally:
        running.stop(0)
        host.shutdown()


def test_without_a_token_episodes_are_refused_and_info_stays_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    running, host = serve()
    try:
        client = EnvironmentServiceClient(running.address, FAST)
        for call in (
            lambda: client.reset("ep", GUESS, Task("p", "1")),
            lambda: client.step("ep", "1"),
            lambda: client.close("ep"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "changes state" in err.value.details()
        assert list(client.info().envs) == ALL
        client.shutdown()
    finally:
        running.stop(0)
        host.shutdown()


def test_an_over_long_action_is_refused_before_the_environment_sees_it() -> None:
    running, host = serve(max_action_chars=8)
    client = EnvironmentServiceClient(running.address, FAST)
    try:
        client.reset("ep", COUNTING, Task("p"))
        before = Counting.steps
        with pytest.raises(BadRequest, match=r"9 characters.*environment.max_action_chars=8"):
            client.step("ep", "x" * 9)
        assert Counting.steps == before
        assert client.step("ep", "x" * 8).observation == (Message("tool", "x" * 8),)  # still live
    finally:
        client.shutdown()
        running.stop(0)
        host.shutdown()


def test_over_long_task_text_is_refused_and_an_over_long_answer_ends_the_episode() -> None:
    running, host = serve(max_message_chars=100)
    client = EnvironmentServiceClient(running.address, FAST)
    try:
        with pytest.raises(BadRequest, match=r"task.prompt has 101 characters"):
            client.reset("ep", GUESS, Task("p" * 101, "1"))
        client.reset("ep", CHATTY, Task("p"))
        with pytest.raises(EpisodeError, match=r"environment.max_message_chars=100"):
            client.step("ep", "hi")
        assert host.counts().num_live == 0
    finally:
        client.shutdown()
        running.stop(0)
        host.shutdown()


def test_max_episodes_bounds_the_live_episodes() -> None:
    running, host = serve(max_episodes=2)
    client = EnvironmentServiceClient(running.address, FAST)
    try:
        client.reset("a", GUESS, Task("p", "1"))
        client.reset("b", GUESS, Task("p", "1"))
        with pytest.raises(BadRequest, match=r"environment.max_episodes=2"):
            client.reset("c", GUESS, Task("p", "1"))
        client.close("a")
        client.reset("c", GUESS, Task("p", "1"))
        client.close("b")
        with pytest.raises(BadRequest, match="already live"):
            client.reset("c", GUESS, Task("p", "1"))
    finally:
        client.shutdown()
        running.stop(0)
        host.shutdown()


def test_a_hung_step_ends_its_episode_and_holds_its_place_until_it_returns() -> None:
    Hangs.release.clear()
    running, host = serve(max_episodes=2, step_timeout_s=0.5)
    client = EnvironmentServiceClient(running.address, FAST)
    try:
        client.reset("stuck", HANGS, Task("p"))
        with pytest.raises(
            EpisodeError, match=r"step did not return within environment.step_timeout_s"
        ):
            client.step("stuck", "go")
        got = info(running.address)
        assert (got.num_hung, got.num_live, got.num_errored) == (1, 0, 1)
        client.reset("other", GUESS, Task("p", "2"))
        with pytest.raises(BadRequest, match=r"hung"):  # the hung step still holds a place
            client.reset("third", GUESS, Task("p", "2"))
        with pytest.raises(BadRequest, match="still has a call running"):
            client.reset("stuck", GUESS, Task("p", "2"))
        assert client.step("other", "2").done  # other episodes go on meanwhile
        Hangs.release.set()
        wait_until(lambda: host.counts().num_hung == 0)
        client.reset("third", GUESS, Task("p", "2"))
        assert host.counts().num_live == 1  # the late step did not bring "stuck" back
    finally:
        Hangs.release.set()
        client.shutdown()
        running.stop(0)
        host.shutdown()


def test_the_client_raises_environment_unavailable_when_the_service_is_stopped() -> None:
    running, host = serve()
    client = EnvironmentServiceClient(running.address, FAST)
    try:
        client.reset("ep", GUESS, Task("p", "5"))
        running.stop(0)
        with pytest.raises(EnvironmentUnavailable, match="UNAVAILABLE"):
            client.step("ep", "5")
        with pytest.raises(EnvironmentUnavailable):
            client.reset("ep2", GUESS, Task("p", "5"))
    finally:
        client.shutdown()
        host.shutdown()


def test_a_restarted_service_is_unavailable_for_the_episodes_it_lost() -> None:
    """The new process answers "not live" for an episode the old one held: the client tells
    that apart from the episode's own error by the service instance."""
    running, host = serve()
    client = EnvironmentServiceClient(running.address, FAST)
    restarted = None
    try:
        client.reset("lost", GUESS, Task("p", "5"))
        running.stop(0)
        host.shutdown()
        restarted, host = serve(port=running.port)
        with pytest.raises(EnvironmentUnavailable, match="restarted"):
            client.step("lost", "5")
        client.reset("again", GUESS, Task("p", "5"))  # new episodes run on the new instance
        assert client.step("again", "5").done
    finally:
        client.shutdown()
        if restarted is not None:
            restarted.stop(0)
        host.shutdown()


def test_a_call_past_its_deadline_is_environment_unavailable() -> None:
    Hangs.release.clear()
    running, host = serve(step_timeout_s=60)
    client = EnvironmentServiceClient(running.address, ChannelConfig(timeout_s=2.0, retries=0))
    try:
        client.reset("ep", HANGS, Task("p"))
        with pytest.raises(EnvironmentUnavailable, match="DEADLINE_EXCEEDED"):
            client.step("ep", "go")
    finally:
        Hangs.release.set()
        client.shutdown()
        running.stop(0)
        host.shutdown()


def test_the_factory_picks_the_twin_without_an_address(service: RunningServer) -> None:
    local = make_environment_client("", max_episodes=3)
    assert isinstance(local, LocalEnvironments) and local.max_episodes == 3
    remote = make_environment_client(service.address, FAST)
    assert isinstance(remote, EnvironmentServiceClient)
    assert remote.reset("ep", GUESS, Task("p", "1"))[-1] == Message("user", "p")
    remote.shutdown()


def test_a_bad_extra_info_is_invalid_argument_naming_the_field(service: RunningServer) -> None:
    stub = environment_pb2_grpc.EnvironmentServiceStub(make_channel(service.address))
    request = environment_pb2.ResetRequest(
        episode_id="ep", env=GUESS, task=environment_pb2.EpisodeTask(extra_info_json="[1]")
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.Reset(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "task.extra_info_json must be a JSON object" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.Step(environment_pb2.StepRequest(episode_id="", action="1"), timeout=10)
    assert "episode_id: must be non-empty" in err.value.details()
