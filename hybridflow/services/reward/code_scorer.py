"""The ``code`` scorer: the program in a completion, run against its row's tests in the
sandbox pool (``hybridflow/sandbox/code_tests.py``).

The tests are the row's ground truth (``{"asserts": [...]}`` or ``{"inputs": [...],
"outputs": [...]}``); the score is the fraction of them the program passes
(``reward.code_score: all``: 1 only when it passes every one), and the verdict's outcome
(``passed``, ``wrong_answer``, ``syntax_error``, ``timeout``, ...) goes with the score, counted
per step as ``reward/outcome/<outcome>``.

Identical programs against identical tests are run once: items of a batch that are the same
program share one run, and a verdict is kept (an LRU of
``reward.code_cache_size`` entries, keyed by a hash of the program and the tests) unless it
came from a limit (``timeout`` and the others depend on the machine's load, not only on the
program), so a group whose samples converged to one program costs one run. A program whose
result is random (it draws numbers) is judged on its first run.

The pool is made on the first code item, so a job without code never needs the sandbox; a
machine that cannot sandbox fails that Score call with ``FailedPrecondition`` naming why
(the coordinator stops the run; no item is scored as if it had been run). A program past a
limit costs its own wall time (``reward.sandbox.wall_s``), never a scoring thread. No grpc,
no torch.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from hybridflow.errors import FailedPrecondition
from hybridflow.sandbox.code_tests import (
    LIMIT_OUTCOMES,
    CodeTests,
    CodeVerdict,
    extract_program,
    run_tests,
)
from hybridflow.sandbox.config import SandboxConfig
from hybridflow.sandbox.factory import pool_from_config
from hybridflow.sandbox.pool import PoolStats, SandboxPool
from hybridflow.sandbox.types import SandboxUnavailable
from hybridflow.types import Verdict

DATA_SOURCE = "code"


class CodeScorer:
    """Scores one completion's program against its tests (module docstring); thread-safe."""

    def __init__(
        self, config: SandboxConfig, all_or_nothing: bool = False, cache_size: int = 4096
    ) -> None:
        self.config = config
        self.all_or_nothing = all_or_nothing
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, CodeVerdict] = OrderedDict()
        self._running: dict[bytes, Future[CodeVerdict]] = {}
        self.num_runs = 0
        """Programs run in the sandbox."""
        self.num_cached = 0
        """Items judged by a kept verdict instead of a run."""
        self.threads = config.workers
        """Calls worth running at once (the scoring threads of a batch of code items)."""
        self._limits = config.limits()
        self._lock = threading.Lock()
        self._pool: SandboxPool | None = None

    def __call__(
        self, response: str, ground_truth: str | None, extra_info: dict[str, Any]
    ) -> Verdict:
        tests = CodeTests.parse(ground_truth)
        program = extract_program(response)
        key = hashlib.sha256(f"{program!r}\0{ground_truth}".encode()).digest()
        verdict = self._judged(key, lambda: run_tests(self.pool(), program, tests, self._limits))
        if self.all_or_nothing:
            score = float(verdict.passed == verdict.total)
        else:
            score = verdict.fraction
        return Verdict(score, verdict.outcome)

    def _judged(self, key: bytes, run: Callable[[], CodeVerdict]) -> CodeVerdict:
        """The kept verdict of ``key``, or the one of its run already under way (a batch's
        identical items share one run), or ``run()``'s."""
        mine: Future[CodeVerdict] | None = None
        with self._lock:
            verdict = self._cache.get(key)
            if verdict is not None:
                self._cache.move_to_end(key)
                self.num_cached += 1
                return verdict
            running = self._running.get(key)
            if running is not None:
                self.num_cached += 1
            elif self.cache_size:
                mine = self._running[key] = Future()
        if running is not None:
            return running.result()
        try:
            verdict = run()
        except BaseException as exc:
            if mine is not None:
                mine.set_exception(exc)
            raise
        finally:
            with self._lock:
                self.num_runs += 1
                self._running.pop(key, None)
        if mine is not None:
            mine.set_result(verdict)
        self._keep(key, verdict)
        return verdict

    def _keep(self, key: bytes, verdict: CodeVerdict) -> None:
        if not self.cache_size or verdict.outcome in LIMIT_OUTCOMES:
            return
        with self._lock:
            self._cache[key] = verdict
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def pool(self) -> SandboxPool:
        """The pool, made on first use; ``FailedPrecondition`` where nothing can be
        sandboxed."""
        with self._lock:
            if self._pool is None:
                try:
                    self._pool = pool_from_config(self.config)
                except SandboxUnavailable as exc:
                    raise FailedPrecondition(
                        f"the code scorer needs its sandbox (reward.sandbox): {exc}"
                    ) from exc
            return self._pool

    def stats(self) -> PoolStats | None:
        """The pool's figures, None before the first code item."""
        with self._lock:
            return self._pool.stats() if self._pool is not None else None

    def close(self) -> None:
        """Stops the pool (the programs running end by their deadlines); idempotent."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
