"""vLLM's queue readers sleep soon after a message (``vllm_idle.shorten_idle_spin``), on
vLLM's own ``MessageQueue`` as its engine and workers build it: a reader made after the call
spins ``IDLE_SPIN_S``, not vLLM's second; a message sent while it sleeps still arrives (the
writer's notification wakes it); and the wait costs the reader's thread next to no CPU,
where vLLM's default spends it spinning (a busier machine only lowers that figure)."""

from __future__ import annotations

import threading
import time

import pytest

from hybridflow.services.rollout.vllm_idle import IDLE_SPIN_S, shorten_idle_spin

DEADLINE_S = 30.0


@pytest.fixture
def short_spin():
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    saved = SpinCondition.__init__.__defaults__
    assert shorten_idle_spin() is True
    yield
    SpinCondition.__init__.__defaults__ = saved  # other tests keep vLLM's own default


def test_reader_sleeps_after_a_message_and_still_gets_the_next(short_spin):
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    writer = MessageQueue(n_reader=1, n_local_reader=1)
    reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
    ready = threading.Thread(target=writer.wait_until_ready, daemon=True)
    ready.start()
    reader.wait_until_ready()
    ready.join(DEADLINE_S)
    try:
        assert reader._spin_condition.busy_loop_s == IDLE_SPIN_S
        writer.enqueue("first")
        assert reader.dequeue(timeout=DEADLINE_S) == "first"

        sending = threading.Event()

        def send_later() -> None:
            time.sleep(20 * IDLE_SPIN_S)  # well past the spin: the reader is asleep by then
            sending.set()  # before the enqueue: the reader may get it before this thread runs on
            writer.enqueue("second")

        threading.Thread(target=send_later, daemon=True).start()
        cpu = time.thread_time()
        assert reader.dequeue(timeout=DEADLINE_S) == "second"
        assert sending.is_set()  # it came from the send after the pause
        # spinning through the 0.4 s wait would cost the reader's thread up to 0.4 CPU-s
        assert time.thread_time() - cpu < 0.1
    finally:
        reader.shutdown()
        writer.shutdown()


def test_no_vllm_setting_leaves_vllm_alone(monkeypatch):
    from vllm.distributed.device_communicators import shm_broadcast

    class Other:  # a vLLM whose reader takes no busy-loop time
        def __init__(self, is_reader: bool, context: object, notify_address: str) -> None:
            pass

    monkeypatch.setattr(shm_broadcast, "SpinCondition", Other)
    assert shorten_idle_spin() is False
