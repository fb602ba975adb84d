"""The ``math_verify`` scorer: Hugging Face's math-verify checks a response's final answer
against the ground truth (LaTeX and plain expressions, fractions and decimals, sets,
intervals, matrices, equations), the answer checker math RL uses.

``score_math_verify`` parses both (the response's last ``\\boxed{}`` first, then any LaTeX or
plain expression; a ground truth without ``$`` is tried as LaTeX too), and scores 1 when the
answer is equivalent, ``format_score`` when an answer was found but is not, 0 when none was.

math-verify bounds its own parsing and comparison with ``SIGALRM``, which only a process's
main thread may set, and sympy can take unbounded time on a hostile answer
(``10^{10^{10}}``). So the service never runs it in its own threads: ``BoundedMathVerify``
keeps one child process per scoring worker (spawned, torch-free, on first use) whose main
thread calls it with its timeouts on, and gives each call a deadline; a child past it is
killed and replaced, and that item alone fails (``TimeoutError``, an item error).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
from typing import Any

PARSE_TIMEOUT_S = 5
"""math-verify's own bound on parsing one text, and on one comparison (in the child)."""


def score_math_verify(response: str, ground_truth: str, format_score: float = 0.0) -> float:
    """1.0 when ``response``'s answer is equivalent to ``ground_truth`` (math-verify), else
    ``format_score`` if it has an answer at all, else 0. Call it in a main thread (the
    child of ``BoundedMathVerify``): math-verify's timeouts use ``SIGALRM``."""
    from math_verify import parse, verify

    gold = parse(ground_truth, parsing_timeout=PARSE_TIMEOUT_S)
    if not gold and "$" not in ground_truth:
        gold = parse(f"${ground_truth}$", parsing_timeout=PARSE_TIMEOUT_S)
    if not gold:
        raise ValueError(f"math_verify: the ground truth {ground_truth[:80]!r} has no answer")
    answer = parse(response, parsing_timeout=PARSE_TIMEOUT_S)
    if not answer:
        return 0.0
    return 1.0 if verify(gold, answer, timeout_seconds=PARSE_TIMEOUT_S) else format_score


def _child(conn: Any) -> None:
    """A child's loop: math-verify imported first (then "ready"), then (response, ground
    truth, format score) in, ("ok", score) or ("error", message) out, until the parent
    closes its end."""
    import math_verify  # noqa: F401 (its import, seconds on a busy machine, is not a check's)

    conn.send(("ready", None))
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", score_math_verify(*args)))
        except Exception as exc:  # noqa: BLE001 (one item's failure goes back to it)
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


START_TIMEOUT_S = 120.0
"""How long a child may take to start and import math-verify (not counted in a check's
deadline)."""


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_child, args=(child,), daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(START_TIMEOUT_S) or self.conn.recv()[0] != "ready":
            self.kill()
            raise RuntimeError(f"math_verify's process did not start in {START_TIMEOUT_S:g}s")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class BoundedMathVerify:
    """``score_math_verify`` in child processes, each call with a deadline (module
    docstring); safe to call from several threads (a call waits for a free child)."""

    def __init__(self, workers: int, timeout_s: float, format_score: float = 0.0) -> None:
        self.timeout_s = timeout_s
        self.format_score = format_score
        self._ctx = mp.get_context("spawn")  # never fork a process that serves gRPC
        self._free: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(workers):
            self._free.put(None)  # started on first use
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self.num_killed = 0
        """Children killed at a deadline (each replaced on the next call)."""

    def __call__(
        self, response: str, ground_truth: str | None, extra_info: dict[str, Any]
    ) -> float:
        assert ground_truth is not None  # the batch scorer checks requires_ground_truth first
        worker = self._free.get()
        answer: tuple[str, Any] | None = None
        try:
            if worker is None:
                worker = self._start()
            worker.conn.send((response, ground_truth, self.format_score))
            if worker.conn.poll(self.timeout_s):
                answer = worker.conn.recv()
        except (EOFError, OSError) as exc:  # the child died under this item
            self._retire(worker)
            worker = None
            raise RuntimeError(f"math_verify's process died: {exc}") from exc
        finally:
            if answer is None and worker is not None:  # past the deadline: kill it
                self._retire(worker)
                worker = None
            self._free.put(worker)
        if answer is None:
            raise TimeoutError(
                f"math_verify took longer than {self.timeout_s:g}s on this item (its process "
                "was killed)"
            )
        kind, value = answer
        if kind == "error":
            raise ValueError(value)
        return float(value)

    def _start(self) -> _Worker:
        worker = _Worker(self._ctx)
        with self._lock:
            self._workers.append(worker)
        return worker

    def _retire(self, worker: _Worker | None) -> None:
        if worker is None:
            return
        worker.kill()
        with self._lock:
            self._workers.remove(worker)
            self.num_killed += 1

    def close(self) -> None:
        """Kills every child."""
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.kill()
