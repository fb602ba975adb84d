"""A program run against its tests in the sandbox, and what came of it (``CodeVerdict``).

Tests come in the two forms code datasets use (``CodeTests.parse``, from a row's ground
truth as JSON):

- ``{"asserts": ["assert f(2) == 5", ...]}``: the program runs once, then each statement in
  its namespace (HumanEval / MBPP style);
- ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``: the program runs once per case
  with the input on stdin; its stdout must equal the output, line by line with trailing
  spaces ignored (APPS / CodeContests style, as verl's and prime's checkers compare).

One run in the sandbox holds the program and all its tests: a harness (the system's python3)
reads a per-run nonce from stdin first, and every result it reports is a line starting with
that nonce, so what the program prints cannot pass for a result. (Assert tests run in the
program's process, as in HumanEval's checker: a program that went looking for the harness's
memory could forge its results; the stdin/stdout cases run the program in a child process,
judged by the harness outside it.) A test the run did not report (the run was killed at a
limit, or the program exited early) failed.

``CodeVerdict.outcome`` names why a run scored what it did: ``passed``, ``wrong_answer``,
``runtime_error``, ``syntax_error``, ``no_code``, or a limit: ``timeout``, ``cpu``,
``memory``, ``output``. This module knows nothing of rewards, services or episodes.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Protocol

from hybridflow.sandbox.types import SandboxLimits, SandboxResult

OUTCOMES = (
    "passed",
    "wrong_answer",
    "runtime_error",
    "syntax_error",
    "no_code",
    "timeout",
    "cpu",
    "memory",
    "output",
)
"""Every ``CodeVerdict.outcome``."""
LIMIT_OUTCOMES = ("timeout", "cpu", "memory", "output")
"""Outcomes where the run was stopped at a limit."""
MAX_TESTS = 256
"""Most tests one program is run against."""
MAX_PROGRAM_CHARS = 64 * 1024
"""Longest program run (longer ones fail as ``no_code``, unrun)."""

_LIMIT_NAMES = {"MemoryError": "memory", "SIGXCPU": "cpu", "SIGKILL": "cpu", "SIGXFSZ": "output"}
"""What a test's error name says of a limit its process hit (stdin/stdout cases run the
program as a child of the harness: its limits end the child, not the run; the CPU limit's
soft and hard values are one, so it ends with SIGKILL)."""
_FENCE = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)


class Runner(Protocol):
    """Runs one sandboxed program: a ``Sandbox`` or a ``SandboxPool``."""

    def run(
        self, argv: list[str], files: dict[str, str | bytes], limits: SandboxLimits, stdin: bytes
    ) -> SandboxResult: ...


class SandboxFailed(RuntimeError):
    """The sandbox itself could not run the program (not the program's fault)."""


@dataclass(frozen=True)
class CodeTests:
    """A program's tests: assert statements, or (stdin, expected stdout) cases."""

    asserts: tuple[str, ...] = ()
    cases: tuple[tuple[str, str], ...] = ()

    @property
    def num_tests(self) -> int:
        return len(self.asserts) or len(self.cases)

    @classmethod
    def parse(cls, text: str | None) -> CodeTests:
        """The tests a ground truth holds (module docstring); ValueError naming the problem."""
        try:
            value = json.loads(text or "")
        except json.JSONDecodeError as exc:
            raise ValueError(f"code tests: the ground truth is not JSON ({exc.msg})") from exc
        if not isinstance(value, dict):
            raise ValueError("code tests: expected a JSON object with asserts or inputs/outputs")
        asserts, inputs, outputs = value.get("asserts"), value.get("inputs"), value.get("outputs")
        if (asserts is None) == (inputs is None):
            raise ValueError("code tests: give either asserts or inputs with outputs")
        if asserts is not None:
            tests = cls(asserts=tuple(_strings(asserts, "asserts")))
        else:
            ins, outs = _strings(inputs, "inputs"), _strings(outputs, "outputs")
            if len(ins) != len(outs):
                raise ValueError(f"code tests: {len(ins)} inputs but {len(outs)} outputs")
            tests = cls(cases=tuple(zip(ins, outs)))
        if not 1 <= tests.num_tests <= MAX_TESTS:
            raise ValueError(f"code tests: {tests.num_tests} tests, expected 1..{MAX_TESTS}")
        return tests

    def to_json(self) -> str:
        """The ground-truth form ``parse`` reads."""
        if self.asserts:
            return json.dumps({"asserts": list(self.asserts)})
        return json.dumps(
            {"inputs": [i for i, _ in self.cases], "outputs": [o for _, o in self.cases]}
        )


@dataclass(frozen=True)
class CodeVerdict:
    """How a program did on its tests."""

    passed: int
    total: int
    outcome: str
    """One of ``OUTCOMES``."""
    detail: str = ""
    """One line: the first failing test and why, or the limit hit."""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def extract_program(response: str) -> str | None:
    """The program in a completion: its last fenced code block (```python ... ```), else the
    whole text; None when there is none."""
    blocks = _FENCE.findall(response)
    program = blocks[-1] if blocks else response
    return program if program.strip() else None


def run_tests(
    runner: Runner, program: str | None, tests: CodeTests, limits: SandboxLimits
) -> CodeVerdict:
    """Runs ``program`` against ``tests`` in one sandboxed run; ``SandboxFailed`` if the
    sandbox could not run it."""
    total = tests.num_tests
    if program is None or len(program) > MAX_PROGRAM_CHARS:
        why = "no program in the response" if program is None else "program too long"
        return CodeVerdict(0, total, "no_code", why)
    nonce = secrets.token_hex(16)
    # The tests as Python literals (repr of str is exact): the harness reads them without
    # importing json, a third of a run's start-up.
    if tests.asserts:
        literal = f"ASSERTS = {list(tests.asserts)!r}\n"
    else:
        literal = f"CASES = {[list(case) for case in tests.cases]!r}\n"
    files: dict[str, str | bytes] = {
        "program.py": program,
        "harness.py": HARNESS,
        "tests.py": literal,
    }
    result = runner.run(["python3", "-I", "harness.py"], files, limits, (nonce + "\n").encode())
    if result.outcome == "error":
        raise SandboxFailed(f"the sandbox could not run the program: {result.reason}")
    return _verdict(result, nonce, total)


def _verdict(result: SandboxResult, nonce: str, total: int) -> CodeVerdict:
    marks = [
        line[len(nonce) + 1 :].split(" ")
        for line in result.stdout.decode(errors="replace").splitlines()
        if line.startswith(nonce + " ")
    ]
    passed = sum(1 for m in marks if m[0] == "pass")
    failures = [m for m in marks if m[0] in ("fail", "error", "syntax", "load")]
    if result.outcome in LIMIT_OUTCOMES:
        return CodeVerdict(passed, total, result.outcome, result.reason)
    if failures:
        kind, *rest = failures[0]
        name = rest[-1] if rest else ""
        where = f"test {rest[0]}" if kind in ("fail", "error") and len(rest) > 1 else "loading"
        if name in _LIMIT_NAMES:
            return CodeVerdict(passed, total, _LIMIT_NAMES[name], f"{where}: {name}")
        if kind == "syntax":
            return CodeVerdict(0, total, "syntax_error", f"does not compile: {name}")
        outcome = "wrong_answer" if kind == "fail" else "runtime_error"
        return CodeVerdict(passed, total, outcome, f"{where}: {name}")
    if "loaded" not in (m[0] for m in marks):
        code = result.exit_code
        return CodeVerdict(0, total, "runtime_error", f"the run ended before loading (exit {code})")
    if passed < total:
        return CodeVerdict(passed, total, "runtime_error", f"{total - passed} tests never reported")
    return CodeVerdict(passed, total, "passed")


def _strings(value: object, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"code tests: {key} must be a list of strings")
    return list(value)


HARNESS = r"""
import os, sys

def main():
    nonce = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)
    out = sys.stdout

    def report(*fields):
        out.write(" ".join((nonce,) + fields) + "\n")
        out.flush()

    source = open("program.py").read()
    try:
        code = compile(source, "program.py", "exec")
    except (SyntaxError, ValueError) as exc:
        report("syntax", type(exc).__name__)
        return
    tests = {}
    exec(open("tests.py").read(), tests)
    if "ASSERTS" in tests:
        asserts(code, tests["ASSERTS"], report)
    else:
        cases(tests["CASES"], report)

def asserts(code, tests, report):
    scope = {"__name__": "__main__"}
    try:
        exec(code, scope)
    except BaseException as exc:
        report("load", type(exc).__name__)
        return
    report("loaded")
    for i, test in enumerate(tests):
        try:
            exec(compile(test, "test_%d" % i, "exec"), scope)
        except AssertionError:
            report("fail", str(i), "AssertionError")
        except BaseException as exc:
            report("error", str(i), type(exc).__name__)
        else:
            report("pass", str(i))

def cases(tests, report):
    import signal, subprocess

    report("loaded")
    for i, (given, expected) in enumerate(tests):
        with open("/tmp/out", "w+b") as got:
            proc = subprocess.run([sys.executable, "-I", "program.py"], input=given.encode(),
                                  stdout=got, stderr=subprocess.PIPE)
            got.seek(0)
            text = got.read().decode(errors="replace")
        if proc.returncode < 0:
            report("error", str(i), signal.Signals(-proc.returncode).name)
        elif proc.returncode != 0:
            lines = proc.stderr.decode(errors="replace").strip().splitlines()
            name = lines[-1].split(":")[0] if lines else "exit%d" % proc.returncode
            if lines and "[Errno 27]" in lines[-1]:  # File too large: the file size limit
                name = "SIGXFSZ"
            report("error", str(i), name.replace(" ", "_") or "error")
        elif _lines(text) == _lines(expected):
            report("pass", str(i))
        else:
            report("fail", str(i), "WrongOutput")

def _lines(text):
    lines = [line.rstrip() for line in text.strip().splitlines()]
    return lines

main()
"""
"""The harness run in the sandbox (the system's python3, the standard library only)."""
