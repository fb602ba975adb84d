"""Agents' requests to one replica sent together (``hybridflow.agents.batching``), with a
gated fake replica: requests that arrive while a call is out go in the next one, each
answer reaches its own caller, requests of other sampling are sent apart, and a failed call
fails each of its requests."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hybridflow.agents.batching import CoalescingGenerate
from hybridflow.types import Completion, SamplingParams

WAIT_S = 60.0


class GatedReplica:
    """Answers each prompt [x] with [x, 100 + x]; its first call waits for ``gate``."""

    def __init__(self, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.inside = threading.Event()
        self.batches: list[list[int]] = []
        self.fail = fail

    def generate(self, prompts, params, request_id=""):
        self.batches.append([int(p[0]) for p in prompts])
        if len(self.batches) == 1:
            self.inside.set()
            assert self.gate.wait(WAIT_S)
        if self.fail:
            raise ConnectionError("replica gone")
        return [
            [
                Completion(
                    np.asarray([int(p[0]), 100 + int(p[0])]), np.zeros(2, np.float32), "stop", 0
                )
            ]
            for p in prompts
        ]


def call_in_thread(batched, x: int, params: SamplingParams, out: dict) -> threading.Thread:
    def work():
        try:
            out[x] = batched(np.asarray([x]), params).token_ids.tolist()
        except Exception as exc:  # noqa: BLE001 — recorded for the test
            out[x] = exc

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def wait_pending(batched, n: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(batched._pending) < n:  # noqa: SLF001 — the test's view of the queue
        assert time.monotonic() < deadline
        time.sleep(0.001)


@pytest.mark.parametrize("fail", [False, True])
def test_requests_that_meet_are_sent_together_and_answered_each(fail):
    replica = GatedReplica(fail)
    batched = CoalescingGenerate(replica, window_s=0.0, name="r0")
    params, other = SamplingParams(max_new_tokens=8), SamplingParams(max_new_tokens=4)
    out: dict = {}
    threads = [call_in_thread(batched, 0, params, out)]
    assert replica.inside.wait(WAIT_S)  # the first call is out
    threads += [call_in_thread(batched, x, params, out) for x in range(1, 7)]
    wait_pending(batched, 6)
    threads.append(call_in_thread(batched, 7, other, out))  # another budget: sent apart
    wait_pending(batched, 7)
    replica.gate.set()
    for t in threads:
        t.join(WAIT_S)
    assert replica.batches[0] == [0]
    assert sorted(replica.batches[1]) == [1, 2, 3, 4, 5, 6] and replica.batches[2] == [7]
    if fail:
        assert all(isinstance(v, ConnectionError) for v in out.values())
    else:
        assert out == {x: [x, 100 + x] for x in range(8)}
        assert (batched.num_calls, batched.num_requests) == (3, 8)
