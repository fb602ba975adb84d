"""A weight sync that did not take effect (``DeliveryFailed``: the delivery probe found a
replica serving other weights) stops the run at once, naming the replica: no retry, and no
train step after it, in a sync and in an async (background publish) run."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hybridflow.errors import DeliveryFailed
from hybridflow.types import WeightUpdateReport

from .fakes import FakeLearner
from .test_background_publish import BackgroundLearner, make_job

MESSAGE = "weights v2 did not take effect on replica r0: log-probs differ by 0.3"


class UndeliveredLearner(BackgroundLearner):
    """Publishes of version 2 fail verification; counts every publish attempt."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.attempts: list[int] = []

    def publish_weights(self, targets: Sequence[str], catch_up: bool = False) -> WeightUpdateReport:
        self.attempts.append(self.version)
        if self.version == 2:
            raise DeliveryFailed(MESSAGE)
        return FakeLearner.publish_weights(self, targets)

    def finish_publish(self) -> WeightUpdateReport:
        version = self.pending
        if version == 2:
            self.attempts.append(version)
            with self.lock:
                self.pending = None
            raise DeliveryFailed(MESSAGE)
        return super().finish_publish()


@pytest.mark.parametrize("max_staleness", [0, 2])
def test_an_undelivered_sync_stops_the_run_naming_the_replica(tmp_path, max_staleness) -> None:
    job, undelivered = make_job(
        tmp_path, hold=False, learner_class=UndeliveredLearner, max_staleness=max_staleness
    )
    assert isinstance(undelivered, UndeliveredLearner)
    with pytest.raises((DeliveryFailed, RuntimeError)) as err:
        job.run()
    assert "did not take effect on replica r0" in str(err.value)
    assert undelivered.attempts.count(2) == 1  # never retried
    # Nothing trained on after it, beyond the one step an async run had already begun.
    assert undelivered.version <= (2 if max_staleness == 0 else 3)
