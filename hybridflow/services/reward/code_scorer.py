"""The ``code`` scorer: the program in a completion, run against its row's tests in the
sandbox pool (``hybridflow/sandbox/code_tests.py``).

The tests are the row's ground truth (``{"asserts": [...]}`` or ``{"inputs": [...],
"outputs": [...]}``); the score is the fraction of them the program passes
(``reward.code_score: all``: 1 only when it passes every one), and the verdict's outcome
(``passed``, ``wrong_answer``, ``syntax_error``, ``timeout``, ...) goes with the score, counted
per step as ``reward/outcome/<outcome>``.

The pool is made on the first code item, so a job without code never needs the sandbox; a
machine that cannot sandbox fails that Score call with ``FailedPrecondition`` naming why
(the coordinator stops the run; no item is scored as if it had been run). A program past a
limit costs its own wall time (``reward.sandbox.wall_s``), never a scoring thread. No grpc,
no torch.
"""

from __future__ import annotations

import threading
from typing import Any

from hybridflow.errors import FailedPrecondition
from hybridflow.sandbox.code_tests import CodeTests, extract_program, run_tests
from hybridflow.sandbox.config import SandboxConfig
from hybridflow.sandbox.factory import pool_from_config
from hybridflow.sandbox.pool import PoolStats, SandboxPool
from hybridflow.sandbox.types import SandboxUnavailable
from hybridflow.types import Verdict

DATA_SOURCE = "code"


class CodeScorer:
    """Scores one completion's program against its tests (module docstring); thread-safe."""

    def __init__(self, config: SandboxConfig, all_or_nothing: bool = False) -> None:
        self.config = config
        self.all_or_nothing = all_or_nothing
        self.threads = config.workers
        """Calls worth running at once (the scoring threads of a batch of code items)."""
        self._limits = config.limits()
        self._lock = threading.Lock()
        self._pool: SandboxPool | None = None

    def __call__(
        self, response: str, ground_truth: str | None, extra_info: dict[str, Any]
    ) -> Verdict:
        tests = CodeTests.parse(ground_truth)
        verdict = run_tests(self.pool(), extract_program(response), tests, self._limits)
        if self.all_or_nothing:
            score = float(verdict.passed == verdict.total)
        else:
            score = verdict.fraction
        return Verdict(score, verdict.outcome)

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
