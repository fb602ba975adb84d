"""Agents' requests to one replica, sent together: each agent asks for one completion at a
time, and many agents ask at once; one ``Generate`` of many prompts costs an engine about
what one prompt does (the HF engine batches a call's prompts; vLLM batches calls anyway).

``CoalescingGenerate`` is the ``generate`` of every episode on one replica. Its sender thread
waits for a request, then ``window_s`` more for others, then sends every pending request
whose sampling matches the oldest's (the same temperature, top-p, top-k, token budget and
stop tokens) as one call; requests that do not match wait for the next one, and requests
that arrive during a call go in the next. A call's seed is its first
request's: the batch's other prompts are sampled from the same generator, each its own
draw. A failed call fails each of its requests (the episode's endpoint answers 503).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from hybridflow.arrays import TokenArray
from hybridflow.clients import RolloutClient
from hybridflow.types import Completion, SamplingParams


@dataclass
class _Request:
    context: TokenArray
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: Completion | None = None
    error: BaseException | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        p = self.params
        return (p.temperature, p.top_p, p.top_k, p.max_new_tokens, p.stop_token_ids)


class CoalescingGenerate:
    """``(context, params) -> Completion`` on ``rollout``, concurrent calls batched (module
    docstring); thread-safe."""

    def __init__(
        self, rollout: RolloutClient, window_s: float = 0.01, max_batch: int = 256, name: str = ""
    ) -> None:
        self.rollout = rollout
        self.window_s = window_s
        self.max_batch = max_batch
        self.name = name
        self._ready = threading.Condition()
        self._pending: list[_Request] = []
        self._sender: threading.Thread | None = None
        self.num_calls = 0
        """Generate calls sent."""
        self.num_requests = 0
        """Requests served by them."""

    def __call__(self, context: TokenArray, params: SamplingParams) -> Completion:
        request = _Request(context, replace(params, n=1))
        with self._ready:
            if self._sender is None:
                self._sender = threading.Thread(
                    target=self._send_forever, name=f"batch-{self.name}", daemon=True
                )
                self._sender.start()
            self._pending.append(request)
            self._ready.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _send_forever(self) -> None:
        while True:
            with self._ready:
                while not self._pending:
                    self._ready.wait()
            time.sleep(self.window_s)  # the coalescing window: others' requests arrive meanwhile
            with self._ready:
                key = self._pending[0].key
                batch = [r for r in self._pending if r.key == key][: self.max_batch]
                chosen = {id(r) for r in batch}
                self._pending = [r for r in self._pending if id(r) not in chosen]
            self._send(batch)

    def _send(self, batch: list[_Request]) -> None:
        try:
            answers = self.rollout.generate(
                [r.context for r in batch], batch[0].params, f"{self.name}-b{self.num_calls}"
            )
            if len(answers) != len(batch) or any(len(a) != 1 for a in answers):
                raise RuntimeError(f"the replica answered {len(answers)} groups for {len(batch)}")
        except BaseException as exc:  # noqa: BLE001 — each request of the call fails with it
            for r in batch:
                r.error = exc
                r.done.set()
            return
        self.num_calls += 1
        self.num_requests += len(batch)
        for r, (completion,) in zip(batch, answers, strict=True):
            r.result = completion
            r.done.set()
