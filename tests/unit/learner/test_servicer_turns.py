"""TrainStep sent ahead, over real gRPC (the learner's servicer and client, the ranks a fake
dispatch): steps with a start version run in that order whatever order they arrive in; a
step the learner is past, one whose step before failed and one its caller cancelled are
refused without running; a step with replicas to publish to starts that publish after it,
once the publish before it was reported (FinishPublish), and keeps the replicas that joined
after it was sent.

Ordering is controlled, not timed: the fake's ``info`` (which the servicer reads while a step
waits for its turn) tells the test a step is waiting."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hybridflow.errors import BadRequest, FailedPrecondition, ServiceError, Unavailable
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.services.learner.client import GrpcLearnerClient
from hybridflow.services.learner.servicer import SERVICE_NAME, LearnerServicer
from hybridflow.types import TrainSample, TrainStepResult, WeightUpdateReport
from hybridflow.v1 import learner_pb2, learner_pb2_grpc

WAIT_S = 30.0
TARGET = "127.0.0.1:1"
JOINER = "127.0.0.1:2"


class FakeRanks:
    """The learner's ranks behind the servicer: a version, and a log of what ran."""

    def __init__(self) -> None:
        self.version = 0
        self.log: list[str] = []
        self.fail_tag: float | None = None
        self.started: int | None = None
        self.info_read = threading.Event()
        self.kept: list[list[str]] = []
        self.dead: set[str] = set()
        """Targets whose liveness probe fails."""
        """What each publish's start kept (its targets and replicas that joined since)."""

    def dispatch(self, command: str, args: tuple[Any, ...]) -> Any:
        if command == "train_step":
            tag = float(args[0][0].reward)
            if tag == self.fail_tag:
                raise RuntimeError(f"step {tag:g} failed")
            self.version += 1
            self.log.append(f"train {tag:g}")
            return TrainStepResult(self.version, {})
        if command == "start_publish":
            targets, keep = args
            self.started = self.version
            self.log.append(f"start v{self.version}")
            self.kept.append(list(keep))
            return self.version
        if command == "publish_weights":
            self.log.append(f"catch up {','.join(args[0])} v{self.version}")
            return WeightUpdateReport(self.version, 0, 0.0)
        raise AssertionError(command)

    def finish_publish(self) -> WeightUpdateReport:
        assert self.started is not None
        self.log.append(f"finish v{self.started}")
        return WeightUpdateReport(self.started, 0, 0.0)

    def probe(self, target: str, channel: Any, timeout_s: float) -> None:
        if target in self.dead:
            raise Unavailable(f"replica {target} did not answer")

    def info(self) -> learner_pb2.LearnerInfo:
        self.info_read.set()
        return learner_pb2.LearnerInfo(policy_version=self.version, versions_per_step=1)

    def wait_info_read(self) -> None:
        """Waits until the servicer read the version (a step is at its turn's check)."""
        assert self.info_read.wait(WAIT_S)
        self.info_read.clear()


@pytest.fixture
def served() -> Iterator[tuple[FakeRanks, GrpcLearnerClient]]:
    ranks = FakeRanks()
    servicer = LearnerServicer(
        dispatch=ranks.dispatch,
        info=ranks.info,
        vocab_size=16,
        max_bytes=1 << 20,
        chunk_bytes=1 << 16,
        probe=ranks.probe,
        finish_publish=ranks.finish_publish,
    )
    server = start_server(
        ServerConfig(),
        lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    client = GrpcLearnerClient(server.address)
    try:
        yield ranks, client
    finally:
        client.close()
        server.stop(0)


def batch(tag: float) -> list[TrainSample]:
    """One sample whose reward tags the step."""
    return [
        TrainSample(
            prompt_ids=np.array([1, 2], dtype=np.int32),
            response_ids=np.array([3], dtype=np.int32),
            rollout_logprobs=np.array([-0.5], dtype=np.float32),
            reward=tag,
            group_id=0,
            policy_version=0,
        )
    ]


def test_steps_run_in_the_order_of_their_start_versions(served) -> None:
    ranks, client = served
    second = client.send_train_step(batch(2), 1, [])  # arrives first: waits for v1
    ranks.wait_info_read()
    assert not second.done()
    first = client.send_train_step(batch(1), 0, [])
    assert first.result().policy_version == 1
    assert second.result().policy_version == 2
    assert ranks.log == ["train 1", "train 2"]


def test_a_step_the_learner_is_past_is_refused_without_running(served) -> None:
    ranks, client = served
    client.send_train_step(batch(1), 0, []).result()
    with pytest.raises(FailedPrecondition, match="already at 1"):
        client.send_train_step(batch(9), 0, []).result()  # the same step again
    assert ranks.log == ["train 1"]


def test_a_step_whose_step_before_failed_is_refused(served) -> None:
    ranks, client = served
    ranks.fail_tag = 1
    waiting = client.send_train_step(batch(2), 1, [])
    ranks.wait_info_read()
    with pytest.raises(ServiceError, match="step 1 failed"):
        client.send_train_step(batch(1), 0, []).result()
    with pytest.raises(FailedPrecondition, match="from policy version 0 failed"):
        waiting.result()
    assert ranks.log == []
    # The learner serves on: a step from where it is runs, and the failure is forgotten.
    ranks.fail_tag = None
    assert client.send_train_step(batch(3), 0, []).result().policy_version == 1
    assert client.send_train_step(batch(4), 1, []).result().policy_version == 2


def test_a_cancelled_step_never_runs(served) -> None:
    ranks, client = served
    given_up = client.send_train_step(batch(2), 1, [])
    ranks.wait_info_read()
    given_up.cancel()
    ranks.wait_info_read()  # the cancelled call woke and looked once more: refused
    client.send_train_step(batch(1), 0, []).result()
    with pytest.raises(ServiceError):
        given_up.result()
    assert ranks.log == ["train 1"] and ranks.version == 1


def test_a_step_starts_its_publish_after_the_one_before_was_reported(served) -> None:
    ranks, client = served
    first = client.send_train_step(batch(1), 0, [TARGET]).result()
    assert first.policy_version == 1 and first.publish_started
    assert ranks.log == ["train 1", "start v1"]
    second = client.send_train_step(batch(2), 1, [TARGET])
    deadline = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):  # until the second step trained (bounded)
        if "train 2" in ranks.log:
            break
        deadline.wait(0.01)
    assert "train 2" in ranks.log
    assert not second.done()  # its publish waits for the first one's FinishPublish
    assert client.finish_publish().policy_version == 1
    assert second.result().policy_version == 2
    assert ranks.log == ["train 1", "start v1", "train 2", "finish v1", "start v2"]
    assert client.finish_publish().policy_version == 2


def test_a_replica_that_joined_after_a_step_was_sent_keeps_its_group(served) -> None:
    ranks, client = served
    ahead = client.send_train_step(batch(2), 1, [TARGET])  # names the serving set of then
    ranks.wait_info_read()
    client.publish_weights([JOINER], catch_up=True)  # a replica joins meanwhile
    client.send_train_step(batch(1), 0, []).result()
    assert ahead.result().policy_version == 2
    assert ranks.kept == [[TARGET, JOINER]]  # its publish did not close the joiner's group
    client.finish_publish()
    # A step sent after the join names the set itself: what it leaves out is let go.
    client.send_train_step(batch(3), 2, [TARGET]).result()
    assert ranks.kept == [[TARGET, JOINER], [TARGET]]
    assert ranks.log == [
        "catch up 127.0.0.1:2 v0",
        "train 1",
        "train 2",
        "start v2",
        "finish v2",
        "train 3",
        "start v3",
    ]


def test_a_step_whose_target_does_not_answer_trains_and_leaves_the_publish_to_its_caller(
    served,
) -> None:
    ranks, client = served
    ranks.dead.add(TARGET)
    result = client.send_train_step(batch(1), 0, [TARGET]).result()
    assert result.policy_version == 1 and not result.publish_started
    assert ranks.log == ["train 1"]  # applied, and no publish started
    ranks.dead.clear()
    assert client.send_train_step(batch(2), 1, [TARGET]).result().publish_started


def test_a_target_off_the_allowed_hosts_refuses_the_step_before_it_trains(served) -> None:
    ranks, client = served
    with pytest.raises(BadRequest, match="allowed_hosts"):
        client.send_train_step(batch(1), 0, ["10.0.0.9:5000"]).result()
    assert ranks.log == [] and ranks.version == 0
