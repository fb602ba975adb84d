"""The ``code`` scorer on the real sandbox: the program in a completion run against its row's
tests (asserts, stdin/stdout cases); the score is the fraction passed (or all-or-nothing), the
outcome named and carried through the reward service's wire format; identical programs run
once; a machine that cannot sandbox fails the call instead of scoring 0."""

from __future__ import annotations

import shutil

import pytest

from hybridflow.errors import FailedPrecondition
from hybridflow.sandbox.code_tests import CodeTests
from hybridflow.sandbox.config import SandboxConfig
from hybridflow.sandbox.types import SandboxUnavailable
from hybridflow.services.reward import convert
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.types import ScoreItem

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
)
ASSERTS = CodeTests(asserts=("assert f(1)==4", "assert f(2)==7", "assert f(0)==1")).to_json()
CASES = CodeTests(cases=(("1 2\n", "3\n"), ("5 5\n", "10\n"))).to_json()
SANDBOX = SandboxConfig(workers=2, wall_s=60, cpu_s=1, memory_mb=256)
"""Wall time far past the CPU limit: a loop is stopped by its CPU seconds however busy the
machine (a sleeper, which uses none, gets its own short wall time)."""


@pytest.fixture
def scorer():
    s = RewardScorer(RewardConfig(sandbox=SANDBOX))
    yield s
    s.close()


def item(response: str, tests: str = ASSERTS) -> ScoreItem:
    return ScoreItem(data_source="code", response=response, ground_truth=tests)


def test_each_way_a_program_ends_is_scored_and_named(scorer):
    cases = {
        "def f(x):return 3*x+1": (1.0, "passed"),
        "```python\ndef f(x):\n    return 3*x+1\n```\nDone.": (1.0, "passed"),
        "def f(x):return 4 if x==1 else 0": (1 / 3, "wrong_answer"),
        "def f(x) return 3*x+1": (0.0, "syntax_error"),
        "def f(x):return y": (0.0, "runtime_error"),
        "while True: pass": (0.0, "cpu"),
        "x = bytearray(2**30)": (0.0, "memory"),
        "print('x' * 10**7)": (0.0, "output"),
        "   ": (0.0, "no_code"),
        "print('pass 0')\nprint('pass 1')": (0.0, "runtime_error"),  # forged lines: no nonce
    }
    results = scorer.score_batch([item(r) for r in cases])
    got = {r: (round(res.score, 6), res.outcome) for r, res in zip(cases, results, strict=True)}
    assert got == {r: (round(score, 6), outcome) for r, (score, outcome) in cases.items()}
    assert all(res.error is None for res in results)


def test_a_sleeper_is_stopped_at_its_wall_time():
    scorer = RewardScorer(RewardConfig(sandbox=SandboxConfig(workers=1, wall_s=1)))
    try:
        (result,) = scorer.score_batch([item("import time\ntime.sleep(600)")])
        assert (result.score, result.outcome) == (0.0, "timeout")
    finally:
        scorer.close()


def test_stdin_stdout_cases(scorer):
    right = "a, b = map(int, input().split())\nprint(a + b)"
    results = scorer.score_batch([item(right, CASES), item("print(3)", CASES)])
    assert [(r.score, r.outcome) for r in results] == [(1.0, "passed"), (0.5, "wrong_answer")]


def test_all_or_nothing():
    scorer = RewardScorer(RewardConfig(sandbox=SANDBOX, code_score="all"))
    try:
        (result,) = scorer.score_batch([item("def f(x):return 4 if x==1 else 0")])
        assert (result.score, result.outcome) == (0.0, "wrong_answer")
    finally:
        scorer.close()


def test_identical_programs_run_once_but_a_timeout_is_never_kept(scorer):
    code = scorer.registry.code
    scorer.score_batch([item("def f(x):return 3*x+1")] * 4 + [item("def f(x):return x")])
    assert code.num_runs + code.num_cached == 5 and code.num_runs <= 2  # 2 programs
    scorer.score_batch([item("def f(x):return 3*x+1")])
    assert code.num_runs == 2 and code.num_cached == 4
    looper = item("while True: pass")  # stopped at a limit
    scorer.score_batch([looper])
    scorer.score_batch([looper])
    assert code.num_runs == 4  # run again: the machine's load, not the program, may have cut it


def test_a_bad_test_spec_fails_that_item_alone(scorer):
    results = scorer.score_batch([item("def f(x):return 3*x+1", "not json"), item("x", "{}")])
    assert all(r.score == 0.0 and "code tests" in (r.error or "") for r in results)
    assert scorer.error_counts["scorer_exception"] == 2


def test_the_outcome_crosses_the_wire(scorer):
    results = scorer.score_batch([item("def f(x):return 3*x+1"), item("def f(x) return")])
    back = convert.results_from_proto(convert.results_to_proto(results))
    assert [(r.score, r.outcome) for r in back] == [(1.0, "passed"), (0.0, "syntax_error")]


def test_no_sandbox_fails_the_call_naming_why(monkeypatch):
    def unavailable(self, *args, **kwargs):
        raise SandboxUnavailable("'bwrap' is not installed")

    monkeypatch.setattr("hybridflow.sandbox.bubblewrap.BubblewrapSandbox.__init__", unavailable)
    scorer = RewardScorer(RewardConfig(sandbox=SANDBOX))
    try:
        with pytest.raises(FailedPrecondition, match="reward.sandbox.*bwrap"):
            scorer.score_batch([item("def f(x):return 3*x+1")])
        (arith,) = scorer.score_batch(
            [ScoreItem(data_source="arith", response="3", ground_truth="3")]
        )
        assert arith.score == 1.0  # other scorers are not touched
    finally:
        scorer.close()
