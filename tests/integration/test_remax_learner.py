"""A ReMax learner service on a real socket: GetInfo asks for greedy baselines, a batch that
carries them trains over the streamed wire encoding, one without them is INVALID_ARGUMENT."""

import grpc
import pytest

from hybridflow.services.learner.client import GrpcLearnerClient
from hybridflow.types import TrainSample
from tests.helpers import MIB, start_learner_server


@pytest.fixture(scope="module")
def remax_learner(tiny_model_path):
    server, _ = start_learner_server(
        tiny_model_path, max_bytes=4 * MIB, optimizer={"lr": 1e-3}, advantage_estimator="remax"
    )
    yield GrpcLearnerClient(server.address)
    server.stop(0)


def _samples(baselines):
    return [
        TrainSample([5, 6], [7, 8], [-1.0, -1.0], 1.0, 0, 0, baseline=baselines[0]),
        TrainSample([5, 6], [9], [-1.0], 0.0, 0, 0, baseline=baselines[1]),
    ]


def test_remax_learner_asks_for_greedy_baselines(remax_learner):
    assert remax_learner.needs_greedy_baseline()
    assert remax_learner.info().needs_greedy_baseline


def test_remax_step_over_grpc_uses_the_baselines(remax_learner):
    result = remax_learner.train_step(_samples([0.25, 0.25]))
    # (1 - 0.25) on 2 tokens, (0 - 0.25) on 1: token mean 1.25 / 3.
    assert result.metrics["critic/advantages/mean"] == pytest.approx(1.25 / 3, abs=1e-6)
    assert result.metrics["critic/advantages/min"] == -0.25


def test_remax_batch_without_baselines_is_invalid_argument(remax_learner):
    with pytest.raises(grpc.RpcError) as err:
        remax_learner.train_step(_samples([0.25, None]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "advantage estimator 'remax' needs a greedy baseline" in err.value.details()
