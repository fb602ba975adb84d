"""Keeps one rollout replica busy: admit prompts, generate, score, hand groups to the buffer.

One thread per replica. A replica that fails (anything but INVALID_ARGUMENT) has its
in-flight prompts re-queued for the others and is taken out of the rotation; bad input or a
reward-service failure is fatal and reported to the trainer loop through ``error``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from hybridflow.coordinator.buffer import GroupBuffer
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.dataflow import Prompt, attach_scores, score_items
from hybridflow.coordinator.events import EventLog
from hybridflow.services.reward.client import RewardClient
from hybridflow.services.rollout.client import RolloutClient
from hybridflow.types import SamplingParams

log = logging.getLogger(__name__)


class ReplicaDispatcher(threading.Thread):
    def __init__(
        self,
        index: int,
        rollout: RolloutClient,
        reward: RewardClient,
        decode: Callable[[list[int]], str],
        buffer: GroupBuffer,
        cursor: PromptCursor[Any],
        params: SamplingParams,
        prompts_per_request: int,
        stop: threading.Event,
        events: EventLog | None = None,
    ) -> None:
        super().__init__(name=f"dispatch-{index}", daemon=True)
        self.index = index
        self.rollout = rollout
        self.reward = reward
        self.decode = decode
        self.buffer = buffer
        self.cursor = cursor
        self.params = params
        self.prompts_per_request = prompts_per_request
        self.stop_event = stop
        self.events = events or EventLog(None)
        self.busy_s = 0.0
        """Seconds spent generating."""
        self.num_requeued = 0
        self.failed = False
        self.error: BaseException | None = None
        self.started_at = time.perf_counter()

    def _admit(self) -> list[Prompt]:
        """Blocks until the capacity rule lets some prompts start (or stop is set)."""
        buf = self.buffer
        with buf.lock:
            while not self.stop_event.is_set():
                room = min(self.prompts_per_request, buf.admission.capacity())
                if room > 0:
                    prompts = buf.take_requeued(room)
                    prompts += self.cursor.take(room - len(prompts))
                    buf.admission.start(len(prompts))
                    return prompts
                buf.admit.wait(0.5)
        return []

    def run(self) -> None:
        request = 0
        while not self.stop_event.is_set():
            prompts = self._admit()
            if not prompts:
                return
            request += 1
            wall_start = time.time()
            start = time.perf_counter()
            try:
                groups = self.rollout.generate(
                    [p.prompt_ids for p in prompts], self.params, f"r{self.index}-{request}"
                )
            except grpc.RpcError as exc:
                self.buffer.requeue(prompts)
                self.num_requeued += len(prompts)
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # type: ignore[attr-defined]
                    self.error = exc
                else:
                    log.warning(
                        "replica %d failed (%s); its %d prompts are re-queued",
                        self.index,
                        exc,
                        len(prompts),
                    )
                    self.failed = True
                return
            self.busy_s += time.perf_counter() - start
            gen_end = time.time()
            self.events.record(
                "generate",
                wall_start,
                gen_end,
                replica=self.index,
                num_prompts=len(prompts),
                num_tokens=sum(len(c.token_ids) for g in groups for c in g),
                policy_version=groups[0][0].policy_version if groups else -1,
            )
            try:
                results = self.reward.score_batch(score_items(prompts, groups, self.decode))
                self.events.record(
                    "score", gen_end, time.time(), replica=self.index, num_items=len(results)
                )
                self.buffer.put(attach_scores(prompts, groups, results))
            except Exception as exc:  # noqa: BLE001 — reported to the trainer loop
                self.buffer.requeue(prompts)
                self.error = exc
                return

    def idle_ratio(self) -> float:
        wall = time.perf_counter() - self.started_at
        return max(0.0, 1.0 - self.busy_s / wall) if wall > 0 else 0.0
