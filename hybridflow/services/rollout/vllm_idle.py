"""vLLM's message-queue readers spin for a second after every message: shortened here.

vLLM's engine core talks to its worker processes over a shared-memory ring
(``shm_broadcast.MessageQueue``). A reader that got a message less than ``busy_loop_s``
ago (vLLM's default: 1 s) waits for the next one by spinning on ``sched_yield``; only after
that does it sleep on the writer's notification socket. On a GPU machine that second costs a
spare host core. Here the cores are shared: in a sync job the learner trains right after the
rollout generated, and for that whole second the vLLM worker holds one of the two cores. The
learner's two OpenMP threads then wait on each other at every barrier: the quickstart's
train step went from 0.08 s to 1.02 s beside a vLLM replica (``benchmarks/LOG.md``).

``shorten_idle_spin`` sets the default that readers are built with: they keep spinning
through a generation (the next decode step's message follows within milliseconds) and sleep
``IDLE_SPIN_S`` after it ends. A sleeping reader is woken by the notification every write
sends, so nothing is missed; the cost is one socket wake-up per message that comes after a
pause. Call it in a process before vLLM builds its queues (``vllm_worker`` does on import,
in each worker process; ``vllm_runtime`` before it starts the engine)."""

from __future__ import annotations

import inspect
import logging

IDLE_SPIN_S = 0.02
"""Seconds a vLLM queue reader spins after its last message before it sleeps."""

log = logging.getLogger(__name__)


def shorten_idle_spin(seconds: float = IDLE_SPIN_S) -> bool:
    """Readers vLLM builds from now on in this process spin ``seconds`` after a message, not
    vLLM's 1 s. False (and a warning) where this vLLM has no such setting: its readers then
    keep vLLM's own behaviour."""
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:
        return False
    init = getattr(getattr(shm_broadcast, "SpinCondition", None), "__init__", None)
    if init is None or init.__defaults__ is None:
        log.warning("this vLLM has no SpinCondition(busy_loop_s): its idle spin is kept")
        return False
    with_defaults = [
        p.name
        for p in inspect.signature(init).parameters.values()
        if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.KEYWORD_ONLY
    ]
    if "busy_loop_s" not in with_defaults or len(with_defaults) != len(init.__defaults__):
        log.warning("this vLLM's SpinCondition takes no busy_loop_s default: its idle spin is kept")
        return False
    defaults = list(init.__defaults__)
    defaults[with_defaults.index("busy_loop_s")] = float(seconds)
    init.__defaults__ = tuple(defaults)
    return True
